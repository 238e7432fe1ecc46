//! A Confirm/Cancel decided without a row lock, the same way on both databases: read the row
//! (or take the image this process recorded when its holds were placed, [`RecentlyHeld`]),
//! judge it in `store/decide.rs`, and run the one write description ([`LeaveHeld`]) guarded by
//! the version read - on PostgreSQL through its group commit and executor, on SQLite as one
//! statement on the writer. Any change in between makes the write miss; then, as for every
//! rarer verdict, the locked flow (`decide::decide_locked`) decides.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use uuid::Uuid;

use super::decide::{self, Unlocked, payment_conflict};
use super::sql::{LeaveHeld, PaymentSql};
use super::{Decided, StoreError, WorkLease};
use crate::domain::PresentedToken;
use crate::domain::{Decision, Reservation, State, Verdict};

/// What a database does for a decision taken without a lock.
#[async_trait]
pub(crate) trait WithoutLock: Sync {
    /// The reservation as stored, read without a lock.
    async fn read_unlocked(&self, id: Uuid) -> Result<Option<Reservation>, StoreError>;

    /// Runs `write` (guarded by the version it carries): the after-image when it landed,
    /// `None` when it missed.
    async fn leave_held_guarded(&self, write: LeaveHeld)
    -> Result<Option<Reservation>, StoreError>;

    /// What this process last recorded `HELD`.
    fn recently_held(&self) -> &RecentlyHeld;
}

/// The reservations this process last recorded as `HELD`, as recorded, so their Confirm or
/// Cancel can skip reading the row: the write is guarded by the cached `version`, so a stale
/// entry only makes it miss (then the row is read and locked). Bounded: the oldest entries go
/// first.
#[derive(Debug, Default)]
pub(crate) struct RecentlyHeld {
    inner: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    by_id: HashMap<Uuid, Reservation>,
    order: VecDeque<Uuid>,
}

/// Most reservations remembered.
const RECENTLY_HELD: usize = 4096;

impl RecentlyHeld {
    /// Remembers `r` (a reservation just recorded `HELD`).
    fn put(&self, r: &Reservation) {
        let Ok(mut recent) = self.inner.lock() else {
            return;
        };
        while recent.order.len() >= RECENTLY_HELD {
            if let Some(old) = recent.order.pop_front() {
                recent.by_id.remove(&old);
            }
        }
        recent.order.push_back(r.id);
        recent.by_id.insert(r.id, r.clone());
    }

    /// Remembers what `record_held` answered, when it is `HELD` (a repeat may find the
    /// reservation moved on already).
    pub(crate) fn recorded(&self, recorded: &Result<Reservation, StoreError>) {
        if let Ok(r) = recorded
            && r.stored_state == State::Held
        {
            self.put(r);
        }
    }

    /// Takes the entry for `id`, if any (a decision uses it once).
    fn take(&self, id: Uuid) -> Option<Reservation> {
        self.inner.lock().ok()?.by_id.remove(&id)
    }
}

/// [`crate::store::Store::decide`] on either database: without a lock when the verdict allows
/// ([`decide_unlocked`]), otherwise - and when that write missed - under the row lock.
pub(crate) async fn decide<DB: PaymentSql>(
    db: &impl WithoutLock,
    pool: &DB::Pool,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &PresentedToken,
    decision: &Decision,
    lease: WorkLease,
) -> Result<Decided, StoreError> {
    if let Some(decided) = decide_unlocked(db, id, scope, presented_token, decision, lease).await? {
        return Ok(decided);
    }
    decide::decide_locked::<DB>(pool, id, scope, presented_token, decision, lease).await
}

/// A decision without a transaction: the image this process recorded, or the row read
/// without a lock, judged by [`decide::judge_unlocked`]; its write, if any, run through the
/// database with a version guard. `None`: the locked flow decides (a rarer verdict, or a write
/// that missed).
async fn decide_unlocked(
    db: &impl WithoutLock,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &PresentedToken,
    decision: &Decision,
    lease: WorkLease,
) -> Result<Option<Decided>, StoreError> {
    if matches!(decision, Decision::Extend { .. }) {
        return Ok(None);
    }
    let recently_held = db.recently_held();
    let cached = recently_held.take(id);
    let from_image = cached.is_some();
    let current = match cached {
        Some(r) => r,
        None => match db.read_unlocked(id).await? {
            Some(r) => r,
            None => return Ok(Some(Decided::NotFound)),
        },
    };
    match decide::judge_unlocked(
        &current,
        from_image,
        scope,
        presented_token,
        decision,
        lease,
    ) {
        Unlocked::Answered(decided) => {
            // A payment is checked before the decision is taken again: keep the image for it.
            if from_image
                && matches!(
                    &decided,
                    Decided::Judged {
                        verdict: Verdict::VerifyPayment,
                        ..
                    }
                )
            {
                recently_held.put(&current);
            }
            Ok(Some(decided))
        }
        Unlocked::Write { write, verdict } => match db.leave_held_guarded(write).await {
            // Another reservation recorded this payment first (the unique index decided).
            Err(e) if payment_conflict(&e) => Ok(Some(Decided::PaymentTaken)),
            Err(e) => Err(e),
            Ok(after) => Ok(after.map(|after| decide::answer_unlocked(verdict, current, after))),
        },
        Unlocked::Locked => Ok(None),
    }
}
