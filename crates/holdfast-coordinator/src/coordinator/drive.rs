//! Carrying out a decided outcome at the participants: Confirm or Cancel every branch in
//! parallel and record the answers ([`Coordinator::drive_confirm`],
//! [`Coordinator::drive_release`], the only confirm and release paths), and send a pending
//! refund ([`Coordinator::drive_refund`]; a further payment's:
//! [`Coordinator::drive_extra_refund`]). What is not acknowledged stays for recovery.

use std::collections::HashSet;

use futures_util::future::join_all;
use uuid::Uuid;

use super::{Coordinator, Error, entered, faults, refund_recorded};
use crate::domain::{
    BranchOutcome, BranchState, ExtraPayment, ParticipantBranch, Payment, Refund, RefundState,
    Reservation, State,
};
use crate::registry::RefundFailure;
use crate::store::{BranchReport, RefundAnswer};

impl Coordinator {
    /// Tells every participant to finalise its branch, in parallel, and records the answers.
    /// A participant that does not answer leaves the reservation CONFIRMING: its outcome is
    /// fixed, and recovery finishes it. Only a `CONFIRMING` reservation is confirmed (as only
    /// a `CANCELLING` one is released): `r` is the after-image of the write that decided.
    pub async fn drive_confirm(&self, r: Reservation) -> Result<Reservation, Error> {
        if r.stored_state != State::Confirming {
            return Ok(r);
        }
        let pending: Vec<ParticipantBranch> = r
            .participant_branches()
            .into_iter()
            .filter(|b| !matches!(b.state, BranchState::Confirmed | BranchState::HoldLost))
            .collect();
        let calls = pending.iter().map(|b| self.confirm_branch(&r, b));
        let reports = join_all(calls).await;
        let settled = reports
            .iter()
            .all(|rep| rep.error.is_none() || rep.state == BranchState::HoldLost);
        let lost = reports.iter().any(|rep| rep.state == BranchState::HoldLost)
            || r.branches.iter().any(|b| b.state == BranchState::HoldLost);
        let finish = settled.then_some(if lost {
            State::Failed
        } else {
            State::Confirmed
        });
        if lost {
            tracing::error!(reservation_id = %r.id, "a participant lost a granted hold; reservation FAILED");
        }
        faults::store("coord.record_phase.before")?;
        let phase = self
            .store
            .record_phase(
                r.id,
                State::Confirming,
                &reports,
                finish,
                self.policy.backoff,
            )
            .await?;
        faults::store("coord.record_phase.after")?;
        if let (true, Some(to)) = (phase.finished, finish) {
            entered(&phase.reservation, to);
            if to == State::Failed {
                refund_recorded(&phase.reservation);
            }
        }
        self.drive_refund(phase.reservation).await
    }

    /// Confirms one participant's branch of `r` and says how it stands now.
    async fn confirm_branch(&self, r: &Reservation, b: &ParticipantBranch) -> BranchReport {
        let result = match self.registry.require(&b.participant) {
            Ok(p) => match faults::call("coord.confirm.before") {
                Some(e) => Err(e),
                None => p
                    .confirm(r.id, b.branch_id)
                    .await
                    .and_then(|o| faults::call("coord.confirm.after").map_or(Ok(o), Err)),
            },
            Err(e) => Err(e),
        };
        let report = |state, error| BranchReport {
            branch_id: b.branch_id,
            state,
            error,
        };
        match result {
            Ok(BranchOutcome::Confirmed) => report(BranchState::Confirmed, None),
            Ok(BranchOutcome::HoldLost) => {
                // The participant may have taken the units back (`sold_out`).
                self.sold_out
                    .released(&b.participant, b.holds.iter().map(|h| h.resource.as_str()));
                report(BranchState::HoldLost, None)
            }
            // The participant released it (Confirm after Cancel): the hold is gone.
            Ok(BranchOutcome::Cancelled) => {
                self.sold_out
                    .released(&b.participant, b.holds.iter().map(|h| h.resource.as_str()));
                tracing::error!(reservation_id = %r.id, participant = %b.participant, "participant had released a hold being confirmed");
                report(
                    BranchState::HoldLost,
                    Some("participant had released the hold".into()),
                )
            }
            Err(e) => report(b.state, Some(e.message)),
        }
    }

