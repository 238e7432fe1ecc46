//! What every participant checks of a Try before it touches data - ids, the items (some, not
//! too many, named, positive, proper slots, no duplicates), then the resource's own rules - and
//! the lock order its items are put in. Errors name the offending field as the caller sent it
//! (`items[2].quantity`).

use std::collections::HashMap;

use super::{Item, ResourceError, Slot, TryBranch};

/// Longest identifier accepted (reservation, branch, holder, resource), in bytes.
pub(crate) const MAX_ID_BYTES: usize = 128;
/// Most items in one Try (the coordinator allows 64 holds per reservation).
const MAX_ITEMS: usize = 64;

/// Checks a Try's ids and items, then the resource's own rules (`validate`, given the items in
/// the caller's order so its field names index the caller's list), and sorts the items into
/// lock order: by resource, then slot start.
pub(crate) fn check_try(
    request: TryBranch,
    validate: impl FnOnce(&[Item]) -> Result<(), ResourceError>,
) -> Result<TryBranch, ResourceError> {
    check_id("reservation_id", &request.key.reservation_id)?;
    check_id("branch_id", &request.key.branch_id)?;
    check_id("holder", &request.holder)?;
    let mut items = request.items;
    check_items(&items)?;
    validate(&items)?;
    // Items arrive sorted; sort again so a careless caller cannot break the lock order.
    items.sort_by(|a, b| (&a.resource, a.during).cmp(&(&b.resource, b.during)));
    Ok(TryBranch { items, ..request })
}

/// Checks an identifier: present and at most [`MAX_ID_BYTES`] bytes.
pub(crate) fn check_id(field: &str, value: &str) -> Result<(), ResourceError> {
    if value.is_empty() {
        return Err(ResourceError::invalid(field, "is required"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(ResourceError::invalid(
            field,
            format!("must be at most {MAX_ID_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Checks what every participant needs of items: some, not too many, named, positive,
/// proper slots, no duplicates.
fn check_items(items: &[Item]) -> Result<(), ResourceError> {
    if items.is_empty() {
        return Err(ResourceError::invalid("items", "must not be empty"));
    }
    if items.len() > MAX_ITEMS {
        return Err(ResourceError::invalid(
            "items",
            format!("must hold at most {MAX_ITEMS} items"),
        ));
    }
    let mut seen: HashMap<(&str, Option<Slot>), usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        check_id(&format!("items[{i}].resource"), &item.resource)?;
        if item.quantity < 1 {
            return Err(ResourceError::invalid(
                format!("items[{i}].quantity"),
                "must be >= 1",
            ));
        }
        if let Some(slot) = item.during
            && slot.end <= slot.start
        {
            return Err(ResourceError::invalid(
                format!("items[{i}].during.end"),
                "must be after during.start",
            ));
        }
        if let Some(first) = seen.insert((item.resource.as_str(), item.during), i) {
            return Err(ResourceError::invalid(
                format!("items[{i}]"),
                format!("duplicates items[{first}]"),
            ));
        }
    }
    Ok(())
}
