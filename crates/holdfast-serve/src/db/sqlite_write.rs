//! Every SQLite write of a pool: queued in process on one connection, committed in groups.
//!
//! SQLite has one writer per file. Left to SQLite, concurrent `BEGIN IMMEDIATE`s wait in its
//! busy handler, which polls by sleeping 1, 2, 5, ... 100 ms: under load the lock is often free
//! while every waiter sleeps. Here each pool has one writer connection behind a fair (FIFO)
//! lock, so a write starts the moment the previous one is done, in arrival order. Reads stay on
//! the pool (WAL: they never wait for the writer).
//!
//! **Group commit.** A write transaction that finishes while others are queued does not commit:
//! it hands the still-open transaction to the next in the queue, which runs inside it under a
//! `SAVEPOINT` of its own, and so on; the last one in (nobody queued, or [`GROUP_MAX`] members,
//! after a few scheduler passes in which no write queued: `gather`) commits for all, and every
//! member's `commit()` answers with that one COMMIT's outcome (a finished member's savepoint is
//! left open for that COMMIT to end). One fsync, one BEGIN and one COMMIT serve the whole queue
//! instead of one each. What each member sees is all-or-nothing: a member that fails or rolls
//! back undoes its own savepoint only (its error stays its own); a failed group COMMIT fails
//! every member (nothing of any of them was written: a caller retries as after any storage
//! failure). A member reads the earlier members' uncommitted rows, which commit with it or not
//! at all. A one-statement write is a member like any other: the fsync it shares outweighs the
//! one hop (its savepoint) it adds. A write dropped unfinished (its task cancelled) is undone
//! at once by a task of the writer's, so SQLite's write lock is not kept from other connections
//! until the next write. Its opening (`BEGIN IMMEDIATE` or the savepoint) runs to its end in a
//! task of its own, so a caller leaving cannot cut it off with the writer unsure whether it ran.
//!
//! **A deferred opening.** A write begun with [`super::begin_sqlite_write_deferred`] sends
//! nothing when it gets the writer: its `BEGIN IMMEDIATE` or savepoint goes as the head of its
//! first query ([`SqliteWriteAhead::first`] and `opened`, the query spelled both ways by
//! [`sqlite_first_query!`](crate::sqlite_first_query)), one hand-off to the connection's
//! thread instead of two, each made with the lock held. Until that query returns, the writer
//! does not know whether the opening ran: a part abandoned then (its task cancelled) is
//! undone by rolling the whole group back and failing every member, never by a `ROLLBACK TO`
//! that could reach an earlier member's savepoint.
//!
//! The lock is a `tokio::sync::Mutex` rather than a one-connection pool: a pool's release
//! spawns a task and pings the connection before the next waiter may have it, two scheduling
//! delays between every two writes on a loaded 2-core machine.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Executor};
use tokio::sync::{OwnedMappedMutexGuard, OwnedMutexGuard};

mod deferred;
mod group;
mod guards;
pub use deferred::{FirstQuery, SqliteWriteAhead};
use group::{Group, Unpublished, await_group, group_failed};
use guards::{Abandon, Queued};

/// The most members one group commit serves: a bound on how long the first member waits.
const GROUP_MAX: usize = 64;

/// The savepoint a member that joins an open transaction runs under (`holdfast_member`). A
/// member that finishes leaves its savepoint open (the group's COMMIT ends them all; a RELEASE
/// would be one more statement on the writer per write), so members' savepoints nest, each
/// inside the one of the member before it; undoing a member's part (`UNDO_MEMBER`) rolls back
/// to the innermost savepoint of that name, its own, and releases it.
const SAVEPOINT_MEMBER: &str = "SAVEPOINT holdfast_member";
const UNDO_MEMBER: &str = "ROLLBACK TO holdfast_member; RELEASE holdfast_member";

/// One pool's writer: its connection behind a FIFO lock, and the group transaction open on it.
pub(super) struct Writer {
    conn: Arc<tokio::sync::Mutex<Option<SqliteConnection>>>,
    /// Only touched while `conn` is locked (a std mutex for interior mutability, never waited on).
    state: Mutex<State>,
    /// Writes queued for the lock: a finishing member hands its transaction on while this is
    /// above zero.
    queued: AtomicUsize,
    options: SqliteConnectOptions,
    /// Group COMMITs that succeeded (tests count how writes were grouped).
    #[cfg(test)]
    commits: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// What the connection's current holder is doing; still set when a holder was dropped
    /// unfinished, so the next one undoes its part.
    holder: Option<Part>,
    /// Whether the holder's opening statement (`BEGIN IMMEDIATE`, its savepoint) ran.
    opened: Opened,
    /// The transaction members have finished in and wait on, while it is open.
    group: Option<Arc<Group>>,
    /// Members of `group` so far.
    members: usize,
}

