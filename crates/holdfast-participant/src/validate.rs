//! What every participant checks of a Try before it touches data - ids, how far ahead
//! `expires_at` lies (`--max-hold`), the items (some, not too many, named, positive, proper
//! slots, no duplicates), then the resource's own rules - and the lock order its items are put
//! in. Errors name the offending field as the caller sent it
//! (`items[2].quantity`).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Item, ResourceError, Slot, TryBranch};

/// Longest identifier accepted (reservation, branch, holder, resource), in bytes.
pub const MAX_ID_BYTES: usize = 128;
/// Most items in one Try (the coordinator allows 64 holds per reservation).
const MAX_ITEMS: usize = 64;

/// Checks a Try's ids, its `expires_at` against `max_hold` and its items, then the resource's
/// own rules (`validate`, given the items in the caller's order so its field names index the
/// caller's list), and sorts the items into lock order: by resource, then slot start.
pub fn check_try(
    request: TryBranch,
    max_hold: Duration,
    validate: impl FnOnce(&[Item]) -> Result<(), ResourceError>,
) -> Result<TryBranch, ResourceError> {
    check_try_at(request, max_hold, Utc::now(), validate)
}

/// [`check_try`] with `expires_at` bounded from `now` (a participant's
/// [`super::ParticipantClock`]).
pub fn check_try_at(
    request: TryBranch,
    max_hold: Duration,
    now: DateTime<Utc>,
    validate: impl FnOnce(&[Item]) -> Result<(), ResourceError>,
) -> Result<TryBranch, ResourceError> {
    check_id("reservation_id", &request.key.reservation_id)?;
    check_id("branch_id", &request.key.branch_id)?;
    check_id("holder", &request.holder)?;
    check_max_hold(request.expires_at, max_hold, now)?;
    let mut items = request.items;
    check_items(&items)?;
    validate(&items)?;
    // Items arrive sorted; sort again so a careless caller cannot break the lock order.
    items.sort_by(|a, b| (&a.resource, a.during).cmp(&(&b.resource, b.during)));
    Ok(TryBranch { items, ..request })
}

/// Refuses an `expires_at` more than `max_hold` after `now` (SPEC 7.3, `--max-hold`): a
/// participant never grants a hold longer than it allows, whatever a caller asks. A bound on
/// input, not an expiry decision, so this host's clock is good enough (a skew of seconds
/// against a bound of hours changes nothing).
pub fn check_max_hold(
    expires_at: DateTime<Utc>,
    max_hold: Duration,
    now: DateTime<Utc>,
) -> Result<(), ResourceError> {
    let too_far = chrono::Duration::from_std(max_hold)
        .ok()
        .and_then(|bound| now.checked_add_signed(bound))
        .is_some_and(|latest| expires_at > latest);
    if too_far {
        return Err(ResourceError::invalid(
            "expires_at",
            format!(
                "lies more than {}s ahead, further than this participant holds (--max-hold)",
                max_hold.as_secs()
            ),
        ));
    }
    Ok(())
}

/// Checks an identifier: present and at most [`MAX_ID_BYTES`] bytes.
pub fn check_id(field: &str, value: &str) -> Result<(), ResourceError> {
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
