//! The statements of a Confirm of a `HELD` reservation (`HELD -> CONFIRMING`, version-guarded):
//! with or without a payment, and without one for many reservations at once. Used by the
//! unlocked fast path (`unlocked.rs`) and by the group commit that batches it
//! (`group_commit.rs`).

use std::collections::HashMap;

use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::rows::{ReservationRow, millis};
use crate::domain::Reservation;
use crate::store::{StoreError, WorkLease};

/// `HELD -> CONFIRMING` with the lease (`$3`, `$4` ms), guarded by the version judged (`$2`)
/// and the database clock; the two Confirm statements below differ only in the payment.
macro_rules! confirm_held {
    ($set:literal, $check:literal) => {
        concat!(
            "UPDATE reservations SET state = 'CONFIRMING', version = version + 1, \
             updated_at = clock_timestamp(), lease_owner = $3, \
             lease_until = clock_timestamp() + $4 * interval '1 millisecond'",
            $set,
            " WHERE id = $1 AND version = $2 AND state = 'HELD' \
               AND clock_timestamp() < expires_at",
            $check,
            " RETURNING ",
            reservation_columns!()
        )
    };
}

/// A Confirm without a payment (the common case). Two statements rather than one with NULL
/// payment parameters: a custom plan folds those away, so PostgreSQL planned that one afresh
/// on every call (~0.1 ms of CPU); each of these settles on a generic plan.
pub(super) const CONFIRM_UNPAID: &str = confirm_held!("", "");

/// The same for many distinct reservations at once (`$1` ids, `$2` the versions judged, `$3`
/// lease owners, `$4` lease ms, parallel arrays): each row is guarded by its own version, so
/// one that changed misses alone. Rows are found through the primary key (`id = ANY`), as
/// `record_held`'s are: `state || ''` keeps the partial indexes of live reservations, which a
/// generic plan made on a small table would otherwise walk, out of the plan.
const CONFIRM_UNPAID_MANY: &str = concat!(
    "UPDATE reservations SET state = 'CONFIRMING', version = version + 1, \
     updated_at = clock_timestamp(), lease_owner = judged.lease_to, \
     lease_until = clock_timestamp() + judged.lease_ms * interval '1 millisecond' \
     FROM unnest($1::uuid[], $2::bigint[], $3::uuid[], $4::bigint[]) \
          AS judged(confirm_id, judged_version, lease_to, lease_ms) \
     WHERE id = ANY($1::uuid[]) AND id = judged.confirm_id \
       AND version = judged.judged_version AND state || '' = 'HELD' \
       AND clock_timestamp() < expires_at \
     RETURNING ",
    reservation_columns!()
);

/// A Confirm without a payment of a `HELD` reservation, judged on `version`.
#[derive(Debug, Clone, Copy)]
pub(super) struct UnpaidConfirm {
    pub id: Uuid,
    pub version: i64,
    pub lease: WorkLease,
}

/// One [`UnpaidConfirm`] alone: the reservation's row as confirmed, `None` when the guard
/// missed (the locked path decides then).
pub(super) async fn confirm_unpaid_alone(
    pool: &PgPool,
    confirm: UnpaidConfirm,
) -> Result<Option<Reservation>, StoreError> {
    sqlx::query_as::<_, ReservationRow>(CONFIRM_UNPAID)
        .bind(confirm.id)
        .bind(confirm.version)
        .bind(confirm.lease.owner)
        .bind(millis(confirm.lease.duration))
        .fetch_optional(pool)
        .await?
        .map(ReservationRow::into_domain)
        .transpose()
}

/// Many [`UnpaidConfirm`]s of distinct reservations in one statement: the rows confirmed, by
/// id (one that missed is absent).
pub(super) async fn confirm_unpaid_many(
    pool: &PgPool,
    confirms: &[UnpaidConfirm],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let ids: Vec<Uuid> = confirms.iter().map(|c| c.id).collect();
    let versions: Vec<i64> = confirms.iter().map(|c| c.version).collect();
    let owners: Vec<Uuid> = confirms.iter().map(|c| c.lease.owner).collect();
    let lease_ms: Vec<i64> = confirms.iter().map(|c| millis(c.lease.duration)).collect();
    let rows = sqlx::query_as::<_, ReservationRow>(CONFIRM_UNPAID_MANY)
        .bind(&ids)
        .bind(&versions)
        .bind(&owners)
        .bind(&lease_ms)
        .fetch_all(pool)
        .await?;
    let mut confirmed = HashMap::with_capacity(rows.len());
    for row in rows {
        let r = row.into_domain()?;
        confirmed.insert(r.id, r);
    }
    Ok(confirmed)
}

/// A Confirm with a payment (`$5`-`$8`), unless another reservation recorded it as a further
/// payment already.
pub(super) const CONFIRM_PAID: &str = confirm_held!(
    ", payment_participant = coalesce(payment_participant, $5), \
     payment_ref = coalesce(payment_ref, $6), \
     payment_amount_minor = coalesce(payment_amount_minor, $7), \
     payment_currency = coalesce(payment_currency, $8)",
    " AND NOT EXISTS (SELECT 1 FROM extra_payments \
                      WHERE payment_participant = $5 AND payment_ref = $6)"
);
