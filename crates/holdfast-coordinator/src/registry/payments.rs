//! The calls a payments participant answers: a payment looked up before a Confirm records it
//! (`GetPayment`), and refunds (`Refund`), on the same channel as its TCC calls.

use tracing::Instrument;
use uuid::Uuid;

use super::{CallError, ParticipantHandle};
use crate::proto;

/// What a payments service answered about a payment (`tcc.v1.Payments/GetPayment`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PaymentLookup {
    /// The payment as recorded there.
    Found {
        reservation_id: String,
        amount_minor: i64,
        currency: String,
    },
    /// No such payment (NOT_FOUND).
    NotFound,
    /// The participant serves no `tcc.v1.Payments` (UNIMPLEMENTED).
    NotPayments,
    /// It refused the request itself (e.g. INVALID_ARGUMENT): its message.
    Refused(String),
}

impl ParticipantHandle {
    /// Reads a payment from the payment participant, to check it before a Confirm records it.
    /// `Err` only when it could not be reached (or failed): nothing can be concluded then.
    pub async fn get_payment(
        &self,
        reservation_id: Uuid,
        payment_ref: &str,
    ) -> Result<PaymentLookup, CallError> {
        let span = self.span("get_payment", reservation_id, None);
        async move {
            let req = self.request(proto::GetPaymentRequest {
                payment_ref: payment_ref.to_owned(),
            });
            let started = std::time::Instant::now();
            let result = match self.payments.clone().get_payment(req).await {
                Ok(resp) => {
                    let record = resp.into_inner();
                    Ok(PaymentLookup::Found {
                        reservation_id: record.reservation_id,
                        amount_minor: record.amount_minor,
                        currency: record.currency,
                    })
                }
                Err(s) if s.code() == tonic::Code::NotFound => Ok(PaymentLookup::NotFound),
                Err(s) if s.code() == tonic::Code::Unimplemented => Ok(PaymentLookup::NotPayments),
                Err(s) => match CallError::from_status(&s) {
                    e if e.refused => Ok(PaymentLookup::Refused(e.message)),
                    e => Err(e),
                },
            };
            crate::telemetry::branch_call(&self.name, "get_payment", started.elapsed());
            self.observe(&result);
            result
        }
        .instrument(span)
        .await
    }

    /// Asks the payment participant to refund `refund.amount_minor` of the payment; `Ok` once
    /// it acknowledged (now or on an earlier call with the same refund id). An error says
    /// whether the refusal is for good ([`RefundFailure::Permanent`], see
    /// [`refund_refusal_is_permanent`]) or worth retrying.
    pub async fn refund(
        &self,
        reservation_id: Uuid,
        payment: &crate::domain::Payment,
        refund: &crate::domain::Refund,
    ) -> Result<(), RefundFailure> {
        let span = self.span("refund", reservation_id, None);
        async move {
            let req = self.request(proto::RefundRequest {
                refund_id: refund.refund_id.to_string(),
                reservation_id: reservation_id.to_string(),
                payment_ref: payment.payment_ref.clone(),
                amount_minor: refund.amount_minor,
                currency: refund.currency.clone(),
                reason: refund.reason.clone(),
            });
            let started = std::time::Instant::now();
            let result = self.payments.clone().refund(req).await.map_err(|s| {
                let mut e = CallError::from_status(&s);
                // A permanent refusal is an answer, not a participant failing.
                e.refused = refund_refusal_is_permanent(s.code());
                e
            });
            crate::telemetry::branch_call(&self.name, "refund", started.elapsed());
            self.observe(&result);
            match result {
                Ok(resp) if resp.get_ref().state == i32::from(proto::refund::State::Refunded) => {
                    Ok(())
                }
                Ok(resp) => Err(RefundFailure::Transient(format!(
                    "payment participant answered refund state {}",
                    resp.get_ref().state
                ))),
                Err(e) if e.refused => Err(RefundFailure::Permanent(e.message)),
                Err(e) => Err(RefundFailure::Transient(e.message)),
            }
        }
        .instrument(span)
        .await
    }
}

/// Why a refund was not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefundFailure {
    /// The payments service refused it for good: the same refund can never succeed.
    #[error("{0}")]
    Permanent(String),
    /// Not this time (unreachable, timed out, failed, overloaded): retry later.
    #[error("{0}")]
    Transient(String),
}

/// Whether a payments service's refusal of a refund (its gRPC status code) is for good.
///
/// Permanent, because the identical request (a refund is sent again unchanged: same refund id,
/// payment, amount, currency) must get the same answer: `NOT_FOUND` (no such payment),
/// `INVALID_ARGUMENT` (another currency, a refund id reused for another refund),
/// `FAILED_PRECONDITION` (more than is left to refund), `UNIMPLEMENTED` (the participant
/// serves no `tcc.v1.Payments`), `OUT_OF_RANGE`, `ALREADY_EXISTS`.
/// Transient, retried with backoff: `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `INTERNAL`,
/// `RESOURCE_EXHAUSTED`, `ABORTED`, `UNKNOWN`, `CANCELLED`, `DATA_LOSS`, and also
/// `UNAUTHENTICATED`/`PERMISSION_DENIED`: the coordinator's credential is configuration an
/// operator fixes without the refund changing.
pub fn refund_refusal_is_permanent(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::NotFound
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unimplemented
            | Code::OutOfRange
            | Code::AlreadyExists
    )
}

#[cfg(test)]
mod tests {
    use super::refund_refusal_is_permanent;
    use tonic::Code;

    #[test]
    fn refusals_the_same_refund_would_meet_again_are_permanent() {
        for code in [
            Code::NotFound,
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::Unimplemented,
        ] {
            assert!(refund_refusal_is_permanent(code), "{code:?}");
        }
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Internal,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Unknown,
            Code::Unauthenticated,
            Code::PermissionDenied,
        ] {
            assert!(!refund_refusal_is_permanent(code), "{code:?}");
        }
    }
}
