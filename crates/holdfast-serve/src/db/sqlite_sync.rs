//! SQLite writes run whole on one thread, on a synchronous connection it owns: one hand-off
//! per write instead of one per statement.
//!
//! sqlx runs each SQLite statement on its connection's thread and sends the answer back: a
//! write of nine statements is nine round trips between the async task and that thread, about
//! half the CPU of a write (BENCHMARKS.md, "One hand-off per SQLite write"). Here a write is a
//! closure sent to the writer thread ([`SqliteSyncWriter::write`]); its statements run there
//! on a `rusqlite` connection, with no task switch between them, and the answer comes back
//! once.
//!
//! **Group commit**, as the pool's writer (`sqlite_write.rs`) does it: the thread takes every
//! write queued (up to [`GROUP_MAX`]), opens one `BEGIN IMMEDIATE`, runs each under a
//! `SAVEPOINT` of its own (a write that fails is undone alone, its error its own), commits
//! once and answers each with that COMMIT's outcome. A write whose caller stopped waiting
//! before its turn is skipped.
//!
//! A write's closure may open a transaction of its own ([`SyncWrite::begin`], a nested
//! savepoint) to roll back part of what it did and still answer `Ok`.
//!
//! Reads stay on the pool (WAL: they never wait for this writer).

use std::ops::{Deref, DerefMut};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

/// The most writes one group commit serves: a bound on how long the first one waits.
const GROUP_MAX: usize = 64;

/// Prepared statements kept per connection (the coordinator's store has about seventy).
const STATEMENT_CACHE: usize = 128;

/// The writer thread's connection. The mutex is never contended (only the writer thread runs
/// statements on it); it makes the connection shareable by the write's futures.
pub struct SyncConnection {
    conn: Mutex<rusqlite::Connection>,
}

impl SyncConnection {
    /// Runs `f` on the connection.
    pub fn with<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> R {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        f(&conn)
    }
}

impl std::fmt::Debug for SyncConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncConnection")
    }
}

/// One write: given the connection, runs and answers whether it succeeded (its savepoint is
/// kept or undone) and how to deliver its answer once the group's COMMIT is known; given the
/// group's failure instead, answers it without running. `None`: nothing ran.
type Job = Box<dyn FnOnce(Result<&Arc<SyncConnection>, Failed>) -> Option<Ran> + Send>;

/// A write that ran: whether it succeeded, and its answer's delivery.
struct Ran {
    ok: bool,
    deliver: Box<dyn FnOnce(Result<(), Failed>) + Send>,
}

/// A group's BEGIN or COMMIT failure, told to every write of the group.
#[derive(Clone, Debug)]
struct Failed {
    code: Option<i32>,
    message: String,
}

impl Failed {
    fn of(e: &rusqlite::Error) -> Failed {
        Failed {
            code: e.sqlite_error().map(|f| f.extended_code),
            message: e.to_string(),
        }
    }

    fn into_sqlx(self) -> sqlx::Error {
        match self.code {
            Some(code) => sqlx::Error::Database(Box::new(SqliteSyncError {
                code,
                message: self.message,
            })),
            None => sqlx::Error::Protocol(self.message),
        }
    }
}

/// A SQLite database's writer thread (see the module doc). Dropping the last handle ends the
/// thread once its queue is done.
#[derive(Clone)]
pub struct SqliteSyncWriter {
    jobs: mpsc::Sender<Job>,
    /// Group COMMITs that succeeded (tests count how writes were grouped).
    #[cfg(test)]
    pub(super) commits: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for SqliteSyncWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteSyncWriter")
    }
}

