//! The locked decision flow, written once for both databases: with the reservation's row
//! locked, check the token, judge the decision by [`lifecycle::decide`], and apply the verdict
//! with the statements of [`ReservationSql`] (lapsed holds, late payments, refunds, retakes,
//! extensions), leasing the reservation to the decider when a fan-out follows.
//!
//! A decided move out of `HELD` (Confirm, Cancel) is not spelled here but described
//! ([`LeaveHeld`]): each database has one executor of it, run under the row lock here, or on
//! the unlocked path (`without_lock.rs`, [`judge_unlocked`]: read without a lock, judge, run
//! the same description guarded by the version read; PostgreSQL's group commit runs many at
//! once).

use uuid::Uuid;

use super::sql::{Applied, Guard, LeaveHeld, PaymentSql, ReservationSql};
use super::{Decided, StoreError, WorkLease};
use crate::db::WriteTransaction;
use crate::domain::PresentedToken;
use crate::domain::lifecycle::{self, Refusal, Snapshot};
use crate::domain::{Decision, Payment, Reservation, State, Verdict};

/// Why a payment that came after its hold lapsed is refunded.
const LATE_PAYMENT_REFUND: &str = "the payment arrived after the hold expired";

/// What the lifecycle rules need to know of a reservation, to judge `decision`.
pub(crate) fn snapshot_of(current: &Reservation, decision: &Decision) -> Snapshot {
    Snapshot {
        state: current.stored_state,
        release_outcome: current.release_outcome,
        expired: current.state == State::Expired && current.stored_state == State::Held,
        created_at: current.created_at,
        expires_at: current.expires_at,
        extensions_used: current.extensions_used,
        ttl: current.ttl,
        has_payment: current.payment.is_some(),
        has_refund: current.refund.is_some(),
        same_payment: match (payment_of(decision), &current.payment) {
            (Some(p), Some(recorded)) => {
                p.participant == recorded.participant && p.payment_ref == recorded.payment_ref
            }
            _ => false,
        },
        repeats_last_extend: false,
    }
}

/// The payment a decision brings (a Confirm's).
fn payment_of(decision: &Decision) -> Option<&Payment> {
    match decision {
        Decision::Confirm { payment, .. } => payment.as_ref(),
        _ => None,
    }
}

/// Whether a write failed because the payment is bound to another reservation already: the
/// unique index of payment bindings decided a race between two reservations citing it.
pub(crate) fn payment_conflict(e: &StoreError) -> bool {
    match e {
        StoreError::Database(sqlx::Error::Database(db)) => {
            db.kind() == sqlx::error::ErrorKind::UniqueViolation && db.message().contains("payment")
        }
        _ => false,
    }
}

/// [`crate::store::Store::expire_lapsed_hold`]: [`ReservationSql::expire_hold`], the one
/// statement of a lapsed hold's expiry, in a write transaction of its own.
pub(crate) async fn expire_lapsed_hold<DB: ReservationSql>(
    pool: &DB::Pool,
    id: Uuid,
) -> Result<bool, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let expired = DB::expire_hold(&mut tx, id).await?;
    if expired {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(expired)
}

/// [`crate::store::Store::decide`] under the row lock: read and lock the row, judge, apply the
/// verdict with one conditional write (its row count decides), take the lease unless the
/// write took it, answer the after-image. Nothing changes on a refusal or a repeat, nor when
/// the payment is bound to another reservation ([`Decided::PaymentTaken`]).
pub(crate) async fn decide_locked<DB: PaymentSql>(
    pool: &DB::Pool,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &PresentedToken,
    decision: &Decision,
    lease: WorkLease,
) -> Result<Decided, StoreError> {
    match decide_in_lock::<DB>(pool, id, scope, presented_token, decision, lease).await {
        Err(e) if payment_conflict(&e) => Ok(Decided::PaymentTaken),
        other => other,
    }
}

async fn decide_in_lock<DB: PaymentSql>(
    pool: &DB::Pool,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &PresentedToken,
    decision: &Decision,
    lease: WorkLease,
) -> Result<Decided, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let current = match DB::load_locked(&mut tx, id).await? {
        Some(r) if r.visible_to(scope) => r,
        _ => {
            tx.rollback().await?;
            return Ok(Decided::NotFound);
        }
    };
    if !current.token.verifies(presented_token.expose()) {
        tx.rollback().await?;
        return Ok(Decided::TokenMismatch);
    }
    let mut snapshot = snapshot_of(&current, decision);
    if let Some(key) = decision.extend_request_id() {
        snapshot.repeats_last_extend = DB::repeats_last_extend(&mut tx, id, key).await?;
    }
    let payment = payment_of(decision);
    let mut verdict = lifecycle::decide(&snapshot, decision);
    if let (true, Some(p)) = (verdict.records_payment(), payment) {
        // One payment_ref per reservation (the unique index decides races).
        if DB::payment_owner(&mut tx, p)
            .await?
            .is_some_and(|owner| owner != id)
        {
            tx.rollback().await?;
            return Ok(Decided::PaymentTaken);
        }
        if let Verdict::RefundExtra { answer } = verdict {
            return refund_extra::<DB>(tx, current, p, answer, lease).await;
        }
    }
    let judged = Judged {
        current: &current,
        snapshot,
        decision,
        lease,
    };
    let applied = apply_verdict::<DB>(&mut tx, &judged, &mut verdict).await?;
    let (reservation, leased) = match applied {
        Applied::Missed => {
            tx.rollback().await?;
            (current, false)
        }
        Applied::Written { leased, read_back } => {
            // Whoever changed it drives the change (an Extend starts no fan-out; a reservation
            // that left its queue holds nothing).
            let leased =
                if leased || matches!(verdict, Verdict::Extend { .. } | Verdict::LeaveQueue) {
                    leased
                } else {
                    DB::take_lease(&mut tx, id, lease).await?
                };
            let after = DB::written(&mut tx, id, read_back).await?;
            tx.commit().await?;
            (after, leased)
        }
    };
    Ok(Decided::Judged {
        verdict,
        reservation: Box::new(reservation),
        leased,
    })
}

