//! Payments are bound to reservations (SPEC 7.3): before a Confirm records a payment, the
//! coordinator asks the payment participant (`tcc.v1.Payments/GetPayment`) whether the payment
//! exists, was made for this reservation, in this currency and amount. Anything else is
//! `PAYMENT_MISMATCH`; a payments service that cannot be reached leaves the decision untaken.

use uuid::Uuid;

use super::{Coordinator, Error};
use crate::domain::Payment;
use crate::registry::PaymentLookup;

impl Coordinator {
    /// Checks `p` with its payments service for reservation `id`. Changes nothing.
    pub(super) async fn verify_payment(&self, id: Uuid, p: &Payment) -> Result<(), Error> {
        let mismatch =
            |check: &'static str, problem: String| Error::PaymentMismatch { id, check, problem };
        let participant = self.registry.require(&p.participant).map_err(|e| {
            mismatch(
                "payments_service",
                format!("payment.participant: {}", e.message),
            )
        })?;
        let lookup = participant
            .get_payment(id, &p.payment_ref)
            .await
            .map_err(|e| Error::PaymentUnverified {
                id,
                participant: p.participant.clone(),
                detail: e.message,
            })?;
        match lookup {
            PaymentLookup::NotPayments => Err(mismatch(
                "payments_service",
                format!(
                    "payment.participant {:?} is not a payments service (it does not serve tcc.v1.Payments)",
                    p.participant
                ),
            )),
            PaymentLookup::NotFound => Err(mismatch(
                "exists",
                format!(
                    "payment.payment_ref {:?} does not exist at {}",
                    p.payment_ref, p.participant
                ),
            )),
            PaymentLookup::Refused(why) => Err(mismatch(
                "exists",
                format!(
                    "{} refused to look up payment.payment_ref {:?}: {why}",
                    p.participant, p.payment_ref
                ),
            )),
            PaymentLookup::Found { reservation_id, .. } if reservation_id != id.to_string() => {
                Err(mismatch(
                    "reservation",
                    if reservation_id.is_empty() {
                        format!(
                            "payment {:?} was made for no reservation (charge it with reservation_id {id})",
                            p.payment_ref
                        )
                    } else {
                        format!(
                            "payment {:?} was made for another reservation",
                            p.payment_ref
                        )
                    },
                ))
            }
            PaymentLookup::Found { currency, .. } if currency != p.currency => Err(mismatch(
                "currency",
                format!(
                    "payment.currency is {} but payment {:?} was made in {currency}",
                    p.currency, p.payment_ref
                ),
            )),
            PaymentLookup::Found { amount_minor, .. } if amount_minor != p.amount_minor => {
                Err(mismatch(
                    "amount",
                    format!(
                        "payment.amount_minor is {} but payment {:?} is of {amount_minor}",
                        p.amount_minor, p.payment_ref
                    ),
                ))
            }
            PaymentLookup::Found { .. } => Ok(()),
        }
    }
}
