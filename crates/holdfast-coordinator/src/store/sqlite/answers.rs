//! Recording participants' answers on SQLite: `record_held` (`TRYING -> HELD`),
//! `record_rejected` (a stopped placement: `TRYING -> CANCELLING`, or `-> REJECTED` when
//! nothing was placed) and `record_phase` (a Confirm or Cancel fan-out's answers, finishing it
//! or scheduling its retry). One write transaction per call, its opening sent ahead of its one
//! query; concurrent calls share a COMMIT through the pool's writer (`holdfast-serve`'s group
//! commit), not through a batch statement.

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::types::Json;
use uuid::Uuid;

use super::rows::{ReservationRow, micros};
use crate::db::{FirstQuery, SqliteWrite, begin_sqlite_write_deferred};
use crate::domain::policy::Backoff;
use crate::domain::{Rejection, Reservation, State};
use crate::store::outcome::placed_nothing;
use crate::store::sql::ReservationSql;
use crate::store::{BranchReport, PhaseRecorded, StoreError};

/// The statement that records participants' answers (`$reports`: a JSON array of [branch id
/// as hex, state, error], [`reports_json`]) on the branch rows of reservation `$id`, if it is
/// in state `$while_in` (an SQL expression; NULL: any). Matches branch rows of every
/// generation, as PostgreSQL does: branch ids are unique per generation.
macro_rules! record_reports_sql {
    ($id:literal, $reports:literal, $while_in:literal) => {
        concat!(
            "UPDATE branches SET state = r.value ->> 1, attempts = attempts + 1, \
                    last_error = r.value ->> 2 \
             FROM json_each(",
            $reports,
            ") AS r WHERE branches.reservation_id = ",
            $id,
            " AND branches.branch_id = unhex(r.value ->> 0) AND (",
            $while_in,
            " IS NULL OR EXISTS (SELECT 1 FROM reservations WHERE reservations.id = ",
            $id,
            " AND reservations.state = ",
            $while_in,
            "))"
        )
    };
}

/// `record_held`'s query: the answers (`?2`) while `?1` is `TRYING`, then `TRYING -> HELD`
/// and the lease freed, answering with the row.
const RECORD_HELD: FirstQuery = sqlite_first_query!(
    record_reports_sql!("?1", "?2", "'TRYING'"),
    "; UPDATE reservations SET state = 'HELD', version = version + 1, \
     lease_owner = NULL, lease_until = NULL, updated_at = ",
    sqlite_now_us!(),
    " WHERE id = ?1 AND state = 'TRYING' RETURNING ",
    reservation_columns!()
);

/// `record_rejected`'s query: the answers (`?6`) while `?1` is `TRYING`, then the move to
/// `REJECTED` (`?5`: nothing was placed; the lease freed) or `CANCELLING` with the rejection
/// (`?2`-`?4`), answering with the row.
const RECORD_REJECTED: FirstQuery = sqlite_first_query!(
    record_reports_sql!("?1", "?6", "'TRYING'"),
    "; UPDATE reservations SET \
     state = CASE WHEN ?5 THEN 'REJECTED' ELSE 'CANCELLING' END, \
     release_outcome = 'REJECTED', \
     rejection_participant = ?2, rejection_resource = ?3, rejection_reason = ?4, \
     lease_owner = CASE WHEN ?5 THEN NULL ELSE lease_owner END, \
     lease_until = CASE WHEN ?5 THEN NULL ELSE lease_until END, \
     version = version + 1, updated_at = ",
    sqlite_now_us!(),
    " WHERE id = ?1 AND state = 'TRYING' RETURNING ",
    reservation_columns!()
);

/// [`crate::store::Store::record_held`].
pub(super) async fn record_held(
    pool: &SqlitePool,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    // The answers while it is still TRYING, then the move and the lease's release, answering
    // with the row: two statements in one query, the write's opening ahead of them - one
    // hand-off to the writer's thread (each is made with the write lock held).
    let mut ahead = begin_sqlite_write_deferred(pool).await?;
    let (sql, conn) = ahead.first(RECORD_HELD);
    let ran = sqlx::query_as::<_, ReservationRow>(sql)
        .bind(id)
        .bind(reports_json(reports))
        .fetch_optional(conn)
        .await;
    moved_or_as_is(ahead.opened(ran)?, id).await
}

