//! The money trail of a reservation (SPEC 3.1 `Reservation.payments`): every payment a Confirm
//! cited that was verified and recorded - the reservation's own payment and each further one -
//! with what became of it.

use uuid::Uuid;

use super::{ExtraPayment, Payment, RefundState, Reservation};

/// What became of a recorded payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaymentState {
    /// The reservation's payment, not refunded: confirmed with it, or being honoured.
    Applied,
    /// Refunded, the payment participant has not acknowledged it yet.
    RefundPending,
    /// Refunded and acknowledged.
    Refunded,
    /// The payment participant refused the refund for good.
    RefundFailed,
}

impl PaymentState {
    /// The state of a payment whose refund is in `state`.
    fn of_refund(state: RefundState) -> PaymentState {
        match state {
            RefundState::Pending => PaymentState::RefundPending,
            RefundState::Refunded => PaymentState::Refunded,
            RefundState::Failed => PaymentState::RefundFailed,
        }
    }
}

/// A recorded payment and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentRecord {
    pub payment: Payment,
    pub state: PaymentState,
    /// Its refund's idempotency key; `None` while applied.
    pub refund_id: Option<Uuid>,
}

impl PaymentRecord {
    /// A further payment: never applied, always refunded.
    fn further(extra: &ExtraPayment) -> PaymentRecord {
        PaymentRecord {
            payment: extra.payment.clone(),
            state: PaymentState::of_refund(extra.refund.state),
            refund_id: Some(extra.refund.refund_id),
        }
    }
}

impl Reservation {
    /// Every recorded payment, oldest first: its own (applied unless its refund is recorded),
    /// then the further ones that were read ([`Reservation::further_payments`]).
    pub fn payments(&self) -> Vec<PaymentRecord> {
        let own = self.payment.as_ref().map(|payment| match &self.refund {
            Some(refund) => PaymentRecord {
                payment: payment.clone(),
                state: PaymentState::of_refund(refund.state),
                refund_id: Some(refund.refund_id),
            },
            None => PaymentRecord {
                payment: payment.clone(),
                state: PaymentState::Applied,
                refund_id: None,
            },
        });
        let further = self.further_payments.iter().flatten();
        own.into_iter()
            .chain(further.map(PaymentRecord::further))
            .collect()
    }

    /// Whether further payments may be recorded for it, so a reader must look them up: only
    /// once it left `TRYING`/`HELD` (a further payment needs a decided or retaken
    /// reservation), unless they were read already.
    pub fn may_have_further_payments(&self) -> bool {
        self.further_payments.is_none()
            && !matches!(self.stored_state, super::State::Trying | super::State::Held)
    }
}
