//! Group commit for the PostgreSQL store: concurrent calls of one kind of write (`create`,
//! `record_held`, `record_rejected`, `record_phase`, and the decided writes `store/decide.rs`
//! describes, run by `executor.rs`) queue up and reach the database as one statement (one
//! round trip, one commit) for the whole batch.
//!
//! One task per kind drains its queue ([`Batcher`], shared with the participant SDK): it
//! takes every job waiting (up to a cap), runs them as one batch, answers each, and takes the
//! next. A call made while no other of its kind is in flight runs alone in the caller's task:
//! an idle coordinator pays no hop. Should a batch fail as a whole, each of its calls runs
//! alone, all at once (each in a task of its own), so one call's error is its own.
//!
//! Those reruns are idempotent: a batch that failed may have committed all the same (the
//! commit's acknowledgement lost with its connection). A rerun `create` finds its row by its
//! own reservation id and answers it as new (`admission`); a rerun `record_phase` finds its
//! write id on the row (`last_phase_write`, written with the batch) and applies nothing again;
//! a rerun `record_held` or `record_rejected` finds the reservation left `TRYING` and only
//! reads it; a rerun decided write (Confirm, Cancel) finds the version it was judged on gone
//! and misses, so the locked path answers it from the row as it is.

use std::collections::HashMap;
use std::future::Future;

use sqlx::postgres::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::answers::{self, PhaseWrite, StoppedPlacement};
use super::create::{self, NewRow};
use super::executor;
use crate::db::batch::{Batcher, distinct_by};
use crate::domain::policy::{Backoff, HoldLimits};
use crate::domain::{NewReservation, Rejection, Reservation, State};
use crate::store::sql::LeaveHeld;
use crate::store::{BranchReport, Created, PhaseRecorded, StoreError, WorkLease};

/// Most writes of one kind in one statement. A batch costs about one round trip and one
/// commit whatever its size, and only one batch of a kind is in the database at a time, so
/// the cap decides how many rounds a burst waits: 256 lets a flash sale's opening wave (the
/// bench's 256 in flight) go in one round.
const MAX_BATCH: usize = 256;

/// A queued `create`.
struct CreateJob {
    new: NewReservation,
    lease: WorkLease,
    limits: HoldLimits,
    reply: oneshot::Sender<Result<Created, StoreError>>,
}

impl CreateJob {
    fn row(&self) -> NewRow<'_> {
        NewRow {
            new: &self.new,
            lease: self.lease,
            limits: self.limits,
        }
    }
}

/// A queued `record_held`.
struct HeldJob {
    id: Uuid,
    reports: Vec<BranchReport>,
    reply: oneshot::Sender<Result<Reservation, StoreError>>,
}

/// A queued `record_rejected`.
struct RejectedJob {
    id: Uuid,
    rejection: Option<Rejection>,
    reports: Vec<BranchReport>,
    reply: oneshot::Sender<Result<Reservation, StoreError>>,
}

impl RejectedJob {
    fn placement(&self) -> StoppedPlacement<'_> {
        StoppedPlacement {
            id: self.id,
            rejection: self.rejection.as_ref(),
            reports: &self.reports,
        }
    }
}

/// A queued `record_phase`.
struct PhaseJob {
    write: PhaseWrite,
    reply: oneshot::Sender<Result<PhaseRecorded, StoreError>>,
}

/// A queued decided write (version-guarded).
struct WriteJob {
    write: LeaveHeld,
    reply: oneshot::Sender<Result<Option<Reservation>, StoreError>>,
}

/// The PostgreSQL store's group-committed writes: one batcher (and task) per kind.
pub(super) struct GroupCommit {
    pool: PgPool,
    /// Reserves (`create`).
    creates: Batcher<CreateJob>,
    /// `record_held` calls.
    held: Batcher<HeldJob>,
    /// `record_rejected` calls (a flash sale's opening wave is mostly these).
    rejected: Batcher<RejectedJob>,
    /// `record_phase` calls.
    phases: Batcher<PhaseJob>,
    /// Decided writes of the unlocked path (Confirm, Cancel).
    writes: Batcher<WriteJob>,
}