/// A decision judged on a row read under its lock.
struct Judged<'a> {
    current: &'a Reservation,
    snapshot: Snapshot,
    decision: &'a Decision,
    lease: WorkLease,
}

/// Applies `verdict` under the row lock. A guarded write that misses because the hold lapsed
/// since the read (the database clock at the UPDATE is the arbiter of "before expires_at")
/// judges the decision again as expired, into `verdict`, and applies that: never an answer of
/// a change that was not written.
async fn apply_verdict<DB: PaymentSql>(
    tx: &mut DB::Connection,
    judged: &Judged<'_>,
    verdict: &mut Verdict,
) -> Result<Applied, StoreError> {
    let (id, decision) = (judged.current.id, judged.decision);
    let payment = payment_of(decision);
    let applied = match &*verdict {
        Verdict::Transition { .. } => {
            let write = leave_held(judged.current, decision, verdict, judged.lease, true);
            match write {
                Some(write) => DB::leave_held(tx, &write).await?,
                None => Applied::Missed,
            }
        }
        Verdict::Extend { by } => {
            Applied::unleased(DB::extend_held(tx, id, *by, decision.extend_request_id()).await?)
        }
        Verdict::Expire | Verdict::HonorLate => {
            return Ok(Applied::unleased(
                apply_lapsed::<DB>(tx, id, verdict, payment).await?,
            ));
        }
        Verdict::Refund { expire, .. } => {
            if *expire {
                DB::expire_hold(tx, id).await?;
            }
            record_payment::<DB>(tx, id, payment).await?;
            let reason = if *expire || judged.snapshot.state == State::Expired {
                LATE_PAYMENT_REFUND.to_owned()
            } else {
                format!("the reservation is {}", judged.current.state)
            };
            return Ok(Applied::unleased(DB::record_refund(tx, id, &reason).await?));
        }
        Verdict::Retake => {
            let marked = DB::mark_retake(tx, id).await?;
            if marked {
                record_payment::<DB>(tx, id, payment).await?;
            }
            return Ok(Applied::unleased(marked));
        }
        Verdict::LeaveQueue => {
            let reason = match decision {
                Decision::Cancel { reason } => reason.as_deref(),
                _ => None,
            };
            return Ok(Applied::unleased(DB::leave_queue(tx, id, reason).await?));
        }
        Verdict::AlreadyDone
        | Verdict::Refuse(_)
        | Verdict::VerifyPayment
        | Verdict::TellParticipants { .. }
        | Verdict::RefundExtra { .. } => return Ok(Applied::Missed),
    };
    if !matches!(applied, Applied::Missed) {
        return Ok(applied);
    }
    // The row is locked and HELD: the guarded write missed because the hold lapsed since the
    // read.
    *verdict = lifecycle::decide(&lapsed(judged.snapshot), decision);
    Ok(Applied::unleased(
        apply_lapsed::<DB>(tx, id, verdict, payment).await?,
    ))
}

/// The write `verdict` asks for when it moves `current` out of `HELD` by `decision`; `None`
/// for every other verdict. `locked`: `current` was read under its row lock, which guards the
/// write; otherwise the version read does.
pub(crate) fn leave_held(
    current: &Reservation,
    decision: &Decision,
    verdict: &Verdict,
    lease: WorkLease,
    locked: bool,
) -> Option<LeaveHeld> {
    let Verdict::Transition {
        to,
        release_outcome,
    } = verdict
    else {
        return None;
    };
    let (payment, cancel_reason) = match decision {
        Decision::Confirm { payment, .. } if *to == State::Confirming => (payment.clone(), None),
        Decision::Cancel { reason } => (None, reason.clone()),
        _ => (None, None),
    };
    Some(LeaveHeld {
        id: current.id,
        guard: if locked {
            Guard::RowLock
        } else {
            Guard::Version(current.version)
        },
        to: *to,
        release_outcome: *release_outcome,
        cancel_reason,
        payment,
        lease,
    })
}

