//! Reference participant `payments`: account balances in minor units. Try authorises
//! (moves the amount from `available` to `authorised` with a guarded UPDATE), Confirm captures
//! (`authorised` -> `captured`), Cancel voids (`authorised` -> `available`), each through the
//! authorisation's winning state transition. Also `tcc.v1.Payments`: `Charge` captures for a
//! reservation outside the coordinator (the payment keeps its `reservation_id`), `Refund`
//! returns captured money exactly once per `refund_id` and never more than was captured,
//! `GetPayment` reads a payment with its refunds and its reservation.
//!
//! Admin counts: capacity = the account's balance = available + authorised (held) + captured
//! (confirmed). Accounts carry no currency; a payment carries the currency it was charged in.
//!
//! Each backend's SQL is in its own file (`postgres.rs`, `sqlite.rs`: the `Resource`,
//! `Inventory` and [`PaymentsSql`] impls); `service.rs` is the `tcc.v1.Payments` service and
//! the refund rules both backends apply; the item rule both share is here.

mod postgres;
mod service;
mod sqlite;

use crate::participant::{Item, ResourceError};

pub(crate) use service::{PaymentsService, PaymentsSql};

/// The payments participant's business logic and inventory (accounts).
#[derive(Clone, Copy, Debug, Default)]
pub struct Payments;

/// Checks items beyond what the SDK checks (both backends).
pub(crate) fn validate_items(items: &[Item]) -> Result<(), ResourceError> {
    match items.iter().position(|i| i.during.is_some()) {
        Some(i) => Err(ResourceError::invalid(
            format!("items[{i}].during"),
            "must be empty for a payment",
        )),
        None => Ok(()),
    }
}