/// What a holder of the writer is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The first member of a transaction: `BEGIN IMMEDIATE` was its own.
    Opener,
    /// A later member, under `holdfast_member`.
    Joiner,
    /// The group's COMMIT is in flight (not a write's part: the step a cancelled committer
    /// leaves behind, whose transaction the next holder ends).
    Committing,
}

/// Whether a holder's opening statement ran: sent ahead of a write ([`Writer::begin`]), or
/// ahead of its first query ([`SqliteWriteAhead::first`]), which may be cut off unanswered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Opened {
    #[default]
    Yes,
    /// Not sent yet: the part has done nothing.
    No,
    /// Sent with a first query that did not answer (cancelled, or the connection failed).
    Unknown,
}

/// The writer's connection, held.
type Held = OwnedMappedMutexGuard<Option<SqliteConnection>, SqliteConnection>;

/// A write transaction on a SQLite pool's writer ([`super::begin_sqlite_write`]). Statements
/// run on `&mut *write`. It ends with [`SqliteWrite::commit`] (durable when it returns) or
/// [`SqliteWrite::rollback`]; dropped unfinished, its part is rolled back before the writer's
/// next write.
pub struct SqliteWrite {
    // Dropped first: the lock is released before `abandon` tells anyone.
    conn: Held,
    part: Part,
    /// The group transaction this write is a member of.
    group: Arc<Group>,
    abandon: Abandon,
}

impl Deref for SqliteWrite {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.conn
    }
}

impl DerefMut for SqliteWrite {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }
}

impl std::fmt::Debug for SqliteWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWrite")
            .field("part", &self.part)
            .finish_non_exhaustive()
    }
}

impl Writer {
    pub(super) fn new(options: SqliteConnectOptions) -> Writer {
        Writer {
            conn: Arc::new(tokio::sync::Mutex::new(None)),
            state: Mutex::new(State::default()),
            queued: AtomicUsize::new(0),
            options,
            #[cfg(test)]
            commits: AtomicUsize::new(0),
        }
    }