    /// Tells every participant that may hold something to release it, in parallel, and
    /// records the answers. The one release path: cancel, expiry and rejection all use it.
    pub async fn drive_release(&self, r: Reservation) -> Result<Reservation, Error> {
        if r.stored_state != State::Cancelling {
            return Ok(r);
        }
        let to_release: Vec<ParticipantBranch> = release_candidates(&r);
        let calls = to_release.iter().map(|b| async {
            // Units of these resources may come back from here on: a sold-out hint of them
            // goes now and again when the participant has answered (`sold_out`).
            let resources = || b.holds.iter().map(|h| h.resource.as_str());
            self.sold_out.released(&b.participant, resources());
            let result = match self.registry.require(&b.participant) {
                Ok(p) => match faults::call("coord.cancel.before") {
                    Some(e) => Err(e),
                    None => p
                        .cancel(r.id, b.branch_id)
                        .await
                        .and_then(|o| faults::call("coord.cancel.after").map_or(Ok(o), Err)),
                },
                Err(e) => Err(e),
            };
            self.sold_out.released(&b.participant, resources());
            if matches!(result, Ok(BranchOutcome::Cancelled)) {
                self.waitlist.released(&b.participant, &b.holds);
            }
            match result {
                Ok(BranchOutcome::Cancelled) => BranchReport {
                    branch_id: b.branch_id,
                    state: BranchState::Cancelled,
                    error: None,
                },
                Ok(BranchOutcome::Confirmed) => {
                    tracing::error!(reservation_id = %r.id, participant = %b.participant, "participant had confirmed a branch being released");
                    BranchReport {
                        branch_id: b.branch_id,
                        state: BranchState::Confirmed,
                        error: Some("participant had confirmed the branch".into()),
                    }
                }
                // Not an answer Cancel gives (SPEC 3.3): a failed call, retried.
                Ok(BranchOutcome::HoldLost) => BranchReport {
                    branch_id: b.branch_id,
                    state: b.state,
                    error: Some("unexpected answer HOLD_LOST to Cancel".into()),
                },
                Err(e) => BranchReport {
                    branch_id: b.branch_id,
                    state: b.state,
                    error: Some(e.message),
                },
            }
        });
        let reports = join_all(calls).await;
        let inconsistent = reports
            .iter()
            .any(|rep| rep.state == BranchState::Confirmed);
        let settled = reports.iter().all(|rep| rep.error.is_none()) || inconsistent;
        let finish = if inconsistent {
            Some(State::Failed)
        } else if settled {
            Some(r.release_outcome.unwrap_or(State::Cancelled))
        } else {
            None
        };
        faults::store("coord.record_phase.before")?;
        let phase = self
            .store
            .record_phase(
                r.id,
                State::Cancelling,
                &reports,
                finish,
                self.policy.backoff,
            )
            .await?;
        faults::store("coord.record_phase.after")?;
        if let (true, Some(to)) = (phase.finished, finish) {
            entered(&phase.reservation, to);
        }
        Ok(phase.reservation)
    }

    /// Sends the reservation's pending refund to its payment participant, once; a failure is
    /// retried by recovery with backoff until acknowledged, a permanent refusal parks it as
    /// `FAILED` (never sent again).
    pub async fn drive_refund(&self, r: Reservation) -> Result<Reservation, Error> {
        let (Some(refund), Some(payment)) = (&r.refund, &r.payment) else {
            return Ok(r);
        };
        if refund.state != RefundState::Pending {
            return Ok(r);
        }
        // Recorded (a decision, a failed retake, a lost hold) but not yet sent.
        faults::store("coord.refund.before")?;
        let answer = self.send_refund(r.id, payment, refund).await;
        faults::store("coord.refund_attempt.before")?;
        let after = self
            .store
            .record_refund_attempt(r.id, &answer, self.policy.backoff)
            .await?;
        faults::store("coord.refund_attempt.after")?;
        refund_settled(r.id, payment, refund, &answer);
        Ok(after)
    }