impl SqliteSyncWriter {
    /// Opens the database file `path` (it must exist, in WAL mode: [`super::open_sqlite`]
    /// made it so) with holdfast's conventions (`synchronous = FULL`, foreign keys, busy
    /// timeout, WAL size limit) and starts its writer thread.
    pub fn open(path: &Path) -> Result<SqliteSyncWriter, sqlx::Error> {
        let conn = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sqlx_error_of)?;
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
             PRAGMA journal_size_limit = {};",
            super::SQLITE_WAL_KEEP_BYTES
        ))
        .map_err(sqlx_error_of)?;
        conn.busy_timeout(super::SQLITE_BUSY_TIMEOUT)
            .map_err(sqlx_error_of)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let conn = Arc::new(SyncConnection {
            conn: Mutex::new(conn),
        });
        let (jobs, queue) = mpsc::channel();
        #[cfg(test)]
        let commits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        #[cfg(test)]
        let counted = commits.clone();
        std::thread::Builder::new()
            .name("holdfast-sqlite-writer".into())
            .spawn(move || {
                run(&conn, &queue, || {
                    #[cfg(test)]
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                })
            })?;
        Ok(SqliteSyncWriter {
            jobs,
            #[cfg(test)]
            commits,
        })
    }

    /// Runs `write` on the writer thread inside the group transaction, under a savepoint of
    /// its own: undone if it answers `Err`, committed with the group if `Ok` (its answer is
    /// then the COMMIT's outcome). Gives up after `wait` (the write is skipped if it has not
    /// started by then; one that started may still commit, as after any storage failure).
    pub async fn write<T, E>(
        &self,
        wait: Duration,
        write: impl FnOnce(&Arc<SyncConnection>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<sqlx::Error> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel::<Result<T, E>>();
        let job: Job = Box::new(move |conn| {
            let conn = match conn {
                Ok(conn) => conn,
                Err(failed) => {
                    let _ = answer.send(Err(E::from(failed.into_sqlx())));
                    return None;
                }
            };
            if answer.is_closed() {
                return None; // the caller stopped waiting: nothing done, nothing to tell
            }
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| write(conn)))
                .unwrap_or_else(|_| {
                    Err(E::from(sqlx::Error::Protocol(
                        "a SQLite write panicked".into(),
                    )))
                });
            Some(Ran {
                ok: outcome.is_ok(),
                deliver: Box::new(move |committed: Result<(), Failed>| {
                    let answered = match (committed, outcome) {
                        (Ok(()), outcome) => outcome,
                        (Err(_), Err(own)) => Err(own),
                        (Err(group), Ok(_)) => Err(E::from(group.into_sqlx())),
                    };
                    // The caller may have stopped waiting meanwhile.
                    let _ = answer.send(answered);
                }),
            })
        });
        self.jobs
            .send(job)
            .map_err(|_| E::from(sqlx::Error::WorkerCrashed))?;
        match tokio::time::timeout(wait, answered).await {
            Ok(Ok(answered)) => answered,
            Ok(Err(_)) => Err(E::from(sqlx::Error::WorkerCrashed)),
            Err(_) => Err(E::from(sqlx::Error::PoolTimedOut)),
        }
    }
}

