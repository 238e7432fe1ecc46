//! Recording participants' answers on SQLite: `record_held` (`TRYING -> HELD`),
//! `record_rejected` (a stopped placement: `TRYING -> CANCELLING`, or `-> REJECTED` when
//! nothing was placed) and `record_phase` (a Confirm or Cancel fan-out's answers, finishing it
//! or scheduling its retry). Each call is one write on the writer thread (`writer.rs`);
//! concurrent calls share its group COMMIT, not a batch statement.

use rusqlite::params;
use uuid::Uuid;

use super::rows::micros;
use super::writer::{Conn, OnWriter, exec, optional};
use crate::domain::policy::Backoff;
use crate::domain::{Rejection, Reservation, State};
use crate::store::outcome::placed_nothing;
use crate::store::sql::ReservationSql;
use crate::store::{BranchReport, PhaseRecorded, StoreError};

/// Moves a reservation `from -> to` if it is still in `from`; the row count decides.
fn transition(conn: &Conn, id: Uuid, from: State, to: State) -> Result<bool, StoreError> {
    let done = exec(
        conn,
        concat!(
            "UPDATE reservations SET state = ?3, version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = ?2"
        ),
        params![id, from.as_str(), to.as_str()],
    )?;
    Ok(done == 1)
}

/// [`crate::store::Store::record_held`].
pub(super) async fn record_held(
    conn: &mut Conn,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    if transition(conn, id, State::Trying, State::Held)? {
        OnWriter::apply_reports(conn, id, reports).await?;
        exec(
            conn,
            "UPDATE reservations SET lease_owner = NULL, lease_until = NULL WHERE id = ?1",
            params![id],
        )?;
    }
    let after = OnWriter::load_existing(conn, id).await?;
    Ok(after)
}

/// [`crate::store::Store::record_rejected`].
pub(super) async fn record_rejected(
    conn: &mut Conn,
    id: Uuid,
    rejection: Option<&Rejection>,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let finished = placed_nothing(reports);
    let moved = exec(
        conn,
        concat!(
            "UPDATE reservations SET \
         state = CASE WHEN ?5 THEN 'REJECTED' ELSE 'CANCELLING' END, \
         release_outcome = 'REJECTED', \
         rejection_participant = ?2, rejection_resource = ?3, rejection_reason = ?4, \
         lease_owner = CASE WHEN ?5 THEN NULL ELSE lease_owner END, \
         lease_until = CASE WHEN ?5 THEN NULL ELSE lease_until END, \
         version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'TRYING'"
        ),
        params![
            id,
            rejection.map(|r| r.participant.as_str()),
            rejection.map(|r| r.resource.as_str()),
            rejection.map(|r| r.reason.as_str()),
            finished
        ],
    )?;
    if moved == 1 {
        OnWriter::apply_reports(conn, id, reports).await?;
    }
    let after = OnWriter::load_existing(conn, id).await?;
    Ok(after)
}

/// [`crate::store::Store::record_phase`].
pub(super) async fn record_phase(
    conn: &mut Conn,
    id: Uuid,
    from: State,
    reports: &[BranchReport],
    finish: Option<State>,
    backoff: Backoff,
) -> Result<PhaseRecorded, StoreError> {
    // The write lock orders two drivers of one reservation: they record one after the other.
    let mut finished = false;
    let still_there: Option<String> = optional(
        conn,
        "SELECT state FROM reservations WHERE id = ?1",
        params![id],
        |r| r.get(0),
    )?;
    if still_there.as_deref() == Some(from.as_str()) {
        OnWriter::apply_reports(conn, id, reports).await?;
        finished = match finish {
            Some(to) => transition(conn, id, from, to)?,
            None => false,
        };
        if finished && finish == Some(State::Failed) {
            // A lost hold voids the sale: any payment is refunded.
            OnWriter::record_refund(conn, id, lost_hold_refund_reason!()).await?;
        }
        // Finished or not, this driver is done with it: free the lease. Unfinished work
        // waits out its backoff (with jitter, so a herd of retries spreads out).
        exec(
            conn,
            concat!(
                "UPDATE reservations SET lease_owner = NULL, lease_until = NULL, ",
                backoff_next_attempt!("?2", "?3", "?4"),
                " WHERE id = ?1"
            ),
            params![
                id,
                finished,
                micros(backoff.base) as f64,
                micros(backoff.cap) as f64
            ],
        )?;
    }
    let reservation = OnWriter::load_existing(conn, id).await?;
    Ok(PhaseRecorded {
        reservation,
        finished,
    })
}
