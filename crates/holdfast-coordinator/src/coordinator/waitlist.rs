//! Waitlists (SPEC 11): a Reserve with `queue` refused for capacity waits `QUEUED` in the
//! queue of each resource that refused it; released units are offered to the oldest waiting
//! reservation that fits.
//!
//! - Joining: [`Coordinator::join_queue`] records the refusal as `QUEUED` (or releases what
//!   was placed first, ending `QUEUED`) through `Store::join_queue`. While this process knows a
//!   resource has a queue ([`Waitlist::queued`]), a new Reserve for it does not get ahead: one
//!   without `queue` is refused before anything is recorded, one with it joins the tail
//!   without a Try (`place.rs`).
//! - Offers: every release this process makes ([`Waitlist::released`], from the one release
//!   path) wakes [`Coordinator::run_offers`], which offers each released queue at once; a
//!   sweep every `--queue-sweep` offers every queue (capacity that came back another way, a
//!   release whose offer a crash lost) and ends the waits that are over. One instance offers a
//!   queue at a time (`Store::lease_queue`), and an offer starts with a conditional write
//!   (`Store::begin_offer`): no reservation is offered twice at once. An offer places the
//!   whole reservation in canonical order, as a Reserve (`place_in_order`); refused, it goes
//!   back to its queues, keeping its places.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::sold_out::{Probe, SoldOutHit};
use super::{Coordinator, Error, entered, faults};
use crate::domain::waitlist::{QueueKey, QueuePage};
use crate::domain::{BranchState, Hold, Reservation, State};
use crate::store::{BranchReport, JoinQueue, Joined, QueueHead};

/// Most waiting reservations one offer pass of one queue looks at.
const HEADS_PER_PASS: u32 = 16;

/// Most waits one sweep ends.
const END_WAITS_PER_SWEEP: u32 = 500;

/// The waitlists as one coordinator process sees them: which queues it knows are non-empty,
/// and which have released units to offer.
#[derive(Debug, Default)]
pub(crate) struct Waitlist {
    /// Queues known to be non-empty: joined by this process, or found by the last sweep.
    known: Mutex<BTreeSet<QueueKey>>,
    /// Queues whose resources this process released units of since the last offer pass, and
    /// how many units.
    released: Mutex<BTreeMap<QueueKey, i64>>,
    wake: Notify,
    /// Held by each offer pass: the loop's and an on-demand one (test mode) take turns, so a
    /// pass on demand finds no offer of this process half made.
    passes: tokio::sync::Mutex<()>,
    /// One turn per queue for this process's joins: the database serialises the joins of a
    /// queue anyway (its lock), and a join waiting here holds no pooled connection, so a storm
    /// of joins leaves the pool to the offers and everything else.
    joining: Mutex<BTreeMap<QueueKey, Arc<tokio::sync::Mutex<()>>>>,
}

impl Waitlist {
    fn known(&self) -> std::sync::MutexGuard<'_, BTreeSet<QueueKey>> {
        // A panic while holding it leaves a set of keys behind: still usable.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first of `holds` whose resource has a queue this process knows of.
    pub fn queued(&self, holds: &[Hold]) -> Option<QueueKey> {
        let known = self.known();
        if known.is_empty() {
            return None;
        }
        holds
            .iter()
            .map(QueueKey::of)
            .find(|key| known.contains(key))
    }

    /// These holds at `participant` were released: their queues (any slot) are offered that
    /// many units now.
    pub fn released(&self, participant: &str, holds: &[Hold]) {
        let known = self.known();
        if known.is_empty() {
            return;
        }
        let mut hit: Vec<(QueueKey, i64)> = Vec::new();
        for key in known.iter().filter(|k| k.participant == participant) {
            let units: i64 = holds
                .iter()
                .filter(|h| h.resource == key.resource)
                .map(|h| h.quantity)
                .sum();
            if units > 0 {
                hit.push((key.clone(), units));
            }
        }
        drop(known);
        if hit.is_empty() {
            return;
        }
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        for (key, units) in hit {
            *released.entry(key).or_default() += units;
        }
        drop(released);
        self.wake.notify_one();
    }

