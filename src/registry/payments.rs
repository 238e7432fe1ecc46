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
    /// it acknowledged (now or on an earlier call with the same refund id).
    pub async fn refund(
        &self,
        reservation_id: Uuid,
        payment: &crate::domain::Payment,
        refund: &crate::domain::Refund,
    ) -> Result<(), CallError> {
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
            let result = self
                .payments
                .clone()
                .refund(req)
                .await
                .map_err(|s| CallError::from_status(&s));
            crate::telemetry::branch_call(&self.name, "refund", started.elapsed());
            self.observe(&result);
            let resp = result?;
            if resp.get_ref().state == i32::from(proto::refund::State::Refunded) {
                Ok(())
            } else {
                Err(CallError::protocol(format!(
                    "payment participant answered refund state {}",
                    resp.get_ref().state
                )))
            }
        }
        .instrument(span)
        .await
    }
}