impl GroupCommit {
    /// Inside a tokio runtime this starts the tasks that group-commit concurrent writes (they
    /// end with the runtime); outside one, every write runs alone.
    pub(super) fn spawn(pool: &PgPool) -> GroupCommit {
        let creates = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_creates(pool.clone(), jobs))
        };
        let held = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_from_trying(pool.clone(), jobs))
        };
        let rejected = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_from_trying(pool.clone(), jobs))
        };
        let phases = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_phases(pool.clone(), jobs))
        };
        let writes = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_writes(pool.clone(), jobs))
        };
        GroupCommit {
            pool: pool.clone(),
            creates,
            held,
            rejected,
            phases,
            writes,
        }
    }

    /// [`crate::store::Store::create`]: alone when idle or under a global hold cap (every
    /// Reserve then queues on one lock anyway), else queued.
    pub(super) async fn create(
        &self,
        new: &NewReservation,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        let (_in_flight, idle) = self.creates.enter();
        if idle || limits.total > 0 {
            let row = NewRow { new, lease, limits };
            return create_alone(&self.pool, row).await;
        }
        let (reply, answer) = oneshot::channel();
        let job = CreateJob {
            new: new.clone(),
            lease,
            limits,
            reply,
        };
        match self.creates.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => create_alone(&self.pool, job.row()).await,
        }
    }

    /// [`crate::store::Store::record_held`]: alone when idle, else queued.
    pub(super) async fn record_held(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let (_in_flight, idle) = self.held.enter();
        if idle {
            return answers::record_held_alone(&self.pool, id, reports).await;
        }
        let (reply, answer) = oneshot::channel();
        let job = HeldJob {
            id,
            reports: reports.to_vec(),
            reply,
        };
        match self.held.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => answers::record_held_alone(&self.pool, job.id, &job.reports).await,
        }
    }

    /// [`crate::store::Store::record_rejected`]: alone when idle, else queued.
    pub(super) async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let (_in_flight, idle) = self.rejected.enter();
        if idle {
            let alone = StoppedPlacement {
                id,
                rejection,
                reports,
            };
            return answers::record_rejected_alone(&self.pool, &alone).await;
        }
        let (reply, answer) = oneshot::channel();
        let job = RejectedJob {
            id,
            rejection: rejection.cloned(),
            reports: reports.to_vec(),
            reply,
        };
        match self.rejected.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => answers::record_rejected_alone(&self.pool, &job.placement()).await,
        }
    }

    /// [`crate::store::Store::record_phase`]: alone when idle, else queued.
    pub(super) async fn record_phase(
        &self,
        id: Uuid,
        from: State,
        reports: &[BranchReport],
        finish: Option<State>,
        backoff: Backoff,
    ) -> Result<PhaseRecorded, StoreError> {
        let (_in_flight, idle) = self.phases.enter();
        let (reply, answer) = oneshot::channel();
        let job = PhaseJob {
            write: PhaseWrite {
                write_id: Uuid::new_v4(),
                id,
                from,
                reports: reports.to_vec(),
                finish,
                backoff,
            },
            reply,
        };
        let queued = if idle {
            Err(job)
        } else {
            self.phases.submit(job)
        };
        match queued {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => answers::record_phase_alone(&self.pool, &job.write).await,
        }
    }

    /// A decided write, version-guarded (`executor.rs`): alone when idle, else queued. Its
    /// after-image without branches; `None`: the guard missed.
    pub(super) async fn leave_held(
        &self,
        write: LeaveHeld,
    ) -> Result<Option<Reservation>, StoreError> {
        let (_in_flight, idle) = self.writes.enter();
        if idle {
            return leave_held_alone(&self.pool, write).await;
        }
        let (reply, answer) = oneshot::channel();
        match self.writes.submit(WriteJob { write, reply }) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => leave_held_alone(&self.pool, job.write).await,
        }
    }
}

/// One decided write in a statement of its own.
async fn leave_held_alone(
    pool: &PgPool,
    write: LeaveHeld,
) -> Result<Option<Reservation>, StoreError> {
    let mut conn = pool.acquire().await?;
    Ok(executor::leave_held(&mut conn, &[&write])
        .await?
        .remove(&write.id))
}

