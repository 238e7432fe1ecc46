//! Reference participant `stock`: interchangeable units. A Try decrements a non-negative
//! `available` counter with a guarded UPDATE (which takes the item row lock) and records a
//! quantity hold; Confirm and Cancel move units only through the hold's winning state
//! transition (a conditional UPDATE whose returned rows decide), so units never move twice.
//!
//! Each backend's SQL is in its own file (`postgres.rs`, `sqlite.rs`: the `Resource` and
//! `Inventory` impls); the rules both share are here.

mod postgres;
mod sqlite;

use crate::participant::{Item, ResourceError};

/// The stock participant's business logic and inventory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stock;

/// Checks items beyond what the SDK checks (both backends).
pub(crate) fn validate_items(items: &[Item]) -> Result<(), ResourceError> {
    match items.iter().position(|i| i.during.is_some()) {
        Some(i) => Err(ResourceError::invalid(
            format!("items[{i}].during"),
            "must be empty for stock",
        )),
        None => Ok(()),
    }
}
