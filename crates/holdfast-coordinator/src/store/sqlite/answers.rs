//! Recording participants' answers on SQLite: `record_held` (`TRYING -> HELD`),
//! `record_rejected` (a stopped placement: `TRYING -> CANCELLING`, or `-> REJECTED` when
//! nothing was placed) and `record_phase` (a Confirm or Cancel fan-out's answers, finishing it
//! or scheduling its retry). One write transaction per call; concurrent calls share a COMMIT
//! through the pool's writer (`holdfast-serve`'s group commit), not through a batch statement.

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::rows::micros;
use crate::domain::policy::Backoff;
use crate::domain::{Rejection, Reservation, State};
use crate::store::outcome::placed_nothing;
use crate::store::sql::ReservationSql;
use crate::store::{BranchReport, PhaseRecorded, StoreError};

/// Moves a reservation `from -> to` if it is still in `from`; the row count decides.
async fn transition(
    conn: &mut SqliteConnection,
    id: Uuid,
    from: State,
    to: State,
) -> Result<bool, StoreError> {
    let done = sqlx::query(concat!(
        "UPDATE reservations SET state = ?3, version = version + 1, updated_at = ",
        sqlite_now_us!(),
        " WHERE id = ?1 AND state = ?2"
    ))
    .bind(id)
    .bind(from.as_str())
    .bind(to.as_str())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// [`crate::store::Store::record_held`].
pub(super) async fn record_held(
    pool: &SqlitePool,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    if transition(&mut tx, id, State::Trying, State::Held).await? {
        Sqlite::apply_reports(&mut tx, id, reports).await?;
        sqlx::query("UPDATE reservations SET lease_owner = NULL, lease_until = NULL WHERE id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    let after = Sqlite::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}

/// [`crate::store::Store::record_rejected`].
pub(super) async fn record_rejected(
    pool: &SqlitePool,
    id: Uuid,
    rejection: Option<&Rejection>,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let finished = placed_nothing(reports);
    let mut tx = Sqlite::begin_write(pool).await?;
    let moved = sqlx::query(concat!(
        "UPDATE reservations SET \
         state = CASE WHEN ?5 THEN 'REJECTED' ELSE 'CANCELLING' END, \
         release_outcome = 'REJECTED', \
         rejection_participant = ?2, rejection_resource = ?3, rejection_reason = ?4, \
         lease_owner = CASE WHEN ?5 THEN NULL ELSE lease_owner END, \
         lease_until = CASE WHEN ?5 THEN NULL ELSE lease_until END, \
         version = version + 1, updated_at = ",
        sqlite_now_us!(),
        " WHERE id = ?1 AND state = 'TRYING'"
    ))
    .bind(id)
    .bind(rejection.map(|r| r.participant.as_str()))
    .bind(rejection.map(|r| r.resource.as_str()))
    .bind(rejection.map(|r| r.reason.as_str()))
    .bind(finished)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if moved == 1 {
        Sqlite::apply_reports(&mut tx, id, reports).await?;
    }
    let after = Sqlite::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(after)
}

/// [`crate::store::Store::record_phase`].
pub(super) async fn record_phase(
    pool: &SqlitePool,
    id: Uuid,
    from: State,
    reports: &[BranchReport],
    finish: Option<State>,
    backoff: Backoff,
) -> Result<PhaseRecorded, StoreError> {
    // The write lock orders two drivers of one reservation: they record one after the other.
    let mut tx = Sqlite::begin_write(pool).await?;
    let mut finished = false;
    let still_there: Option<String> =
        sqlx::query_scalar("SELECT state FROM reservations WHERE id = ?1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    if still_there.as_deref() == Some(from.as_str()) {
        Sqlite::apply_reports(&mut tx, id, reports).await?;
        finished = match finish {
            Some(to) => transition(&mut tx, id, from, to).await?,
            None => false,
        };
        if finished && finish == Some(State::Failed) {
            // A lost hold voids the sale: any payment is refunded.
            Sqlite::record_refund(&mut tx, id, lost_hold_refund_reason!()).await?;
        }
        // Finished or not, this driver is done with it: free the lease. Unfinished work
        // waits out its backoff (with jitter, so a herd of retries spreads out).
        sqlx::query(concat!(
            "UPDATE reservations SET lease_owner = NULL, lease_until = NULL, ",
            backoff_next_attempt!("?2", "?3", "?4"),
            " WHERE id = ?1"
        ))
        .bind(id)
        .bind(finished)
        .bind(micros(backoff.base) as f64)
        .bind(micros(backoff.cap) as f64)
        .execute(&mut *tx)
        .await?;
    }
    let reservation = Sqlite::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(PhaseRecorded {
        reservation,
        finished,
    })
}
