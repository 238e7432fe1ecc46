//! Reference participant `seats`: one row per seat (capacity 1). A hold writes the holding
//! branch (the hold token) and its deadline on the seat row with an atomic conditional claim;
//! Confirm and Cancel only move seats the branch still holds.
//!
//! Each backend's SQL is in its own file (`postgres.rs`, `sqlite.rs`: the `Resource` and
//! `Inventory` impls); the rules both share are here.

mod postgres;
mod sqlite;

use crate::admin::ResourceCounts;
use crate::participant::{Item, ResourceError};

/// The seats participant's business logic and inventory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seats;

/// Checks items beyond what the SDK checks (both backends).
pub(crate) fn validate_items(items: &[Item]) -> Result<(), ResourceError> {
    for (i, item) in items.iter().enumerate() {
        if item.quantity != 1 {
            return Err(ResourceError::invalid(
                format!("items[{i}].quantity"),
                "must be 1 for a seat",
            ));
        }
        if item.during.is_some() {
            return Err(ResourceError::invalid(
                format!("items[{i}].during"),
                "must be empty for a seat",
            ));
        }
    }
    Ok(())
}

/// A seat's counts from its state (both backends).
pub(crate) fn seat_counts(resource: &str, state: &str) -> ResourceCounts {
    let (available, held, confirmed) = match state {
        "available" => (1, 0, 0),
        "held" => (0, 1, 0),
        _ => (0, 0, 1),
    };
    ResourceCounts {
        resource: resource.to_owned(),
        capacity: 1,
        available,
        held,
        confirmed,
    }
}
