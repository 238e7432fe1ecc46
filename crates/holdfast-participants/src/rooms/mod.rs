//! Reference participant `rooms`: time-slot holds over half-open intervals `[start, end)`.
//! Each room row is the lock target; the partial exclusion constraint `slot_hold_no_overlap`
//! (btree_gist over room and tstzrange) rejects overlapping active holds even if the lock
//! protocol were bypassed. Adjacent slots coexist; a cancelled hold frees its slot.
//!
//! Admin counts: a room has capacity 1 and is counted *at the current instant*: `held` is 1
//! when a held slot covers now, `confirmed` is 1 when a confirmed slot covers now, and
//! `available = 1 - held - confirmed`. Future slots do not show in these counts.
//!
//! Each backend's SQL is in its own file (`postgres.rs`, `sqlite.rs`: the `Resource` and
//! `Inventory` impls); the rules both share are here.

mod postgres;
mod sqlite;

use crate::participant::{BranchCtx, Item, ResourceError};

/// The rooms participant's business logic and inventory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rooms;

pub(crate) fn room_ids(branch: &BranchCtx) -> Vec<String> {
    let mut rooms: Vec<String> = branch.items.iter().map(|i| i.resource.clone()).collect();
    rooms.dedup();
    rooms
}

/// Checks items beyond what the SDK checks (both backends).
pub(crate) fn validate_items(items: &[Item]) -> Result<(), ResourceError> {
    for (i, item) in items.iter().enumerate() {
        if item.quantity != 1 {
            return Err(ResourceError::invalid(
                format!("items[{i}].quantity"),
                "must be 1 for a room",
            ));
        }
        if item.during.is_none() {
            return Err(ResourceError::invalid(
                format!("items[{i}].during"),
                "is required for a room",
            ));
        }
    }
    Ok(())
}