    /// Writes waiting for the writer now.
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Group COMMITs so far.
    #[cfg(test)]
    pub(super) fn commits(&self) -> usize {
        self.commits.load(Ordering::Acquire)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits (up to `within`, fairly) for the writer, then starts a transaction (joining the
    /// open group's when there is one); `deferred`: its opening statement is left for its
    /// first query ([`SqliteWriteAhead::first`]).
    pub(super) async fn begin(
        self: &Arc<Self>,
        within: Duration,
        deferred: bool,
    ) -> Result<SqliteWrite, sqlx::Error> {
        let queued = Queued::new(self);
        let guard = tokio::time::timeout(within, self.conn.clone().lock_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?;
        queued.arrived();
        // Cancelled from here on, the writer is released with a part maybe begun: it is
        // cleaned up (the part undone, a group left open committed).
        let abandon = Abandon {
            writer: self.clone(),
            armed: true,
        };
        if deferred {
            return self.start(guard, abandon, true).await;
        }
        // The opening sent now runs to its end in a task of its own: cut off while it is in
        // flight, the writer could not know whether it ran and would fail its whole group (a
        // caller's deadline failing every other member's write). Abandoned after it, the
        // write is undone as any other.
        let writer = self.clone();
        match tokio::spawn(async move { writer.start(guard, abandon, false).await }).await {
            Ok(started) => started,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(sqlx::Error::WorkerCrashed),
        }
    }

    /// The rest of [`Writer::begin`] once it holds the writer's lock.
    async fn start(
        self: &Arc<Self>,
        guard: OwnedMutexGuard<Option<SqliteConnection>>,
        abandon: Abandon,
        deferred: bool,
    ) -> Result<SqliteWrite, sqlx::Error> {
        let mut conn = self.ready(guard).await?;
        let open = {
            let state = self.state();
            state.group.clone().filter(|_| state.members < GROUP_MAX)
        };
        let part = if open.is_some() {
            Part::Joiner
        } else {
            self.commit_open_group(&mut conn).await;
            Part::Opener
        };
        {
            let mut state = self.state();
            state.holder = Some(part);
            state.opened = if deferred {
                Opened::No
            } else {
                Opened::Unknown
            };
        }
        if !deferred {
            let opening = match part {
                Part::Joiner => SAVEPOINT_MEMBER,
                Part::Opener | Part::Committing => super::SQLITE_BEGIN_WRITE,
            };
            if let Err(e) = conn.execute(opening).await {
                if part == Part::Joiner {
                    // Nothing of this write began: the earlier members' work commits.
                    self.state().holder = None;
                    self.commit_open_group(&mut conn).await;
                }
                // An opener's holder stays set: the next holder rolls back whatever the
                // connection is in (or reconnects), so one failure cannot stick.
                return Err(e);
            }
            self.state().opened = Opened::Yes;
        }
        let group = {
            let mut state = self.state();
            let group = open.unwrap_or_else(Group::new);
            state.members = if part == Part::Joiner {
                state.members + 1
            } else {
                1
            };
            state.group = Some(group.clone());
            group
        };
        Ok(SqliteWrite {
            conn,
            part,
            group,
            abandon,
        })
    }

    /// The connection, connected, with whatever a dropped holder left unfinished undone.
    async fn ready(
        &self,
        mut guard: OwnedMutexGuard<Option<SqliteConnection>>,
    ) -> Result<Held, sqlx::Error> {
        if let Some(conn) = guard.as_mut()
            && let Err(e) = self.undo_abandoned(conn).await
        {
            tracing::warn!(error = %e, "SQLite writer: could not undo an abandoned write; reconnecting");
            self.fail_group(&group_failed(&e.to_string()));
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.options.connect().await?);
        }
        OwnedMutexGuard::try_map(guard, Option::as_mut).map_err(|_| sqlx::Error::WorkerCrashed)
    }

    /// Undoes the part of a holder that was dropped unfinished: an opener's whole transaction
    /// (nobody had joined it yet), a joiner's savepoint (the group goes on) - nothing when its
    /// opening was never sent, the whole group when it is unknown whether it ran.
    async fn undo_abandoned(&self, conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        let (abandoned, opened) = {
            let mut state = self.state();
            (state.holder.take(), std::mem::take(&mut state.opened))
        };
        match (abandoned, opened) {
            (None, _) => Ok(()),
            (Some(Part::Opener | Part::Committing), opened) => {
                // Nobody joins an opener's transaction before its part ends: it is the
                // opener's alone; a cancelled COMMIT's group was told "unknown" already.
                // (There may be no transaction - the BEGIN or COMMIT never ran, or did - and
                // the ROLLBACK fails: the caller then starts on a fresh connection.)
                {
                    let mut state = self.state();
                    state.group = None;
                    state.members = 0;
                }
                if opened == Opened::No {
                    return Ok(());
                }
                conn.execute("ROLLBACK").await.map(|_| ())
            }
            // Its savepoint was never sent: it wrote nothing, the group goes on.
            (Some(Part::Joiner), Opened::No) => Ok(()),
            (Some(Part::Joiner), Opened::Unknown) => {
                // A `ROLLBACK TO` could reach an earlier member's savepoint (they nest under
                // one name): the group is undone as a whole and every member told.
                let _ = conn.execute("ROLLBACK").await;
                self.fail_group(&group_failed(
                    "a member was cancelled before it knew whether its savepoint was taken",
                ));
                Ok(())
            }
            (Some(Part::Joiner), Opened::Yes) => {
                let undone = conn.execute(UNDO_MEMBER).await;
                match undone {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        let _ = conn.execute("ROLLBACK").await;
                        self.fail_group(&e);
                        Ok(())
                    }
                }
            }
        }
    }

    /// Commits the open group transaction, if any, and tells its members.
    async fn commit_open_group(
        self: &Arc<Self>,
        conn: &mut SqliteConnection,
    ) -> Option<Result<(), String>> {
        let group = {
            let mut state = self.state();
            state.members = 0;
            state.group.take()
        }?;
        let unpublished = Unpublished {
            group: Some(group),
            writer: self.clone(),
        };
        self.state().holder = Some(Part::Committing);
        let committed = conn.execute("COMMIT").await.map(|_| ());
        if committed.is_err() {
            // A failed COMMIT may leave the transaction open: end it, so the next write starts
            // clean.
            let _ = conn.execute("ROLLBACK").await;
        }
        self.state().holder = None;
        #[cfg(test)]
        if committed.is_ok() {
            self.commits.fetch_add(1, Ordering::AcqRel);
        }
        unpublished.publish(&committed);
        Some(committed.map_err(|e| e.to_string()))
    }

    /// Ends soon what a write dropped unfinished, a queued write that gave up, or a cancelled
    /// COMMIT left open on the connection, instead of at the next write: until then SQLite's
    /// write lock stays taken (any other connection to the file - a migration, the test clock,
    /// another process - waits for it) and members of an open group wait for a COMMIT nobody
    /// is about to run. A task takes the writer after whoever is queued (who, if anyone, will
    /// join or commit the group), undoes the dropped part, and commits the group if nobody is
    /// queued. The one way a group is finished other than by its last member. (Outside a
    /// runtime the next write does it.)
    fn clean_up_soon(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let writer = self.clone();
        runtime.spawn(async move {
            let guard = writer.conn.clone().lock_owned().await;
            let Ok(mut conn) = writer.ready(guard).await else {
                return;
            };
            if writer.queued.load(Ordering::Acquire) == 0 {
                writer.commit_open_group(&mut conn).await;
            }
        });
    }

    /// The open group is lost (its transaction rolled back or its connection gone): every
    /// member is told.
    fn fail_group(&self, e: &sqlx::Error) {
        let mut state = self.state();
        state.members = 0;
        if let Some(group) = state.group.take() {
            group.publish(&Err(group_failed(&e.to_string())));
        }
    }

    /// Before a member's part ends with no write queued: yields to the scheduler up to
    /// `GATHER_PASSES` times, until a write queues or the group is full, so that writes whose
    /// tasks were about to begin join this group instead of opening the next (one COMMIT, one
    /// fsync for them all; see `batch.rs`). Cancelled meanwhile, the member is a write dropped
    /// unfinished like any other: its part is undone.
    async fn gather(&self) {
        for _ in 0..super::batch::GATHER_PASSES {
            if self.queued.load(Ordering::Acquire) > 0 || self.state().members >= GROUP_MAX {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// A member's part is over (released or rolled back): commit the group now if nobody is
    /// queued to join it (or it is full), else leave it open for the next in the queue.
    /// `Some` when this call committed it.
    async fn end_part(self: &Arc<Self>, conn: &mut SqliteConnection) -> Option<Result<(), String>> {
        self.state().holder = None;
        let full = self.state().members >= GROUP_MAX;
        if full || self.queued.load(Ordering::Acquire) == 0 {
            self.commit_open_group(conn).await
        } else {
            None
        }
    }
}

impl SqliteWrite {
    /// Commits this write: its part becomes durable with its group's COMMIT, which this call
    /// waits for. An error: nothing of it was written.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        let writer = self.abandon.writer.clone();
        writer.gather().await;
        // A joiner's savepoint stays open until the group's COMMIT (`SAVEPOINT_MEMBER`).
        self.abandon.armed = false;
        match writer.end_part(&mut self.conn).await {
            Some(Ok(())) => Ok(()),
            Some(Err(reason)) => Err(group_failed(&reason)),
            None => {
                drop(self.conn);
                await_group(self.group).await
            }
        }
    }

    /// Rolls this write back; the group it was part of (if any) goes on without it.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.abandon.armed = false;
        let writer = self.abandon.writer.clone();
        match self.part {
            // A write is never `Committing` (that step is the writer's own).
            Part::Committing => {
                writer.state().holder = None;
                Ok(())
            }
            Part::Opener => {
                // Nobody joins before the opener's part ends: the transaction is its alone.
                {
                    let mut state = writer.state();
                    state.holder = None;
                    state.group = None;
                    state.members = 0;
                }
                self.conn.execute("ROLLBACK").await.map(|_| ())
            }
            Part::Joiner => {
                let undone = self.conn.execute(UNDO_MEMBER).await;
                if let Err(e) = undone {
                    writer.state().holder = None;
                    let _ = self.conn.execute("ROLLBACK").await;
                    writer.fail_group(&e);
                    return Err(e);
                }
                // The earlier members wait on the group: commit it or hand it on.
                writer.end_part(&mut self.conn).await;
                Ok(())
            }
        }
    }
}