    /// Sends the refund of a further payment (SPEC 7.3: refunded, never dropped), once; a
    /// failure is retried by recovery with backoff until acknowledged, a permanent refusal
    /// parks it as `FAILED`.
    pub async fn drive_extra_refund(
        &self,
        id: Uuid,
        extra: ExtraPayment,
    ) -> Result<ExtraPayment, Error> {
        if extra.refund.state != RefundState::Pending {
            return Ok(extra);
        }
        let answer = self.send_refund(id, &extra.payment, &extra.refund).await;
        let after = self
            .store
            .record_extra_refund_attempt(id, &extra, &answer, self.policy.backoff)
            .await?;
        refund_settled(id, &extra.payment, &extra.refund, &answer);
        Ok(after)
    }

    /// Sends every refund still owed for the reservation's further payments.
    pub async fn drive_extra_refunds(&self, id: Uuid) -> Result<(), Error> {
        for extra in self.store.pending_extra_payments(id).await? {
            self.drive_extra_refund(id, extra).await?;
        }
        Ok(())
    }

    /// One Refund call to the payment participant, and what to record of its answer.
    async fn send_refund(&self, id: Uuid, payment: &Payment, refund: &Refund) -> RefundAnswer {
        // A refund gives funds back to some account of the payment participant (which one
        // its payment_ref says, not the coordinator): every sold-out hint of it goes.
        self.sold_out.released_all(&payment.participant);
        let sent = self.send_refund_call(id, payment, refund).await;
        self.sold_out.released_all(&payment.participant);
        sent
    }

    async fn send_refund_call(&self, id: Uuid, payment: &Payment, refund: &Refund) -> RefundAnswer {
        match self.registry.require(&payment.participant) {
            Ok(p) => match p.refund(id, payment, refund).await {
                Ok(()) => RefundAnswer::Refunded,
                Err(RefundFailure::Permanent(why)) => RefundAnswer::Refused(format!(
                    "{} refused the refund: {why}",
                    payment.participant
                )),
                Err(RefundFailure::Transient(e)) => {
                    tracing::warn!(reservation_id = %id, refund_id = %refund.refund_id, error = %e, "refund not acknowledged; will retry");
                    RefundAnswer::Retry
                }
            },
            // Removed from the configuration: not the payment service's answer, so retried
            // (with backoff) for when it is registered again; counted at start
            // (`unregistered.rs`).
            Err(_) => {
                tracing::error!(reservation_id = %id, participant = %payment.participant, "refund owed by an unregistered payment participant");
                RefundAnswer::Retry
            }
        }
    }
}

/// Counts a refund this call settled, and says so loudly when it failed for good.
fn refund_settled(id: Uuid, payment: &Payment, refund: &Refund, answer: &RefundAnswer) {
    match answer {
        RefundAnswer::Refunded => crate::telemetry::refund(RefundState::Refunded),
        RefundAnswer::Refused(why) => {
            crate::telemetry::refund(RefundState::Failed);
            tracing::error!(
                reservation_id = %id,
                refund_id = %refund.refund_id,
                participant = %payment.participant,
                payment_ref = %payment.payment_ref,
                amount_minor = refund.amount_minor,
                currency = %refund.currency,
                reason = %why,
                "REFUND FAILED: the payment service refused the refund for good; it will not be retried and a person must settle it"
            );
        }
        RefundAnswer::Retry => {}
    }
}

/// Branches that may hold something at their participant: held ones, and ones whose Try was
/// sent without a definite answer. Never-tried and rejected ones are left alone.
fn release_candidates(r: &Reservation) -> Vec<ParticipantBranch> {
    let tried: HashSet<Uuid> = r
        .branches
        .iter()
        .filter(|b| b.attempts > 0)
        .map(|b| b.branch_id)
        .collect();
    r.participant_branches()
        .into_iter()
        .filter(|b| match b.state {
            BranchState::Held => true,
            BranchState::Pending => tried.contains(&b.branch_id),
            BranchState::Rejected
            | BranchState::Cancelled
            | BranchState::Confirmed
            | BranchState::HoldLost => false,
        })
        .collect()
}
