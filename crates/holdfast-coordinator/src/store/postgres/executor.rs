//! PostgreSQL's executor of the decided writes `store/decide.rs` describes ([`LeaveHeld`]):
//! one statement, run for one write inside the locked flow's transaction or for many at once
//! by the group commit (`group_commit.rs`), each row guarded by its own version. What feeds
//! it without a lock is `store/without_lock.rs`.

use std::collections::HashMap;

use sqlx::postgres::PgConnection;
use uuid::Uuid;

use super::rows::{ReservationRow, millis};
use crate::domain::{Reservation, State};
use crate::store::StoreError;
use crate::store::sql::LeaveHeld;

/// The one UPDATE of a decided move out of `HELD` (Confirm: `CONFIRMING`; Cancel:
/// `CANCELLING`), for distinct reservations as parallel arrays: `$1` ids, `$2` the versions
/// judged (NULL: the row is locked by the transaction), `$3` the state each moves to, `$4`/`$5`
/// a Cancel's release outcome and reason, `$6`/`$7` lease owner and ms, `$8`-`$11` a
/// Confirm's payment (NULL: none). A row read without a lock is guarded by its own version, and
/// every row by the database clock, the arbiter of "before `expires_at`", so one that changed
/// or lapsed misses alone. The lease is taken in the same UPDATE (`HELD` rows carry none). A
/// payment is kept if one is recorded, and refused if another reservation recorded it as a
/// further payment. Rows are found through the primary key (`id = ANY`): `state || ''` keeps
/// the partial indexes of live reservations, which a generic plan made on a small table would
/// otherwise walk, out of the plan.
///
/// Spelled once, instantiated twice by how each array is read (`$open`, `$close` around it):
/// whole, for many writes ([`LEAVE_HELD_MANY`]); or as `ARRAY[(a)[1]]`, for one
/// ([`LEAVE_HELD_ONE`]), whose length the planner then knows without the values, so it
/// settles on a generic plan rather than planning every call afresh.
macro_rules! leave_held {
    ($open:literal, $close:literal) => {
        concat!(
            "UPDATE reservations SET state = judged.to_state, version = version + 1, \
             updated_at = clock_timestamp(), lease_owner = judged.lease_to, \
             lease_until = clock_timestamp() + judged.lease_ms * interval '1 millisecond', \
             release_outcome = CASE WHEN judged.to_state = 'CONFIRMING' THEN release_outcome \
                                    ELSE judged.outcome END, \
             cancel_reason = CASE WHEN judged.to_state = 'CONFIRMING' THEN cancel_reason \
                                  ELSE judged.reason END, \
             payment_participant = coalesce(payment_participant, judged.pay_participant), \
             payment_ref = coalesce(payment_ref, judged.pay_ref), \
             payment_amount_minor = coalesce(payment_amount_minor, judged.pay_amount), \
             payment_currency = coalesce(payment_currency, judged.pay_currency) \
             FROM unnest(",
            $open,
            "$1::uuid[]",
            $close,
            ", ",
            $open,
            "$2::bigint[]",
            $close,
            ", ",
            $open,
            "$3::text[]",
            $close,
            ", ",
            $open,
            "$4::text[]",
            $close,
            ", ",
            $open,
            "$5::text[]",
            $close,
            ", ",
            $open,
            "$6::uuid[]",
            $close,
            ", ",
            $open,
            "$7::bigint[]",
            $close,
            ", ",
            $open,
            "$8::text[]",
            $close,
            ", ",
            $open,
            "$9::text[]",
            $close,
            ", ",
            $open,
            "$10::bigint[]",
            $close,
            ", ",
            $open,
            "$11::text[]",
            $close,
            ") AS judged(write_id, judged_version, to_state, outcome, reason, lease_to, \
                         lease_ms, pay_participant, pay_ref, pay_amount, pay_currency) \
             WHERE id = ANY(",
            $open,
            "$1::uuid[]",
            $close,
            ") AND id = judged.write_id \
               AND (judged.judged_version IS NULL OR version = judged.judged_version) \
               AND state || '' = 'HELD' AND clock_timestamp() < expires_at \
               AND (judged.pay_ref IS NULL OR NOT EXISTS ( \
                    SELECT 1 FROM extra_payments x \
                    WHERE x.payment_participant = judged.pay_participant \
                      AND x.payment_ref = judged.pay_ref)) \
             RETURNING ",
            reservation_columns!()
        )
    };
}

/// [`leave_held!`] for many writes.
const LEAVE_HELD_MANY: &str = leave_held!("", "");

/// [`leave_held!`] for one write.
const LEAVE_HELD_ONE: &str = leave_held!("ARRAY[(", ")[1]]");

/// Runs [`leave_held!`] for `writes` (distinct reservations) on `conn`: the rows moved, by id
/// (one that missed is absent), each without its branches.
pub(super) async fn leave_held(
    conn: &mut PgConnection,
    writes: &[&LeaveHeld],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let column = |f: fn(&LeaveHeld) -> Option<&str>| -> Vec<Option<&str>> {
        writes.iter().map(|w| f(w)).collect()
    };
    let ids: Vec<Uuid> = writes.iter().map(|w| w.id).collect();
    let versions: Vec<Option<i64>> = writes.iter().map(|w| w.guard.version()).collect();
    let to: Vec<&str> = writes.iter().map(|w| w.to.as_str()).collect();
    let outcomes = column(|w| w.release_outcome.map(State::as_str));
    let reasons = column(|w| w.cancel_reason.as_deref());
    let owners: Vec<Uuid> = writes.iter().map(|w| w.lease.owner).collect();
    let lease_ms: Vec<i64> = writes.iter().map(|w| millis(w.lease.duration)).collect();
    let participants = column(|w| w.payment.as_ref().map(|p| p.participant.as_str()));
    let refs = column(|w| w.payment.as_ref().map(|p| p.payment_ref.as_str()));
    let amounts: Vec<Option<i64>> = writes
        .iter()
        .map(|w| w.payment.as_ref().map(|p| p.amount_minor))
        .collect();
    let currencies = column(|w| w.payment.as_ref().map(|p| p.currency.as_str()));
    let statement = if writes.len() == 1 {
        LEAVE_HELD_ONE
    } else {
        LEAVE_HELD_MANY
    };
    let rows = sqlx::query_as::<_, ReservationRow>(statement)
        .bind(&ids)
        .bind(&versions)
        .bind(&to)
        .bind(&outcomes)
        .bind(&reasons)
        .bind(&owners)
        .bind(&lease_ms)
        .bind(&participants)
        .bind(&refs)
        .bind(&amounts)
        .bind(&currencies)
        .fetch_all(&mut *conn)
        .await?;
    let mut moved = HashMap::with_capacity(rows.len());
    for row in rows {
        let r = row.into_domain()?;
        moved.insert(r.id, r);
    }
    Ok(moved)
}
