//! A late payment on a reservation whose holds were all released, written once for both
//! databases: the retake begins (a new generation of branches), then finishes (every hold was
//! placed again: confirm) or fails (release what was re-taken, refund the payment). Each step
//! is one write transaction answering the reservation as it is afterwards.

use uuid::Uuid;

use super::sql::ReservationSql;
use super::{BranchReport, StoreError};
use crate::db::WriteTransaction;
use crate::domain::Reservation;

/// [`crate::store::Store::begin_retake`].
pub(crate) async fn begin_retake<DB: ReservationSql>(
    pool: &DB::Pool,
    id: Uuid,
) -> Result<Reservation, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let Some(generation) = DB::renew_generation(&mut tx, id).await? else {
        // No longer EXPIRED: answer it as it is.
        let current = DB::load_existing(&mut tx, id).await;
        tx.rollback().await?;
        return current;
    };
    DB::insert_retake_branches(&mut tx, id, generation).await?;
    let after = DB::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}

/// [`crate::store::Store::finish_retake`].
pub(crate) async fn finish_retake<DB: ReservationSql>(
    pool: &DB::Pool,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    if DB::honor_retake(&mut tx, id).await? {
        DB::apply_reports(&mut tx, id, reports).await?;
    }
    let after = DB::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}

/// [`crate::store::Store::fail_retake`].
pub(crate) async fn fail_retake<DB: ReservationSql>(
    pool: &DB::Pool,
    id: Uuid,
    reports: &[BranchReport],
    reason: &str,
) -> Result<Reservation, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    if DB::release_retake(&mut tx, id).await? {
        DB::apply_reports(&mut tx, id, reports).await?;
        DB::record_refund(&mut tx, id, reason).await?;
    }
    let after = DB::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}
