//! Confirm and Cancel: each decision is taken durably in the store (token compared, verdict
//! judged under the row's guard) before any participant hears of it, then driven. (Extend,
//! which tells participants first, is `extend.rs`.)

use uuid::Uuid;

use super::payments_read::decided_from_held;
use super::{Coordinator, Error, entered, faults, refund_recorded};
use crate::domain::lifecycle::Refusal;
use crate::domain::validate;
use crate::domain::{
    Actor, Decision, Payment, PresentedToken, RefundState, Reservation, State, Verdict,
};
use crate::store::Decided;

impl Coordinator {
    /// Confirms a held reservation, recording the payment that comes with it. A payment is
    /// recorded only after its payments service vouched for it (`verify_payment`): the store
    /// answers [`Verdict::VerifyPayment`] when the decision would record one not yet checked,
    /// so a repeat of a Confirm already applied needs no check.
    pub async fn confirm(
        &self,
        actor: &Actor,
        id: Uuid,
        token: &PresentedToken,
        payment: Option<Payment>,
    ) -> Result<Reservation, Error> {
        if let Some(p) = &payment {
            validate::payment(p, &self.limits, |name| self.registry.get(name).is_some())?;
        }
        let mut decision = Decision::Confirm {
            payment,
            late_policy: self.policy.late_payment,
            payment_verified: false,
        };
        let (mut verdict, mut r) = self.decide(actor, id, token, &decision).await?;
        if verdict == Verdict::VerifyPayment {
            if let Decision::Confirm {
                payment: Some(p),
                payment_verified,
                ..
            } = &mut decision
            {
                self.verify_payment(id, p).await?;
                *payment_verified = true;
            }
            (verdict, r) = self.decide(actor, id, token, &decision).await?;
        }
        match verdict {
            // Decided out of HELD: no further payment existed then (none is read).
            Verdict::Transition { .. } | Verdict::HonorLate => {
                self.drive_confirm(r).await.map(decided_from_held)
            }
            Verdict::AlreadyDone => Ok(r),
            Verdict::Expire => {
                self.drive_release(r).await?;
                Err(Error::HoldExpired { id, refund: None })
            }
            Verdict::Retake => self.retake(r).await,
            Verdict::Refund { expire, answer } => {
                let r = if expire {
                    self.drive_release(r).await?
                } else {
                    r
                };
                let r = self.drive_refund(r).await?;
                Err(self.refusal(answer, &r))
            }
            Verdict::Extend { .. }
            | Verdict::TellParticipants { .. }
            | Verdict::VerifyPayment
            | Verdict::LeaveQueue
            | Verdict::RefundExtra { .. } => Err(Error::Internal(format!(
                "confirm judged as {verdict:?} after the store"
            ))),
            Verdict::Refuse(refusal) => Err(self.refusal(refusal, &r)),
        }
    }

    /// Releases a reservation.
    pub async fn cancel(
        &self,
        actor: &Actor,
        id: Uuid,
        token: &PresentedToken,
        reason: &str,
    ) -> Result<Reservation, Error> {
        validate::reason("reason", reason, &self.limits)?;
        let decision = Decision::Cancel {
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
        };
        let (verdict, r) = self.decide(actor, id, token, &decision).await?;
        match verdict {
            Verdict::Transition { .. } | Verdict::Expire => {
                self.drive_release(r).await.map(decided_from_held)
            }
            Verdict::AlreadyDone => Ok(r),
            Verdict::LeaveQueue => {
                entered(&r, State::Cancelled);
                Ok(r)
            }
            Verdict::Refuse(refusal) => Err(self.refusal(refusal, &r)),
            other => Err(Error::Internal(format!("cancel judged as {other:?}"))),
        }
    }

    pub(super) async fn decide(
        &self,
        actor: &Actor,
        id: Uuid,
        token: &PresentedToken,
        decision: &Decision,
    ) -> Result<(Verdict, Reservation), Error> {
        faults::store("coord.decide.before")?;
        let decided = self
            .store
            .decide(id, actor.scope(), token, decision, self.lease())
            .await?;
        faults::store("coord.decide.after")?;
        match decided {
            Decided::NotFound => Err(Error::NotFound(id)),
            Decided::TokenMismatch => Err(Error::TokenMismatch(id)),
            Decided::PaymentTaken => Err(Error::PaymentMismatch {
                id,
                check: "payment_ref",
                problem: "payment.payment_ref is already recorded on another reservation".into(),
            }),
            Decided::ExtraRefund {
                answer,
                reservation,
                extra,
                leased,
            } => {
                // A further payment: refunded, never dropped; the answer shows its refund.
                let refund = if leased {
                    crate::telemetry::refund(RefundState::Pending);
                    self.drive_extra_refund(id, extra).await?.refund
                } else {
                    extra.refund
                };
                let mut shown = *reservation;
                shown.refund = Some(refund);
                Err(self.refusal(answer, &shown))
            }
            Decided::Judged {
                verdict,
                reservation,
                leased,
            } => {
                match &verdict {
                    Verdict::Transition { to, .. } => entered(&reservation, *to),
                    Verdict::HonorLate => entered(&reservation, State::Confirming),
                    Verdict::Expire => {
                        entered(&reservation, State::Cancelling);
                        crate::telemetry::hold_expired();
                    }
                    Verdict::Refund { expire, .. } => {
                        if *expire {
                            entered(&reservation, State::Cancelling);
                            crate::telemetry::hold_expired();
                        }
                        refund_recorded(&reservation);
                    }
                    _ => {}
                }
                // Another instance is driving this reservation (a sweep mid-release): it will
                // finish what this decision added; answer without driving it twice.
                let verdict = match verdict {
                    Verdict::Refund { answer, .. } if !leased => Verdict::Refuse(answer),
                    other => other,
                };
                Ok((verdict, *reservation))
            }
        }
    }

    pub(super) fn refusal(&self, refusal: Refusal, r: &Reservation) -> Error {
        match refusal {
            Refusal::HoldExpired => Error::HoldExpired {
                id: r.id,
                refund: r.refund.clone(),
            },
            Refusal::Closed => Error::Closed {
                id: r.id,
                state: r.state,
                refund: r.refund.clone(),
            },
            Refusal::InProgress => Error::InProgress {
                id: r.id,
                refund: r.refund.clone(),
            },
            Refusal::NotHeld => Error::NotHeld(r.id),
            Refusal::ExtensionLimit => Error::ExtensionLimit {
                id: r.id,
                used: r.extensions_used,
                max: self.policy.max_extensions,
                max_ttl_secs: self.limits.max_ttl.as_secs(),
            },
        }
    }
}
