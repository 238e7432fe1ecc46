//! Recovery and the reaper: every non-terminal reservation is driven to its outcome, by
//! whichever coordinator instance claims it, through the same confirm/release paths as the
//! RPCs.
//!
//! Work is claimed from the store with leases (`FOR UPDATE SKIP LOCKED` + a lease deadline),
//! so instances sharing one database never drive the same reservation at once, and a dead
//! instance's work is taken over when its lease ends.
//!
//! Each claimed reservation is driven in a task of its own ([`Drives`]): a sweep does not wait
//! for what it claimed, so a participant that stalls (every call running into its timeout)
//! delays only the reservations that involve it. Drives are bounded overall
//! (`Policy::max_recovery_drives`, and a sweep claims only what there is room for) and per
//! participant (`Policy::max_recovery_drives_per_participant`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::{Coordinator, Error, faults};
use crate::domain::{BranchState, Reservation, State};
use crate::store::{BranchReport, Claimed};

/// How often participants that failed are probed for health.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How often the recovery backlog gauge is refreshed.
const BACKLOG_GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a stopping recovery loop lets its drives in flight finish before it abandons them
/// (their leases run out and any instance takes them over).
const STOP_GRACE: Duration = Duration::from_secs(5);

impl Coordinator {
    /// Drives one claimed reservation as far as its participants allow now, and sends the
    /// refunds still owed for its further payments.
    pub async fn recover(&self, id: Uuid) -> Result<Reservation, Error> {
        let r = self.recover_reservation(id).await?;
        self.drive_extra_refunds(id).await?;
        Ok(r)
    }

    async fn recover_reservation(&self, id: Uuid) -> Result<Reservation, Error> {
        let r = self.read(id).await?;
        match r.stored_state {
            // An offer from a waitlist (a later generation) whose offerer stopped mid-way:
            // release what it may have placed; it waits in its queues again.
            State::Trying if r.generation > 0 => self.requeue_abandoned_offer(r).await,
            State::Trying => {
                // Its placer stopped mid-way: any branch may hold something, so release all.
                tracing::warn!(reservation_id = %id, "releasing a reservation abandoned while placing holds");
                let reports =
                    abandoned_placement(&r, "the coordinator stopped while placing holds");
                faults::store("coord.record_rejected.before")?;
                let recorded = self.store.record_rejected(id, None, &reports).await?;
                faults::store("coord.record_rejected.after")?;
                self.drive_release(recorded).await
            }
            State::Confirming => self.drive_confirm(r).await,
            State::Cancelling => {
                let r = self.drive_release(r).await?;
                self.drive_refund(r).await
            }
            State::Expired if r.payment.is_some() && r.refund.is_none() => {
                // A late payment was being honoured when its coordinator stopped: release
                // whatever it may have re-taken and refund the payment.
                tracing::warn!(reservation_id = %id, "refunding a late payment abandoned mid-way");
                let reports =
                    abandoned_placement(&r, "the coordinator stopped while placing holds again");
                let r = self
                    .store
                    .fail_retake(
                        id,
                        &reports,
                        "the coordinator stopped while honouring the late payment",
                    )
                    .await?;
                let r = self.drive_release(r).await?;
                self.drive_refund(r).await
            }
            _ => self.drive_refund(r).await,
        }
    }

    /// Claims due work (lapsed holds, abandoned placements, retries), as much as `drives`
    /// has room for, and starts driving each claimed reservation in a task of its own.
    /// Returns how many reservations it claimed.
    async fn sweep(&self, drives: &mut Drives) -> Result<usize, Error> {
        while drives.tasks.try_join_next().is_some() {}
        let room = drives
            .global
            .available_permits()
            .min(self.policy.sweep_batch as usize);
        if room == 0 {
            return Ok(0);
        }
        faults::store("coord.claim_due.before")?;
        let claimed = self
            .store
            .claim_due(self.lease(), u32::try_from(room).unwrap_or(u32::MAX))
            .await?;
        faults::store("coord.claim_due.after")?;
        let n = claimed.len();
        for c in claimed {
            drives.start(self, c);
        }
        Ok(n)
    }

