//! Recording what a participant call came to, where both databases do it the same way and no
//! group commit is involved: a placement that stopped (a Try refused, or its outcome unknown)
//! and a refund call. Each is one write transaction answering the reservation as it is
//! afterwards. (Held placements and Confirm/Cancel fan-outs are recorded per backend:
//! PostgreSQL group-commits them.)

use sqlx::Pool;
use uuid::Uuid;

use super::sql::ReservationSql;
use super::{BranchReport, RefundAnswer, StoreError};
use crate::db::WriteTransaction;
use crate::domain::policy::Backoff;
use crate::domain::{Rejection, Reservation};

/// [`crate::store::Store::record_rejected`].
pub(crate) async fn record_rejected<DB: ReservationSql>(
    pool: &Pool<DB>,
    id: Uuid,
    rejection: Option<&Rejection>,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    if DB::reject_trying(&mut tx, id, rejection).await? {
        DB::apply_reports(&mut tx, id, reports).await?;
    }
    let after = DB::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}

/// [`crate::store::Store::record_refund_attempt`].
pub(crate) async fn record_refund_attempt<DB: ReservationSql>(
    pool: &Pool<DB>,
    id: Uuid,
    answer: &RefundAnswer,
    backoff: Backoff,
) -> Result<Reservation, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    DB::record_refund_attempt(&mut tx, id, answer, backoff).await?;
    let after = DB::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}
