//! Whether a Reserve may be recorded, written once for both databases: its (owner, holder,
//! request_id) may already be recorded (answer that reservation), or a hold limit may be
//! reached. The caller holds what makes the check and its insert atomic (PostgreSQL: the
//! holder's advisory lock, and the global one under a global cap; SQLite: the write lock,
//! under which its insert applies these rules as its own guard, so this check runs only to say
//! why that insert refused). The counting statements are [`AdmissionSql`], implemented in each
//! backend's `create.rs`.

use async_trait::async_trait;
use uuid::Uuid;

use super::sql::ReservationSql;
use super::{Created, StoreError};
use crate::domain::policy::{HoldLimits, LimitScope};
use crate::domain::{NewReservation, RequestId};

/// The statements admission counts with. "Live" is `TRYING`, `QUEUED`, or `HELD` and unexpired by the
/// database clock.
#[async_trait]
pub(crate) trait AdmissionSql: ReservationSql {
    /// The reservation recorded for (`owner`, `holder`, `request_id`), if any, and how many
    /// live reservations `owner`'s `holder` has.
    async fn find_request(
        conn: &mut Self::Connection,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<(Option<Uuid>, i64), StoreError>;

    /// How many live reservations there are in all.
    async fn count_live(conn: &mut Self::Connection) -> Result<i64, StoreError>;
}

/// Why `new` may not be recorded: its (owner, holder, request_id) is recorded already, or a hold
/// limit is reached (the global one only counted when set). `None`: it may. A row recorded with
/// `new`'s own id is answered [`Created::New`]: it is this call's, written by an attempt whose
/// commit acknowledgement was lost.
pub(crate) async fn admission<DB: AdmissionSql>(
    conn: &mut DB::Connection,
    new: &NewReservation,
    limits: HoldLimits,
) -> Result<Option<Created>, StoreError> {
    let (existing, live_for_holder) =
        DB::find_request(conn, &new.owner, &new.holder, &new.request_id).await?;
    if let Some(existing) = existing {
        let found = DB::load_existing(conn, existing).await?;
        // This very Reserve's row (its id is fresh per call): an earlier attempt of the same
        // call committed but its acknowledgement was lost (PostgreSQL's group commit reruns a
        // failed batch call by call). It is new to the caller, whose holds are yet to be placed.
        return Ok(Some(if found.id == new.id {
            Created::New(found)
        } else {
            Created::Existing(found)
        }));
    }
    if live_for_holder >= i64::from(limits.per_holder) {
        return Ok(Some(Created::LimitReached(LimitScope::Holder)));
    }
    if limits.total > 0 && DB::count_live(conn).await? >= i64::from(limits.total) {
        return Ok(Some(Created::LimitReached(LimitScope::Total)));
    }
    Ok(None)
}