    /// A claimed lapsed hold is expired by its driver, before the release is driven: `HELD ->
    /// CANCELLING` ending `EXPIRED` by [`crate::store::Store::expire_lapsed_hold`], the one
    /// write of an expiry (the claim only leased it, and the lease stays). Counted only when
    /// this write expired it: a decision that got there first (a Cancel, a late payment
    /// honoured or refunded) counted its own, and the drive then drives whatever state it
    /// left. Answers whether this write expired it.
    pub(super) async fn expire_claimed(&self, claim: Claimed) -> Result<bool, Error> {
        if !claim.lapsed_hold {
            return Ok(false);
        }
        let expired = self.store.expire_lapsed_hold(claim.id).await?;
        if expired {
            crate::telemetry::reservation_entered(State::Cancelling);
            crate::telemetry::hold_expired();
        }
        Ok(expired)
    }

    /// Drives one claimed reservation (a lapsed hold expired first, [`Self::expire_claimed`])
    /// once it has a turn at each of its participants; a reservation that waited for its turn
    /// first renews its lease, and is left alone if another instance took it over meanwhile.
    async fn drive_claimed(&self, claim: Claimed, limits: &ParticipantLimits) -> Result<(), Error> {
        let id = claim.id;
        self.expire_claimed(claim).await?;
        let r = self.read(id).await?;
        let (_turns, waited) = limits.acquire(participants_of(&r)).await;
        if waited && !self.store.renew_lease(id, self.lease()).await? {
            tracing::info!(reservation_id = %id, "lease lost while waiting for a participant; left to its new owner");
            return Ok(());
        }
        self.recover(id).await.map(drop)
    }

    /// Runs the reaper and recovery until `stop` turns true: sweeps every `sweep_interval`
    /// (at once again while a sweep was full), probes failing participants, and retries a
    /// participant's backlog as soon as it answers again.
    pub async fn run_recovery(self, mut stop: watch::Receiver<bool>) {
        let mut last_probe = Instant::now();
        let mut last_gauge: Option<Instant> = None;
        let mut drives = Drives::new(&self.policy);
        let mut probing: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            if *stop.borrow() {
                drives.finish().await;
                return;
            }
            crate::background::pass_failpoint("coord.recovery.pass");
            for name in self.registry.take_came_back() {
                match self.store.wake_backlog(&name).await {
                    Ok(n) if n > 0 => {
                        tracing::info!(participant = %name, reservations = n, "retrying backlog now")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "waking backlog failed"),
                }
            }
            if last_gauge.is_none_or(|t| t.elapsed() >= BACKLOG_GAUGE_INTERVAL) {
                last_gauge = Some(Instant::now());
                match self.store.backlog().await {
                    Ok(n) => crate::telemetry::recovery_backlog(n),
                    Err(e) => tracing::warn!(error = %e, "reading the recovery backlog failed"),
                }
                match self.store.oldest_work_age().await {
                    Ok(age) => crate::telemetry::ops::oldest_work_age(age),
                    Err(e) => tracing::warn!(error = %e, "reading the oldest work's age failed"),
                }
            }
            // Probes run beside the sweeps (a probe of a dead participant waits out its
            // timeout), one round at a time.
            if last_probe.elapsed() >= PROBE_INTERVAL
                && probing.as_ref().is_none_or(|p| p.is_finished())
            {
                last_probe = Instant::now();
                let registry = self.registry.clone();
                probing = Some(tokio::spawn(async move {
                    join_all(registry.failing().into_iter().map(|p| p.probe())).await;
                }));
            }
            let full = {
                // Uncontended but in test mode, where a pass on demand may hold it.
                let _turn = self.sweeps.lock().await;
                match self.sweep(&mut drives).await {
                    Ok(n) => n >= self.policy.sweep_batch as usize,
                    Err(e) => {
                        tracing::warn!(error = %e, "sweep failed");
                        false
                    }
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        drives.finish().await;
                        return;
                    }
                }
                _ = tokio::time::sleep(self.policy.sweep_interval) => {}
                _ = self.registry.came_back() => {}
            }
        }
    }
}