/// Logs a batch that failed as a whole (its calls are then run alone).
fn batch_failed(e: StoreError) {
    tracing::warn!(error = %e, "a group-committed batch failed; running each of its calls alone");
}

/// Runs one call of a batch that failed as a whole, alone, in a task of its own: a database
/// that is down fails every call at once rather than one pool timeout after another, and the
/// batch task goes on taking new calls. (A call alone, or a repeat, runs in the batch task, so
/// calls arriving meanwhile queue for the next batch.)
fn rerun<J, F, Fut>(pool: &PgPool, job: J, run: F)
where
    J: Send + 'static,
    F: FnOnce(PgPool, J) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(run(pool.clone(), job));
}

/// The answer of a batcher whose task went away with its runtime.
fn batch_task_gone<T>(_: oneshot::error::RecvError) -> Result<T, StoreError> {
    Err(StoreError::Database(sqlx::Error::WorkerCrashed))
}

/// One Reserve through [`create::create`], a batch of one.
async fn create_alone(pool: &PgPool, row: NewRow<'_>) -> Result<Created, StoreError> {
    create::create(pool, &[row])
        .await?
        .pop()
        .ok_or_else(|| StoreError::Corrupt("no answer for a Reserve".into()))
}

/// Runs queued Reserves: distinct (owner, holder)s in one transaction; should that fail, each alone,
/// so one call's error is its own.
async fn run_creates(pool: PgPool, jobs: Vec<CreateJob>) {
    let (mut batch, repeats) = distinct_by(jobs, |j| j.new.limit_key());
    let shared = if batch.len() > 1 {
        let rows: Vec<NewRow<'_>> = batch.iter().map(CreateJob::row).collect();
        create::create(&pool, &rows)
            .await
            .map_err(batch_failed)
            .ok()
    } else {
        None
    };
    if shared.is_none() && batch.len() > 1 {
        for job in std::mem::take(&mut batch) {
            rerun(&pool, job, |pool, job| async move {
                let answer = create_alone(&pool, job.row()).await;
                let _ = job.reply.send(answer);
            });
        }
    }
    let mut shared = shared.map(Vec::into_iter);
    for job in batch.into_iter().chain(repeats) {
        let answer = match shared.as_mut().and_then(Iterator::next) {
            Some(created) => Ok(created),
            None => create_alone(&pool, job.row()).await,
        };
        let _ = job.reply.send(answer);
    }
}

/// A queued write out of `TRYING` (`record_held`, `record_rejected`): a batch answers with the
/// rows it moved; a row it did not move had left `TRYING` meanwhile and is answered as it is.
trait FromTrying: Sized + Send {
    fn id(&self) -> Uuid;
    /// This kind's statement for many distinct reservations.
    fn batch(
        pool: &PgPool,
        jobs: &[Self],
    ) -> impl Future<Output = Result<HashMap<Uuid, Reservation>, StoreError>> + Send;
    /// The same, for this call alone.
    fn alone(&self, pool: &PgPool) -> impl Future<Output = Result<Reservation, StoreError>> + Send;
    fn answer(self, answer: Result<Reservation, StoreError>);
}

impl FromTrying for HeldJob {
    fn id(&self) -> Uuid {
        self.id
    }

    async fn batch(pool: &PgPool, jobs: &[Self]) -> Result<HashMap<Uuid, Reservation>, StoreError> {
        let args: Vec<(Uuid, &[BranchReport])> =
            jobs.iter().map(|j| (j.id, j.reports.as_slice())).collect();
        answers::record_held_batch(pool, &args).await
    }

    async fn alone(&self, pool: &PgPool) -> Result<Reservation, StoreError> {
        answers::record_held_alone(pool, self.id, &self.reports).await
    }

    fn answer(self, answer: Result<Reservation, StoreError>) {
        let _ = self.reply.send(answer);
    }
}

impl FromTrying for RejectedJob {
    fn id(&self) -> Uuid {
        self.id
    }

    async fn batch(pool: &PgPool, jobs: &[Self]) -> Result<HashMap<Uuid, Reservation>, StoreError> {
        let placements: Vec<StoppedPlacement<'_>> = jobs.iter().map(Self::placement).collect();
        answers::record_rejected_batch(pool, &placements).await
    }

