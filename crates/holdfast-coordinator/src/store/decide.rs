//! The locked decision flow, written once for both databases: with the reservation's row
//! locked, check the token, judge the decision by [`lifecycle::decide`], and apply the verdict
//! with the statements of [`ReservationSql`] (lapsed holds, late payments, refunds, retakes,
//! extensions), leasing the reservation to the decider when a fan-out follows.
//!
//! SQLite decides every Confirm/Cancel/Extend here; PostgreSQL first tries its unlocked fast
//! path (`postgres/unlocked.rs`) and comes here when it misses.

use uuid::Uuid;

use super::sql::{Applied, PaymentSql, ReservationSql};
use super::{Decided, StoreError, WorkLease};
use crate::db::WriteTransaction;
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

/// [`crate::store::Store::decide`] under the row lock: read and lock the row, judge, apply the
/// verdict with one conditional write (its row count decides), take the lease unless the
/// write took it, answer the after-image. Nothing changes on a refusal or a repeat, nor when
/// the payment is bound to another reservation ([`Decided::PaymentTaken`]).
pub(crate) async fn decide_locked<DB: PaymentSql>(
    pool: &DB::Pool,
    id: Uuid,
    scope: Option<&str>,
    presented_token: &str,
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
    presented_token: &str,
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
    if !current.token.verifies(presented_token) {
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
    let applied = match &verdict {
        Verdict::Transition {
            to: State::Confirming,
            ..
        } => {
            // The database clock at the UPDATE is the arbiter of "before expires_at".
            match DB::confirm_held(&mut tx, id, lease).await? {
                Applied::Missed => {
                    // Lapsed between the read and the update: judge again as expired.
                    verdict = lifecycle::decide(&lapsed(snapshot), decision);
                    written(apply_lapsed::<DB>(&mut tx, id, &verdict, payment).await?)
                }
                confirmed => {
                    record_payment::<DB>(&mut tx, id, payment).await?;
                    confirmed
                }
            }
        }
        Verdict::Transition {
            to,
            release_outcome,
        } => {
            let reason = match decision {
                Decision::Cancel { reason } => reason.as_deref(),
                _ => None,
            };
            DB::release_held(&mut tx, id, *to, *release_outcome, reason, lease).await?
        }
        Verdict::Expire | Verdict::HonorLate => {
            written(apply_lapsed::<DB>(&mut tx, id, &verdict, payment).await?)
        }
        Verdict::Refund { expire, .. } => {
            if *expire {
                DB::expire_hold(&mut tx, id).await?;
            }
            record_payment::<DB>(&mut tx, id, payment).await?;
            let reason = if *expire || snapshot.state == State::Expired {
                LATE_PAYMENT_REFUND.to_owned()
            } else {
                format!("the reservation is {}", current.state)
            };
            written(DB::record_refund(&mut tx, id, &reason).await?)
        }
        Verdict::Retake => {
            let marked = DB::mark_retake(&mut tx, id).await?;
            if marked {
                record_payment::<DB>(&mut tx, id, payment).await?;
            }
            written(marked)
        }
        Verdict::Extend { by } => {
            // The database clock at the UPDATE is the arbiter here too: the row is locked and
            // HELD, so a miss means the hold lapsed since the read - judged again as expired
            // (released), never answered as an Extend that changed nothing.
            if DB::extend_held(&mut tx, id, *by, decision.extend_request_id()).await? {
                Applied::Written { leased: false }
            } else {
                verdict = lifecycle::decide(&lapsed(snapshot), decision);
                written(apply_lapsed::<DB>(&mut tx, id, &verdict, payment).await?)
            }
        }
        Verdict::AlreadyDone
        | Verdict::Refuse(_)
        | Verdict::VerifyPayment
        | Verdict::TellParticipants { .. }
        | Verdict::RefundExtra { .. } => Applied::Missed,
    };
    let (reservation, leased) = match applied {
        Applied::Missed => {
            tx.rollback().await?;
            (current, false)
        }
        Applied::Written { leased } => {
            // Whoever changed it drives the change (an Extend starts no fan-out).
            let leased = if leased || matches!(verdict, Verdict::Extend { .. }) {
                leased
            } else {
                DB::take_lease(&mut tx, id, lease).await?
            };
            let after = DB::load_existing(&mut tx, id).await?;
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

/// A conditional write's answer, with no lease taken by it.
fn written(done: bool) -> Applied {
    if done {
        Applied::Written { leased: false }
    } else {
        Applied::Missed
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