/// Recovery's drives in flight: one task per claimed reservation, bounded overall and per
/// participant.
struct Drives {
    tasks: JoinSet<()>,
    /// A permit per drive in flight; a sweep claims no more than are free.
    global: Arc<Semaphore>,
    per_participant: Arc<ParticipantLimits>,
    /// Reservations this process's recovery is driving: claimed again (their lease ran out
    /// while they waited for a turn), they are left to the drive in flight.
    driving: Arc<Mutex<HashSet<Uuid>>>,
}

impl Drives {
    fn new(policy: &super::Policy) -> Drives {
        Drives {
            tasks: JoinSet::new(),
            global: Arc::new(Semaphore::new(policy.max_recovery_drives.max(1))),
            per_participant: Arc::new(ParticipantLimits {
                each: policy.max_recovery_drives_per_participant.max(1),
                turns: Mutex::default(),
            }),
            driving: Arc::default(),
        }
    }

    /// Starts driving claimed reservation `claim` in a task of its own, unless it is being
    /// driven here already.
    fn start(&mut self, coordinator: &Coordinator, claim: Claimed) {
        let id = claim.id;
        let Ok(permit) = self.global.clone().try_acquire_owned() else {
            // Not reached: a sweep claims only as many as there are permits.
            tracing::warn!(reservation_id = %id, "no room to drive a claimed reservation; its lease will run out");
            return;
        };
        let inserted = self
            .driving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
        if !inserted {
            return;
        }
        let guard = Driving {
            id,
            set: self.driving.clone(),
        };
        let coordinator = coordinator.clone();
        let limits = self.per_participant.clone();
        self.tasks.spawn(async move {
            let _permit = permit;
            let _guard = guard;
            if let Err(e) = coordinator.drive_claimed(claim, &limits).await {
                tracing::warn!(reservation_id = %id, error = %e, "recovery attempt failed; will retry");
            }
        });
    }

    /// Lets the drives in flight finish (for at most [`STOP_GRACE`]), then abandons the rest.
    async fn finish(mut self) {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_GRACE, all).await.is_err() {
            tracing::info!(
                drives = self.tasks.len(),
                "stopping with recovery drives in flight; their leases will run out"
            );
        }
    }
}

/// Marks a reservation as driven here until dropped (also when its task is aborted).
struct Driving {
    id: Uuid,
    set: Arc<Mutex<HashSet<Uuid>>>,
}

impl Drop for Driving {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// A semaphore per participant name: how many recovery drives may involve it at once.
struct ParticipantLimits {
    each: usize,
    turns: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl ParticipantLimits {
    /// A turn at each of `participants` (taken in name order, so two drives never wait for
    /// each other's), and whether any had to be waited for.
    async fn acquire(&self, participants: BTreeSet<String>) -> (Vec<OwnedSemaphorePermit>, bool) {
        let mut turns = Vec::with_capacity(participants.len());
        let mut waited = false;
        for name in participants {
            let semaphore = self
                .turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(name)
                .or_insert_with(|| Arc::new(Semaphore::new(self.each)))
                .clone();
            let turn = match semaphore.clone().try_acquire_owned() {
                Ok(turn) => turn,
                Err(_) => {
                    waited = true;
                    match semaphore.acquire_owned().await {
                        Ok(turn) => turn,
                        // Never closed.
                        Err(_) => continue,
                    }
                }
            };
            turns.push(turn);
        }
        (turns, waited)
    }
}

/// The participants a drive of `r` may call: its branches' and its payment's.
fn participants_of(r: &Reservation) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = r
        .branches
        .iter()
        .map(|b| b.hold.participant.clone())
        .collect();
    if let Some(p) = &r.payment {
        names.insert(p.participant.clone());
    }
    names
}

/// What to record of a placement its placer abandoned: every branch that may hold something
/// (all but the refused ones), as it stands, with `why`, so the one release path releases it.
pub(super) fn abandoned_placement(r: &Reservation, why: &str) -> Vec<BranchReport> {
    r.participant_branches()
        .into_iter()
        .filter(|b| b.state != BranchState::Rejected)
        .map(|b| BranchReport {
            branch_id: b.branch_id,
            state: b.state,
            error: Some(why.to_owned()),
        })
        .collect()
}
