//! Further payments (SPEC 7.3: a second, different payment for a confirmed or refunded
//! reservation is refunded, never dropped), written once for both databases: a stored row into
//! the domain type, the refunds still owed, and the record of a refund attempt. (Recording
//! one is part of the locked decision, `decide.rs`.)

use uuid::Uuid;

use super::sql::PaymentSql;
use super::{RefundAnswer, StoreError};
use crate::db::WriteTransaction;
use crate::domain::policy::Backoff;
use crate::domain::{ExtraPayment, Payment, Refund, RefundState};

/// An `extra_payments` row as both databases read it: (reservation_id, payment_participant,
/// payment_ref, amount_minor, currency, refund_id, refund_state, refund_reason,
/// refund_failure).
pub(crate) type ExtraRow = (
    Uuid,
    String,
    String,
    i64,
    String,
    Uuid,
    String,
    String,
    Option<String>,
);

/// A stored further payment, with the reservation it is on.
pub(crate) fn extra_payment(row: ExtraRow) -> Result<(Uuid, ExtraPayment), StoreError> {
    let (
        reservation_id,
        participant,
        payment_ref,
        amount_minor,
        currency,
        refund_id,
        state,
        reason,
        failure,
    ) = row;
    let state = RefundState::parse(&state).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "further payment {payment_ref}: unknown refund_state {state:?}"
        ))
    })?;
    let refund = Refund {
        refund_id,
        state,
        amount_minor,
        currency: currency.clone(),
        reason,
        failure,
    };
    let payment = Payment {
        participant,
        payment_ref,
        amount_minor,
        currency,
    };
    Ok((reservation_id, ExtraPayment { payment, refund }))
}

/// [`crate::store::Store::record_extra_refund_attempt`].
///
/// One lock order with the locked decision (`decide.rs`), which locks the reservation's row
/// and then inserts a further payment: the reservation's row first (when the lease is given
/// up), the further payment's row after. The other way round, a Confirm repeating a payment
/// whose refund is being recorded waited for this transaction's `extra_payments` row while
/// holding the reservation's, and this one waited for the reservation's: a deadlock.
pub(crate) async fn record_extra_refund_attempt<DB: PaymentSql>(
    pool: &DB::Pool,
    id: Uuid,
    extra: &ExtraPayment,
    answer: &RefundAnswer,
    backoff: Backoff,
) -> Result<ExtraPayment, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    DB::release_terminal_lease(&mut tx, id).await?;
    DB::record_extra_refund_attempt(&mut tx, extra, answer, backoff).await?;
    let after = DB::load_extra_payment(&mut tx, &extra.payment).await?;
    tx.commit().await?;
    match after {
        Some((_, after)) => Ok(after),
        None => Err(StoreError::Corrupt(format!(
            "further payment {} of reservation {id} vanished",
            extra.payment.payment_ref
        ))),
    }
}
