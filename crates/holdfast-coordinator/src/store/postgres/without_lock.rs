//! A Confirm/Cancel decided without a row lock (PostgreSQL): read the row (or take the image
//! this process recorded when its holds were placed, [`RecentlyHeld`]), judge it in
//! `store/decide.rs`, and run the same write description through group commit and the
//! executor (`executor.rs`), guarded by the version read. Any change in between makes the
//! write miss; then, as for every rarer verdict, the locked flow decides.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use uuid::Uuid;

use super::group_commit::GroupCommit;
use super::rows;
use crate::domain::PresentedToken;
use crate::domain::{Decision, Reservation, Verdict};
use crate::store::decide::{self, Unlocked, payment_conflict};
use crate::store::{Decided, StoreError, WorkLease};

/// The reservations this process last recorded as `HELD`, as recorded, so their Confirm or
/// Cancel can skip reading the row: the write is guarded by the cached `version`, so a stale
/// entry only makes it miss (then the row is read and locked). Bounded: the oldest entries go
/// first.
#[derive(Debug, Default)]
pub(super) struct RecentlyHeld {
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
    pub(super) fn put(&self, r: &Reservation) {
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

    /// Takes the entry for `id`, if any (a decision uses it once).
    fn take(&self, id: Uuid) -> Option<Reservation> {
        self.inner.lock().ok()?.by_id.remove(&id)
    }
}

/// A decision without a transaction: the image this process recorded, or the row read
/// without a lock, judged by [`decide::judge_unlocked`]; its write, if any, run through the
/// group commit with a version guard. `None`: the locked flow decides (a rarer verdict, or a
/// write that missed).
pub(super) async fn decide_unlocked(
    group_commit: &GroupCommit,
    recently_held: &RecentlyHeld,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &PresentedToken,
    decision: &Decision,
    lease: WorkLease,
) -> Result<Option<Decided>, StoreError> {
    if matches!(decision, Decision::Extend { .. }) {
        return Ok(None);
    }
    let cached = recently_held.take(id);
    let from_image = cached.is_some();
    let current = match cached {
        Some(r) => r,
        None => {
            let mut conn = group_commit.pool().acquire().await?;
            match rows::load(&mut conn, id, false).await? {
                Some(r) => r,
                None => return Ok(Some(Decided::NotFound)),
            }
        }
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
        Unlocked::Write { write, verdict } => match group_commit.leave_held(write).await {
            // Another reservation recorded this payment first (the unique index decided).
            Err(e) if payment_conflict(&e) => Ok(Some(Decided::PaymentTaken)),
            Err(e) => Err(e),
            Ok(after) => Ok(after.map(|after| decide::answer_unlocked(verdict, current, after))),
        },
        Unlocked::Locked => Ok(None),
    }
}