    /// This process's turns to join `keys`' queues, taken in key order (no two joins can wait
    /// for each other's).
    async fn join_turns(&self, keys: &BTreeSet<QueueKey>) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let turns: Vec<Arc<tokio::sync::Mutex<()>>> = {
            let mut joining = self.joining.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter()
                .map(|k| joining.entry(k.clone()).or_default().clone())
                .collect()
        };
        let mut held = Vec::with_capacity(turns.len());
        for turn in turns {
            held.push(turn.lock_owned().await);
        }
        held
    }

    /// Forgets the join turns of queues that are empty now and nobody waits to join.
    fn prune_join_turns(&self, queued: &BTreeSet<QueueKey>) {
        let mut joining = self.joining.lock().unwrap_or_else(|e| e.into_inner());
        joining.retain(|k, turn| queued.contains(k) || Arc::strong_count(turn) > 1);
    }

    fn take_released(&self) -> BTreeMap<QueueKey, i64> {
        std::mem::take(&mut *self.released.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The holds of the participant whose answer stopped a placement, when that answer was a
/// refusal (`REJECTED`: sold out, slot taken): the queues the reservation waits in. `None`
/// when the placement stopped otherwise (unreachable, refused outright, malformed).
pub(super) fn refused_holds(r: &Reservation, reports: &[BranchReport]) -> Option<Vec<Hold>> {
    let last = reports.last()?;
    if last.state != BranchState::Rejected {
        return None;
    }
    r.participant_branches()
        .into_iter()
        .find(|b| b.branch_id == last.branch_id)
        .map(|b| b.holds)
}

/// How one offer to one waiting reservation went.
enum Offer {
    /// Every hold placed: it is `HELD`.
    Placed,
    /// Refused again (or a participant could not be reached): back in its queues.
    /// `alone`: it asked for nothing but this queue's resource, so what it asked is not free.
    Refused { alone: bool },
    /// It was no longer waiting (cancelled, offered elsewhere, wait over).
    Gone,
}

impl Coordinator {
    /// Records a stopped placement (`reports`; none when nothing was tried) of `r` as waiting
    /// in the queues of `refused` for up to `wait`, releasing what was placed first. A full
    /// queue refuses it: the placement is rejected as without `queue` and the caller is told
    /// `QUEUE_FULL`.
    pub(super) async fn join_queue(
        &self,
        r: &Reservation,
        refused: &[Hold],
        reports: &[BranchReport],
        wait: Duration,
    ) -> Result<Reservation, Error> {
        let job = JoinQueue {
            id: r.id,
            reports,
            holds: refused,
            wait,
            max_length: self.policy.queue.max_length,
        };
        let keys: BTreeSet<QueueKey> = refused.iter().map(QueueKey::of).collect();
        let turns = self.waitlist.join_turns(&keys).await;
        let joined = self.store.join_queue(&job).await;
        drop(turns);
        match joined? {
            Joined::Queued(queued) => {
                self.waitlist
                    .known()
                    .extend(refused.iter().map(QueueKey::of));
                let queued = if queued.stored_state == State::Cancelling {
                    self.drive_release(queued).await?
                } else {
                    queued
                };
                entered(&queued, queued.stored_state);
                Ok(queued)
            }
            Joined::Full(key) => Err(Error::QueueFull {
                reservation_id: r.id,
                queue: key.to_string(),
                limit: self.policy.queue.max_length,
            }),
            Joined::Moved(now) => Ok(now),
        }
    }

    /// Whether `holds` are refused without a Try: a resource with a waitlist this process
    /// knows of (nobody gets ahead of it), or a sold-out hint (waited for while another
    /// Reserve asks about a lapsed one, `sold_out`). `Err`: the refusal, and the holds whose
    /// queues a Reserve with `queue` joins instead; `Ok`: this Reserve's probe of lapsed
    /// hints, if it is one, to hold until its placement has ended.
    pub(super) async fn admit(
        &self,
        holds: &[Hold],
    ) -> Result<Option<Probe>, (SoldOutHit, Vec<Hold>)> {
        if let Some(key) = self.waitlist.queued(holds) {
            let refused: Vec<Hold> = holds.iter().filter(|h| key.holds(h)).cloned().collect();
            let hit = SoldOutHit {
                quantity: refused.iter().map(|h| h.quantity).min().unwrap_or(1),
                participant: key.participant,
                resource: key.resource,
                reason: "reservations are waiting for it in its waitlist; a Reserve with queue \
                         joins the end of it"
                    .into(),
                age: Duration::ZERO,
            };
            return Err((hit, refused));
        }
        self.sold_out.admit(holds).await.map_err(|hit| {
            let refused = holds
                .iter()
                .filter(|h| h.participant == hit.participant && h.resource == hit.resource)
                .cloned()
                .collect();
            (hit, refused)
        })
    }

    /// Answers `r` with where it waits, while it is `QUEUED`.
    pub(super) async fn with_queue(&self, mut r: Reservation) -> Result<Reservation, Error> {
        if r.stored_state == State::Queued {
            r.queue = self.store.queue_place(r.id).await?;
        }
        Ok(r)
    }

    /// A page of `key`'s queue, in offer order (Admin `ListQueue`).
    pub async fn list_queue(
        &self,
        key: &QueueKey,
        after: i64,
        limit: u32,
    ) -> Result<QueuePage, Error> {
        Ok(self.store.list_queue(key, after, limit).await?)
    }

    /// The offer loop: offers each queue this process released units of as soon as it did,
    /// and every queue (ending the waits that are over) every `--queue-sweep`, until `stop`.
    /// Each pass runs in a task of its own: a pass that panics (a bug in an offer's path) is
    /// logged like a failed one and the loop goes on; the offer it abandoned returns to its
    /// queues when its lease runs out (recovery), and a later pass offers it again.
    pub(crate) async fn run_offers(self, mut stop: watch::Receiver<bool>) {
        let mut sweep = tokio::time::interval(self.policy.queue.sweep);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let everything = tokio::select! {
                _ = sweep.tick() => true,
                () = self.waitlist.wake.notified() => false,
                _ = stop.changed() => return,
            };
            let this = self.clone();
            match tokio::spawn(async move { this.offer_pass(everything).await }).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "waitlist pass failed; the next sweep retries");
                }
                Err(e) => {
                    tracing::error!(error = %e, "waitlist pass panicked; the next sweep retries");
                }
            }
        }
    }

    /// One pass: with `everything`, the waits that are over end and every queue is offered;
    /// otherwise only the queues released since the last pass.
    pub(super) async fn offer_pass(&self, everything: bool) -> Result<(), Error> {
        let _turn = self.waitlist.passes.lock().await;
        // Each queue with the units released for it; `None`: unknown (a sweep).
        let mut keys: BTreeMap<QueueKey, Option<i64>> = self
            .waitlist
            .take_released()
            .into_iter()
            .map(|(k, n)| (k, Some(n)))
            .collect();
        if everything {
            for r in self.store.end_waits(END_WAITS_PER_SWEEP).await? {
                entered(&r, State::Rejected);
                crate::telemetry::ops::queue_offer("wait_ended");
            }
            let queues = self.store.queues().await?;
            crate::telemetry::ops::queue_lengths(&queues);
            let found: BTreeSet<QueueKey> = queues.into_iter().map(|(k, _)| k).collect();
            for key in &found {
                keys.insert(key.clone(), None);
            }
            self.waitlist.prune_join_turns(&found);
            *self.waitlist.known() = found;
        }
        for (key, units) in keys {
            self.offer_queue(&key, units).await?;
        }
        Ok(())
    }

    /// Offers `key`'s queue what is free now: the oldest waiting reservation first. A refusal
    /// of one that asked for this resource alone says that much is not free: later ones are
    /// tried only if they ask for less (what is left may fit them); one refused for another
    /// resource says nothing of this one. With `units` known (a release), offers stop once
    /// that many are placed.
    async fn offer_queue(&self, key: &QueueKey, mut units: Option<i64>) -> Result<(), Error> {
        if !self.store.lease_queue(key, self.lease()).await? {
            return Ok(());
        }
        faults::store("coord.offer.before")?;
        let heads = self.store.queue_heads(key, HEADS_PER_PASS).await?;
        if heads.is_empty() {
            self.waitlist.known().remove(key);
            return Ok(());
        }
        let mut refused_at: Option<i64> = None;
        for QueueHead {
            id,
            quantity,
            since,
        } in heads
        {
            if refused_at.is_some_and(|q| quantity >= q) {
                continue;
            }
            match self.offer(key, id, since).await? {
                Offer::Placed => {
                    crate::telemetry::ops::queue_offer("placed");
                    if let Some(left) = &mut units {
                        *left -= quantity;
                        if *left <= 0 {
                            break;
                        }
                    }
                }
                Offer::Refused { alone } => {
                    crate::telemetry::ops::queue_offer("refused");
                    if alone {
                        refused_at = Some(refused_at.map_or(quantity, |q| q.min(quantity)));
                        if quantity <= 1 {
                            break;
                        }
                    }
                }
                Offer::Gone => {}
            }
        }
        Ok(())
    }

    /// One offer: the whole reservation placed again in canonical order; all held -> `HELD`
    /// (`RESERVATION_HELD` with `from_queue`), else back in its queues.
    async fn offer(
        &self,
        key_of_offer: &QueueKey,
        id: uuid::Uuid,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Offer, Error> {
        let Some(r) = self.store.begin_offer(id, self.lease()).await? else {
            return Ok(Offer::Gone);
        };
        entered(&r, State::Trying);
        let placement = self.place_in_order(&r).await?;
        if placement.failure.is_none() {
            faults::store("coord.offer.placed")?;
            let held = self.store.record_held(r.id, &placement.reports).await?;
            entered(&held, State::Held);
            crate::telemetry::ops::queue_waited(since);
            return Ok(if held.stored_state == State::Held {
                Offer::Placed
            } else {
                Offer::Gone
            });
        }
        // The refusing participant's holds join their queues (a participant that could not
        // be reached refused nothing: the reservation keeps its places only).
        let refused = refused_holds(&r, &placement.reports).unwrap_or_default();
        let back = JoinQueue {
            id: r.id,
            reports: &placement.reports,
            holds: &refused,
            wait: Duration::ZERO,
            max_length: u32::MAX,
        };
        if let Joined::Queued(back) = self.store.join_queue(&back).await?
            && back.stored_state == State::Cancelling
        {
            self.drive_release(back).await?;
        }
        let alone = r.branches.iter().all(|b| key_of_offer.holds(&b.hold));
        Ok(Offer::Refused { alone })
    }
}

impl Coordinator {
    /// Recovery of an offer whose offerer stopped while placing: every branch that may hold
    /// is released and the reservation waits in its queues again (their places kept).
    pub(super) async fn requeue_abandoned_offer(
        &self,
        r: Reservation,
    ) -> Result<Reservation, Error> {
        tracing::warn!(reservation_id = %r.id, "an offer from a waitlist was abandoned while placing holds; releasing them and queueing it again");
        let reports =
            super::recovery::abandoned_placement(&r, "the coordinator stopped while placing holds");
        let back = JoinQueue {
            id: r.id,
            reports: &reports,
            holds: &[],
            wait: Duration::ZERO,
            max_length: u32::MAX,
        };
        match self.store.join_queue(&back).await? {
            Joined::Queued(back) => self.drive_release(back).await,
            Joined::Moved(now) => Ok(now),
            Joined::Full(_) => Ok(r),
        }
    }
}