/// [`crate::store::Store::record_rejected`].
pub(super) async fn record_rejected(
    pool: &SqlitePool,
    id: Uuid,
    rejection: Option<&Rejection>,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let finished = placed_nothing(reports);
    // One query, as `record_held`: the answers while it is still TRYING, then the move,
    // answering with the row.
    let mut ahead = begin_sqlite_write_deferred(pool).await?;
    let (sql, conn) = ahead.first(RECORD_REJECTED);
    let ran = sqlx::query_as::<_, ReservationRow>(sql)
        .bind(id)
        .bind(rejection.map(|r| r.participant.as_str()))
        .bind(rejection.map(|r| r.resource.as_str()))
        .bind(rejection.map(|r| r.reason.as_str()))
        .bind(finished)
        .bind(reports_json(reports))
        .fetch_optional(conn)
        .await;
    moved_or_as_is(ahead.opened(ran)?, id).await
}

/// The reservation `record_held`/`record_rejected` moved (their query's `RETURNING`), or, if it
/// had moved on already (a repeat), as it is; then the write commits.
async fn moved_or_as_is(
    (moved, mut tx): (Option<ReservationRow>, SqliteWrite),
    id: Uuid,
) -> Result<Reservation, StoreError> {
    let after = match moved {
        Some(row) => row.into_domain()?,
        None => Sqlite::load_existing(&mut tx, id).await?,
    };
    tx.commit().await?;
    Ok(after)
}

/// `record_phase`'s query when the fan-out finished: the answers (`?6`) while it is in `?2`,
/// then `?2 -> ?3`, the lease freed, answering with the row.
const RECORD_PHASE_FINISHING: FirstQuery = sqlite_first_query!(
    record_reports_sql!("?1", "?6", "?2"),
    "; UPDATE reservations SET state = ?3, version = version + 1, updated_at = ",
    sqlite_now_us!(),
    ", lease_owner = NULL, lease_until = NULL, ",
    backoff_next_attempt!("1", "?4", "?5"),
    " WHERE id = ?1 AND state = ?2 RETURNING ",
    reservation_columns!()
);

/// `record_phase`'s query when the fan-out is to be retried: the answers (`?6`) while it is in
/// `?2`, then the lease freed, the next attempt after the backoff (`?3`, no state, is unused),
/// answering with the row.
const RECORD_PHASE_RETRYING: FirstQuery = sqlite_first_query!(
    record_reports_sql!("?1", "?6", "?2"),
    "; UPDATE reservations SET lease_owner = NULL, lease_until = NULL, ",
    backoff_next_attempt!("0", "?4", "?5"),
    " WHERE id = ?1 AND state = ?2 AND ?3 IS NULL RETURNING ",
    reservation_columns!()
);

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
    // One query (one hand-off to the writer's thread): the answers while it is still in
    // `from`; then one statement finds it still there, moves it to `finish` if given, and
    // frees the lease (finished or not, this driver is done with it; unfinished work waits
    // out its backoff, with jitter, so a herd of retries spreads out), answering with the row.
    let query = if finish.is_some() {
        RECORD_PHASE_FINISHING
    } else {
        RECORD_PHASE_RETRYING
    };
    let mut ahead = begin_sqlite_write_deferred(pool).await?;
    let (sql, conn) = ahead.first(query);
    let ran = sqlx::query_as::<_, ReservationRow>(sql)
        .bind(id)
        .bind(from.as_str())
        .bind(finish.map(State::as_str))
        .bind(micros(backoff.base) as f64)
        .bind(micros(backoff.cap) as f64)
        .bind(reports_json(reports))
        .fetch_optional(conn)
        .await;
    let (recorded, mut tx) = ahead.opened(ran)?;
    let finished = recorded.is_some() && finish.is_some();
    let reservation = match recorded {
        Some(_) if finish == Some(State::Failed) => {
            // A lost hold voids the sale: any payment is refunded.
            Sqlite::record_refund(&mut tx, id, lost_hold_refund_reason!()).await?;
            Sqlite::load_existing(&mut tx, id).await?
        }
        Some(row) => row.into_domain()?,
        None => Sqlite::load_existing(&mut tx, id).await?,
    };
    tx.commit().await?;
    Ok(PhaseRecorded {
        reservation,
        finished,
    })
}

/// Participants' answers as `record_reports` binds them: a JSON array of [branch id as hex,
/// state, error].
fn reports_json(reports: &[BranchReport]) -> Json<Vec<(String, &str, Option<&str>)>> {
    Json(
        reports
            .iter()
            .map(|r| {
                (
                    r.branch_id.simple().to_string(),
                    r.state.as_str(),
                    r.error.as_deref(),
                )
            })
            .collect(),
    )
}

/// [`crate::store::sql::ReservationSql::apply_reports`]: records participants' answers on
/// their branch rows, all in one statement.
pub(super) async fn record_reports(
    conn: &mut SqliteConnection,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<(), StoreError> {
    sqlx::query(record_reports_sql!("?1", "?2", "NULL"))
        .bind(id)
        .bind(reports_json(reports))
        .execute(&mut *conn)
        .await?;
    Ok(())
}
