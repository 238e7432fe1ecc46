//! The operator's writes (`tcc.v1.Admin`), written once for both databases over [`AdminSql`]:
//! ForceCancel and Resolve (one conditional UPDATE under the row lock, its row count decides)
//! and Retry (backoff cleared, free leases taken), each with its audit entry inserted in the
//! same transaction as the change it records.

use async_trait::async_trait;
use uuid::Uuid;

use super::decide::{leave_held, snapshot_of};
use super::sql::{Applied, ReservationSql};
use super::{StoreError, WorkLease};
use crate::db::WriteTransaction;
use crate::domain::admin::{AuditNote, RetryTarget};
use crate::domain::lifecycle;
use crate::domain::{Decision, RefundState, Reservation, State, Verdict};

/// Why a payment is refunded when an operator settles a FAILED reservation as CANCELLED.
const RESOLVED_CANCELLED_REFUND: &str = "resolved as CANCELLED by an operator";

/// What an admin change found and did.
#[derive(Debug)]
pub enum AdminDecided {
    NotFound,
    /// Not in a state the action applies to; nothing changed (the reservation as it is).
    Refused(Box<Reservation>),
    /// Changed and audited; `reservation` is the after-image. `leased`: this instance holds
    /// the lease and should drive what follows (a release, a refund).
    Done {
        reservation: Box<Reservation>,
        leased: bool,
    },
}

/// A reservation Retry woke: its backoff cleared; `leased` when its lease was free and is
/// this instance's now (drive it), false when another driver holds it (it is being driven).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Woken {
    pub id: Uuid,
    pub leased: bool,
}

/// The statements of the operator's writes, one implementation per database
/// (`postgres/admin.rs`, `sqlite/admin.rs`).
#[async_trait]
pub(crate) trait AdminSql: ReservationSql {
    /// `TRYING -> CANCELLING` ending `CANCELLED` with the reason. Every branch not answered yet
    /// counts as tried (`attempts` at least 1), so the release cancels it too: a Try may be in
    /// flight, and a Cancel before it leaves a tombstone that makes it a no-op.
    async fn release_trying(
        conn: &mut Self::Connection,
        id: Uuid,
        reason: &str,
    ) -> Result<bool, StoreError>;

    /// `FAILED -> to` (`CONFIRMED` or `CANCELLED`).
    async fn resolve_failed(
        conn: &mut Self::Connection,
        id: Uuid,
        to: State,
    ) -> Result<bool, StoreError>;

    /// Appends an audit entry (database clock).
    async fn insert_audit(
        conn: &mut Self::Connection,
        id: Option<Uuid>,
        note: &AuditNote,
    ) -> Result<(), StoreError>;

    /// Clears the backoff of the target's reservations with unfinished work (due now) and
    /// leases to `lease.owner` those whose lease is free.
    async fn wake_for_retry(
        conn: &mut Self::Connection,
        target: &RetryTarget,
        lease: WorkLease,
    ) -> Result<Vec<Woken>, StoreError>;
}

/// [`crate::store::Store::force_cancel`]: a `HELD` reservation is judged as a Cancel would be
/// (its release, or its expiry if it lapsed); a `TRYING` one is released with its placement.
pub(crate) async fn force_cancel<DB: AdminSql>(
    pool: &DB::Pool,
    id: Uuid,
    note: &AuditNote,
    lease: WorkLease,
) -> Result<AdminDecided, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let Some(current) = DB::load_locked(&mut tx, id).await? else {
        tx.rollback().await?;
        return Ok(AdminDecided::NotFound);
    };
    let applied = match current.stored_state {
        State::Held => {
            let decision = Decision::Cancel {
                reason: Some(note.reason.clone()),
            };
            match lifecycle::decide(&snapshot_of(&current, &decision), &decision) {
                verdict @ Verdict::Transition { .. } => {
                    let write = leave_held(&current, &decision, &verdict, lease, true);
                    match write {
                        Some(write) => match DB::leave_held(&mut tx, &write).await? {
                            // Lapsed since the read: expired, as a Cancel would be.
                            Applied::Missed => {
                                Applied::unleased(DB::expire_hold(&mut tx, id).await?)
                            }
                            applied => applied,
                        },
                        None => Applied::Missed,
                    }
                }
                Verdict::Expire => Applied::unleased(DB::expire_hold(&mut tx, id).await?),
                _ => Applied::Missed,
            }
        }
        State::Trying => Applied::unleased(DB::release_trying(&mut tx, id, &note.reason).await?),
        _ => Applied::Missed,
    };
    let Applied::Written { leased, read_back } = applied else {
        tx.rollback().await?;
        return Ok(AdminDecided::Refused(Box::new(current)));
    };
    DB::insert_audit(&mut tx, Some(id), note).await?;
    let leased = leased || DB::take_lease(&mut tx, id, lease).await?;
    // (The audit row changes nothing a reservation shows.)
    let after = DB::written(&mut tx, id, read_back).await?;
    tx.commit().await?;
    Ok(AdminDecided::Done {
        reservation: Box::new(after),
        leased,
    })
}

/// [`crate::store::Store::resolve`]: `FAILED -> to`; settled as `CANCELLED`, a payment without
/// a refund gets one (a cancelled sale is refunded); as `CONFIRMED` no refund is added. A
/// refund recorded already stands either way (never withdrawn, never twice).
pub(crate) async fn resolve<DB: AdminSql>(
    pool: &DB::Pool,
    id: Uuid,
    to: State,
    note: &AuditNote,
    lease: WorkLease,
) -> Result<AdminDecided, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let Some(current) = DB::load_locked(&mut tx, id).await? else {
        tx.rollback().await?;
        return Ok(AdminDecided::NotFound);
    };
    if current.stored_state != State::Failed || !DB::resolve_failed(&mut tx, id, to).await? {
        tx.rollback().await?;
        return Ok(AdminDecided::Refused(Box::new(current)));
    }
    if to == State::Cancelled {
        DB::record_refund(&mut tx, id, RESOLVED_CANCELLED_REFUND).await?;
    }
    DB::insert_audit(&mut tx, Some(id), note).await?;
    let after = DB::load_existing(&mut tx, id).await?;
    let owes = after
        .refund
        .as_ref()
        .is_some_and(|r| r.state == RefundState::Pending);
    let leased = owes && DB::take_lease(&mut tx, id, lease).await?;
    tx.commit().await?;
    Ok(AdminDecided::Done {
        reservation: Box::new(after),
        leased,
    })
}

/// [`crate::store::Store::retry`]: `None` when the reservation asked for does not exist.
pub(crate) async fn retry<DB: AdminSql>(
    pool: &DB::Pool,
    target: &RetryTarget,
    note: &AuditNote,
    lease: WorkLease,
) -> Result<Option<Vec<Woken>>, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let reservation = match target {
        RetryTarget::Reservation(id) => {
            if DB::load(&mut tx, *id).await?.is_none() {
                tx.rollback().await?;
                return Ok(None);
            }
            Some(*id)
        }
        RetryTarget::Participant(_) => None,
    };
    let woken = DB::wake_for_retry(&mut tx, target, lease).await?;
    DB::insert_audit(&mut tx, reservation, note).await?;
    tx.commit().await?;
    Ok(Some(woken))
}