/// What a decision judged on a row read without a lock comes to.
pub(crate) enum Unlocked {
    /// Answered from the read: nothing to write.
    Answered(Decided),
    /// Run this write (version-guarded); a hit answers `verdict` ([`answer_unlocked`]).
    Write { write: LeaveHeld, verdict: Verdict },
    /// Every rarer verdict (lapsed holds, late payments, refunds, Extend): the locked flow
    /// decides.
    Locked,
}

/// Judges `decision` on `current`, read without a lock. `from_image`: `current` is an image
/// this process recorded rather than a read of the row, so only a verdict its version guard
/// protects is taken from it (a write, or a payment to verify first).
pub(crate) fn judge_unlocked(
    current: &Reservation,
    from_image: bool,
    scope: Option<&str>,
    presented_token: &PresentedToken,
    decision: &Decision,
    lease: WorkLease,
) -> Unlocked {
    if matches!(decision, Decision::Extend { .. }) {
        return Unlocked::Locked;
    }
    if !current.visible_to(scope) {
        return Unlocked::Answered(Decided::NotFound);
    }
    if !current.token.verifies(presented_token.expose()) {
        return Unlocked::Answered(Decided::TokenMismatch);
    }
    let verdict = lifecycle::decide(&snapshot_of(current, decision), decision);
    match verdict {
        Verdict::Transition { .. } => match leave_held(current, decision, &verdict, lease, false) {
            Some(write) => Unlocked::Write { write, verdict },
            None => Unlocked::Locked,
        },
        Verdict::VerifyPayment => Unlocked::Answered(unchanged(verdict, current)),
        Verdict::AlreadyDone | Verdict::Refuse(_) if !from_image => {
            Unlocked::Answered(unchanged(verdict, current))
        }
        _ => Unlocked::Locked,
    }
}

/// The answer of a version-guarded [`LeaveHeld`] that landed: its after-image (a decision
/// changes the reservation row only, so its branches are as read), leased to the decider.
pub(crate) fn answer_unlocked(
    verdict: Verdict,
    read: Reservation,
    mut after: Reservation,
) -> Decided {
    after.branches = read.branches;
    Decided::Judged {
        verdict,
        reservation: Box::new(after),
        leased: true,
    }
}

/// A verdict that changes nothing, answered with the reservation as read.
fn unchanged(verdict: Verdict, current: &Reservation) -> Decided {
    Decided::Judged {
        verdict,
        reservation: Box::new(current.clone()),
        leased: false,
    }
}

/// [`Verdict::RefundExtra`]: records the further payment with its refund, leased to the decider
/// to send; a repeat (recorded already) answers it as it is and changes nothing.
async fn refund_extra<DB: PaymentSql>(
    mut tx: DB::Write,
    current: Reservation,
    payment: &Payment,
    answer: Refusal,
    lease: WorkLease,
) -> Result<Decided, StoreError> {
    let id = current.id;
    let reason = format!(
        "another payment for reservation {id}, which is {} already",
        current.state
    );
    let inserted = DB::insert_extra_payment(&mut tx, id, payment, &reason).await?;
    let Some((owner, extra)) = DB::load_extra_payment(&mut tx, payment).await? else {
        return Err(StoreError::Corrupt(format!(
            "payment {} of reservation {id} vanished",
            payment.payment_ref
        )));
    };
    if owner != id {
        tx.rollback().await?;
        return Ok(Decided::PaymentTaken);
    }
    let leased = if inserted {
        let leased = DB::take_lease(&mut tx, id, lease).await?;
        tx.commit().await?;
        leased
    } else {
        tx.rollback().await?;
        false
    };
    Ok(Decided::ExtraRefund {
        answer,
        reservation: Box::new(current),
        extra,
        leased,
    })
}

/// `snapshot` as it is once the hold lapsed: a guarded UPDATE of a locked `HELD` row missed
/// because the database clock passed `expires_at` after the read.
fn lapsed(snapshot: Snapshot) -> Snapshot {
    Snapshot {
        expired: true,
        ..snapshot
    }
}

/// Applies a verdict on a lapsed HELD reservation: release it, or honour a late payment by
/// confirming the holds as they are, or refund the payment.
async fn apply_lapsed<DB: ReservationSql>(
    conn: &mut DB::Connection,
    id: Uuid,
    verdict: &Verdict,
    payment: Option<&Payment>,
) -> Result<bool, StoreError> {
    match verdict {
        Verdict::HonorLate => {
            let honored = DB::honor_late(conn, id).await?;
            if honored {
                record_payment::<DB>(conn, id, payment).await?;
            }
            Ok(honored)
        }
        Verdict::Refund { .. } => {
            DB::expire_hold(conn, id).await?;
            record_payment::<DB>(conn, id, payment).await?;
            DB::record_refund(conn, id, LATE_PAYMENT_REFUND).await
        }
        _ => DB::expire_hold(conn, id).await,
    }
}

/// Records the decision's payment, if it brings one.
async fn record_payment<DB: ReservationSql>(
    conn: &mut DB::Connection,
    id: Uuid,
    payment: Option<&Payment>,
) -> Result<(), StoreError> {
    match payment {
        Some(p) => DB::record_payment(conn, id, p).await,
        None => Ok(()),
    }
}
