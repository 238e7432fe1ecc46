//! PostgreSQL's fast path for the common decisions (Confirm or Cancel of a `HELD`
//! reservation, a repeat, a refusal): no transaction, no row lock. The reservation is read
//! (or taken from the image this process recorded when its holds were placed,
//! [`RecentlyHeld`]), judged, and a Confirm or Cancel is applied by one UPDATE guarded by the
//! version it was judged on, answering with its after-image. Any change in between makes the
//! UPDATE miss; then, as for every rarer verdict, the locked flow (`store/decide.rs`) decides.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use uuid::Uuid;

use super::confirms::{CONFIRM_PAID, UnpaidConfirm};
use super::group_commit::GroupCommit;
use super::rows::{self, ReservationRow, millis};
use crate::domain::lifecycle;
use crate::domain::{Decision, Reservation, State, Verdict};
use crate::store::decide::{payment_conflict, snapshot_of};
use crate::store::{Decided, StoreError, WorkLease};

/// The reservations this process last recorded as `HELD`, as recorded, so their Confirm or
/// Cancel can skip reading the row: the decision is applied by an UPDATE guarded by the cached
/// `version`, so a stale entry only makes it miss (then the row is read and locked). Bounded:
/// the oldest entries go first.
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

/// The common decisions without a transaction: read the row (or take the image this process
/// recorded when it placed the holds), judge it, and apply a Confirm or Cancel of a HELD
/// reservation with one conditional UPDATE guarded by that image's version, so any change
/// since makes it miss (then the locked path judges again). A refusal or a repeat changes
/// nothing, so the read answers it. A Confirm without a payment goes through the group
/// commit: concurrent ones share a statement. `None`: the locked path decides
/// (lapsed holds, late payments, refunds, Extend, a missed UPDATE).
pub(super) async fn decide_unlocked(
    group_commit: &GroupCommit,
    recently_held: &RecentlyHeld,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &str,
    decision: &Decision,
    lease: WorkLease,
) -> Result<Option<Decided>, StoreError> {
    if matches!(decision, Decision::Extend { .. }) {
        return Ok(None);
    }
    let pool = group_commit.pool();
    // This process recorded it HELD: decide on that image (a stale one makes the guarded
    // UPDATE below miss), else read the row.
    let cached = recently_held.take(id);
    let from_cache = cached.is_some();
    // The connection of the read, kept for a write of this call alone.
    let mut read_on = None;
    let current = match cached {
        Some(r) => r,
        None => {
            let conn = read_on.insert(pool.acquire().await?);
            match rows::load(conn, id, false).await? {
                Some(r) => r,
                None => return Ok(Some(Decided::NotFound)),
            }
        }
    };
    if !current.visible_to(scope) {
        return Ok(Some(Decided::NotFound));
    }
    if !current.token.verifies(presented_token) {
        return Ok(Some(Decided::TokenMismatch));
    }
    let verdict = lifecycle::decide(&snapshot_of(&current, decision), decision);
    if from_cache && !matches!(verdict, Verdict::Transition { .. } | Verdict::VerifyPayment) {
        return Ok(None);
    }
    let after = match (&verdict, decision) {
        // The payment is checked before the decision is taken again: keep the image for it.
        (Verdict::VerifyPayment, _) => {
            if from_cache {
                recently_held.put(&current);
            }
            return Ok(Some(Decided::Judged {
                verdict,
                reservation: Box::new(current),
                leased: false,
            }));
        }
        (Verdict::AlreadyDone | Verdict::Refuse(_), _) => {
            return Ok(Some(Decided::Judged {
                verdict,
                reservation: Box::new(current),
                leased: false,
            }));
        }
        // The database clock at the UPDATE is the arbiter of "before expires_at". HELD rows
        // carry no lease: the deciding instance takes it in the same UPDATE.
        (
            Verdict::Transition {
                to: State::Confirming,
                ..
            },
            Decision::Confirm { payment: None, .. },
        ) => {
            drop(read_on);
            let confirm = UnpaidConfirm {
                id,
                version: current.version,
                lease,
            };
            group_commit.confirm_unpaid(confirm).await?
        }
        (
            Verdict::Transition {
                to: State::Confirming,
                ..
            },
            Decision::Confirm {
                payment: Some(payment),
                ..
            },
        ) => {
            let mut conn = match read_on {
                Some(conn) => conn,
                None => pool.acquire().await?,
            };
            let confirmed = sqlx::query_as::<_, ReservationRow>(CONFIRM_PAID)
                .bind(id)
                .bind(current.version)
                .bind(lease.owner)
                .bind(millis(lease.duration))
                .bind(payment.participant.as_str())
                .bind(payment.payment_ref.as_str())
                .bind(payment.amount_minor)
                .bind(payment.currency.as_str())
                .fetch_optional(&mut *conn)
                .await;
            // Another reservation recorded this payment first (the unique index decided). A
            // payment recorded as another's further payment makes the UPDATE miss: the locked
            // path tells.
            match confirmed.map_err(StoreError::from) {
                Err(e) if payment_conflict(&e) => return Ok(Some(Decided::PaymentTaken)),
                other => other?.map(ReservationRow::into_domain).transpose()?,
            }
        }
        (
            Verdict::Transition {
                to,
                release_outcome,
            },
            Decision::Cancel { reason },
        ) => {
            let mut conn = match read_on {
                Some(conn) => conn,
                None => pool.acquire().await?,
            };
            sqlx::query_as::<_, ReservationRow>(concat!(
                "UPDATE reservations SET state = $3, release_outcome = $4, cancel_reason = $5, \
             version = version + 1, updated_at = clock_timestamp(), lease_owner = $6, \
             lease_until = clock_timestamp() + $7 * interval '1 millisecond' \
             WHERE id = $1 AND version = $2 AND state = 'HELD' \
               AND clock_timestamp() < expires_at \
             RETURNING ",
                reservation_columns!()
            ))
            .bind(id)
            .bind(current.version)
            .bind(to.as_str())
            .bind(release_outcome.map(State::as_str))
            .bind(reason.as_deref())
            .bind(lease.owner)
            .bind(millis(lease.duration))
            .fetch_optional(&mut *conn)
            .await?
            .map(ReservationRow::into_domain)
            .transpose()?
        }
        _ => return Ok(None),
    };
    let Some(mut after) = after else {
        return Ok(None);
    };
    // A decision changes the reservation row only; its branches are as read.
    after.branches = current.branches;
    Ok(Some(Decided::Judged {
        verdict,
        reservation: Box::new(after),
        leased: true,
    }))
}