    async fn alone(&self, pool: &PgPool) -> Result<Reservation, StoreError> {
        answers::record_rejected_alone(pool, &self.placement()).await
    }

    fn answer(self, answer: Result<Reservation, StoreError>) {
        let _ = self.reply.send(answer);
    }
}

/// Runs queued `record_held` or `record_rejected` calls: distinct reservations in one
/// statement; should that fail, each alone. A second call for a reservation of the batch runs
/// after it, alone.
async fn run_from_trying<J: FromTrying + 'static>(pool: PgPool, jobs: Vec<J>) {
    let (mut batch, repeats) = distinct_by(jobs, J::id);
    let mut shared = if batch.len() > 1 {
        J::batch(&pool, &batch).await.map_err(batch_failed).ok()
    } else {
        None
    };
    if shared.is_none() && batch.len() > 1 {
        for job in std::mem::take(&mut batch) {
            rerun(&pool, job, |pool, job| async move {
                let answer = job.alone(&pool).await;
                job.answer(answer);
            });
        }
    }
    for job in batch {
        let answer = match shared.as_mut() {
            Some(done) => {
                answers::from_trying_answer(&pool, job.id(), done.remove(&job.id())).await
            }
            None => job.alone(&pool).await,
        };
        job.answer(answer);
    }
    for job in repeats {
        let answer = job.alone(&pool).await;
        job.answer(answer);
    }
}

/// Runs queued `record_phase` calls: distinct reservations in one statement; should that fail,
/// each alone. A second call for a reservation of the batch runs after it, alone, as it would
/// have waited for the row lock.
async fn run_phases(pool: PgPool, jobs: Vec<PhaseJob>) {
    let (mut batch, repeats) = distinct_by(jobs, |j| j.write.id);
    let mut shared = if batch.len() > 1 {
        let writes: Vec<&PhaseWrite> = batch.iter().map(|j| &j.write).collect();
        answers::record_phases(&pool, &writes)
            .await
            .map_err(batch_failed)
            .ok()
    } else {
        None
    };
    if shared.is_none() && batch.len() > 1 {
        for job in std::mem::take(&mut batch) {
            rerun(&pool, job, |pool, job| async move {
                let answer = answers::record_phase_alone(&pool, &job.write).await;
                let _ = job.reply.send(answer);
            });
        }
    }
    for job in batch {
        let answer = match shared.as_mut() {
            Some(done) => {
                let recorded = done.remove(&job.write.id);
                answers::phase_answer(&pool, &job.write, recorded).await
            }
            None => answers::record_phase_alone(&pool, &job.write).await,
        };
        let _ = job.reply.send(answer);
    }
    for job in repeats {
        let answer = answers::record_phase_alone(&pool, &job.write).await;
        let _ = job.reply.send(answer);
    }
}

/// Runs queued decided writes: distinct reservations in one statement; should that fail,
/// each alone. A second write for a reservation of the batch runs after it, alone (and
/// misses: the batch moved the version it was judged on).
async fn run_writes(pool: PgPool, jobs: Vec<WriteJob>) {
    let (mut batch, repeats) = distinct_by(jobs, |j| j.write.id);
    let mut shared = if batch.len() > 1 {
        let writes: Vec<&LeaveHeld> = batch.iter().map(|j| &j.write).collect();
        let moved = async {
            let mut conn = pool.acquire().await?;
            executor::leave_held(&mut conn, &writes).await
        };
        moved.await.map_err(batch_failed).ok()
    } else {
        None
    };
    if shared.is_none() && batch.len() > 1 {
        for job in std::mem::take(&mut batch) {
            rerun(&pool, job, |pool, job| async move {
                let _ = job.reply.send(leave_held_alone(&pool, job.write).await);
            });
        }
    }
    for job in batch {
        let answer = match shared.as_mut() {
            Some(done) => Ok(done.remove(&job.write.id)),
            None => leave_held_alone(&pool, job.write).await,
        };
        let _ = job.reply.send(answer);
    }
    for job in repeats {
        let _ = job.reply.send(leave_held_alone(&pool, job.write).await);
    }
}
