//! Recording what a participant call came to, where both databases do it the same way and no
//! group commit is involved: a refund call, one write transaction answering the reservation as
//! it is afterwards; and the rule both backends follow for a placement that stopped
//! (`placed_nothing`). (Placements and Confirm/Cancel fan-outs are recorded per backend:
//! PostgreSQL group-commits them.)

use uuid::Uuid;

use super::sql::ReservationSql;
use super::{BranchReport, RefundAnswer, StoreError};
use crate::db::WriteTransaction;
use crate::domain::policy::Backoff;
use crate::domain::{BranchState, Reservation};

/// Whether a stopped placement's reports say nothing was placed: at least one report, and
/// every one a refusal (a participant that refused holds nothing; a branch without a report
/// was never tried). Such a placement is recorded `REJECTED` at once: nothing to release.
pub(crate) fn placed_nothing(reports: &[BranchReport]) -> bool {
    !reports.is_empty() && reports.iter().all(|r| r.state == BranchState::Rejected)
}

/// [`crate::store::Store::record_refund_attempt`].
pub(crate) async fn record_refund_attempt<DB: ReservationSql>(
    pool: &DB::Pool,
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