/// The writer thread: takes what is queued, runs it as one group, answers, until every
/// handle is gone.
fn run(conn: &Arc<SyncConnection>, queue: &mpsc::Receiver<Job>, committed_one: impl Fn()) {
    while let Ok(first) = queue.recv() {
        let mut group = vec![first];
        while group.len() < GROUP_MAX {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        // Once a step of the group's own fails, the group is undone whole and every write of
        // it answers that failure (none of them was written).
        let mut broken = conn
            .with(|c| c.execute_batch("BEGIN IMMEDIATE"))
            .err()
            .map(|e| Failed::of(&e));
        let begun = broken.is_none();
        let mut ran = Vec::with_capacity(group.len());
        for job in group {
            if let Some(failed) = &broken {
                job(Err(failed.clone()));
                continue;
            }
            if let Err(e) = conn.with(|c| c.execute_batch("SAVEPOINT holdfast_member")) {
                let failed = Failed::of(&e);
                job(Err(failed.clone()));
                broken = Some(failed);
                continue;
            }
            let r = job(Ok(conn));
            let end = match &r {
                Some(r) if r.ok => "RELEASE holdfast_member",
                Some(_) => "ROLLBACK TO holdfast_member; RELEASE holdfast_member",
                None => "RELEASE holdfast_member",
            };
            if let Err(e) = conn.with(|c| c.execute_batch(end)) {
                broken = Some(Failed::of(&e));
            }
            ran.extend(r);
        }
        let committed = conn.with(|c| match broken {
            Some(failed) => {
                if begun {
                    let _ = c.execute_batch("ROLLBACK");
                }
                Err(failed)
            }
            None => c
                .execute_batch("COMMIT")
                .map(|()| committed_one())
                .map_err(|e| {
                    let failed = Failed::of(&e);
                    let _ = c.execute_batch("ROLLBACK");
                    failed
                }),
        });
        for r in ran {
            (r.deliver)(committed.clone());
        }
    }
}

/// A transaction inside a write ([`SqliteSyncWriter::write`]): a savepoint, released by
/// [`SyncWrite::commit`] (committed with the write's group), undone by
/// [`SyncWrite::rollback`] or when dropped unfinished. Statements run on `&mut *tx`.
pub struct SyncWrite {
    conn: Arc<SyncConnection>,
    open: bool,
}

impl SyncWrite {
    /// Opens the savepoint on `conn` (the connection a write was given).
    pub fn begin(conn: &Arc<SyncConnection>) -> Result<SyncWrite, sqlx::Error> {
        conn.with(|c| c.execute_batch("SAVEPOINT holdfast_write"))
            .map_err(sqlx_error_of)?;
        Ok(SyncWrite {
            conn: conn.clone(),
            open: true,
        })
    }

    fn end(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        self.open = false;
        self.conn
            .with(|c| c.execute_batch(sql))
            .map_err(sqlx_error_of)
    }
}

impl Drop for SyncWrite {
    fn drop(&mut self) {
        if self.open {
            let _ = self.end("ROLLBACK TO holdfast_write; RELEASE holdfast_write");
        }
    }
}

impl Deref for SyncWrite {
    type Target = Arc<SyncConnection>;
    fn deref(&self) -> &Arc<SyncConnection> {
        &self.conn
    }
}

impl DerefMut for SyncWrite {
    fn deref_mut(&mut self) -> &mut Arc<SyncConnection> {
        &mut self.conn
    }
}

impl super::WriteTransaction for SyncWrite {
    fn commit(mut self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        std::future::ready(self.end("RELEASE holdfast_write"))
    }

    fn rollback(mut self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        std::future::ready(self.end("ROLLBACK TO holdfast_write; RELEASE holdfast_write"))
    }
}

/// A SQLite error from the writer's connection, as an sqlx database error, so it is
/// classified (`code`, `kind`) as sqlx's own SQLite errors are.
#[derive(Debug)]
pub struct SqliteSyncError {
    code: i32,
    message: String,
}

impl SqliteSyncError {
    /// The extended result code (`SQLITE_CONSTRAINT_UNIQUE` = 2067, ...).
    pub fn extended_code(&self) -> i32 {
        self.code
    }
}

impl std::fmt::Display for SqliteSyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

impl std::error::Error for SqliteSyncError {}

impl sqlx::error::DatabaseError for SqliteSyncError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.code {
            // SQLITE_CONSTRAINT_UNIQUE, SQLITE_CONSTRAINT_PRIMARYKEY
            2067 | 1555 => ErrorKind::UniqueViolation,
            787 => ErrorKind::ForeignKeyViolation,
            1299 => ErrorKind::NotNullViolation,
            275 => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// A `rusqlite` error as an sqlx error: SQLite's own failures keep their code
/// ([`SqliteSyncError`]); a value that cannot be bound is an encode error, one that cannot be
/// read a decode error.
pub fn sqlx_error_of(e: rusqlite::Error) -> sqlx::Error {
    match e {
        rusqlite::Error::SqliteFailure(f, message) => {
            sqlx::Error::Database(Box::new(SqliteSyncError {
                code: f.extended_code,
                message: message.unwrap_or_else(|| f.to_string()),
            }))
        }
        rusqlite::Error::QueryReturnedNoRows => sqlx::Error::RowNotFound,
        rusqlite::Error::ToSqlConversionFailure(e) => sqlx::Error::Encode(e),
        other => sqlx::Error::Decode(Box::new(other)),
    }
}
