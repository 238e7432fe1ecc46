//! The operator's control plane in domain terms (SPEC 8.1, `tcc.v1.Admin`): the audited
//! actions, an audit entry, what a stuck-work listing and a Retry ask for, and their input
//! rules (each error names the field).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::State;
use super::validate::FieldError;

/// What an operator did, as recorded in the audit log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAction {
    ForceCancel,
    ResolveConfirmed,
    ResolveCancelled,
    Retry,
}

impl AdminAction {
    /// The stored and wire name (`AuditEntry.action`).
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAction::ForceCancel => "force_cancel",
            AdminAction::ResolveConfirmed => "resolve_confirmed",
            AdminAction::ResolveCancelled => "resolve_cancelled",
            AdminAction::Retry => "retry",
        }
    }

    pub fn parse(s: &str) -> Option<AdminAction> {
        [
            AdminAction::ForceCancel,
            AdminAction::ResolveConfirmed,
            AdminAction::ResolveCancelled,
            AdminAction::Retry,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// One recorded admin action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// Its place in the log (newest highest); the cursor of `ListAudit`.
    pub seq: i64,
    /// The reservation acted on; `None` for a Retry of every reservation at a participant.
    pub reservation_id: Option<Uuid>,
    pub principal: String,
    /// Database clock.
    pub at: DateTime<Utc>,
    pub action: AdminAction,
    pub reason: String,
    /// A Retry by participant: the participant named.
    pub participant: Option<String>,
}

/// Who acted and why, to record with the change in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditNote {
    pub principal: String,
    pub action: AdminAction,
    pub reason: String,
    pub participant: Option<String>,
}

/// The principal recorded for an actor: its name, or `local` with authentication off.
pub fn audit_principal(principal: &str) -> String {
    if principal.is_empty() {
        "local".to_owned()
    } else {
        principal.to_owned()
    }
}

/// What Retry drives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryTarget {
    Reservation(Uuid),
    /// Every reservation with unfinished work at this participant.
    Participant(String),
}

/// Filters and paging of `ListStuck`.
#[derive(Clone, Debug, Default)]
pub struct StuckQuery {
    /// Only these stored states (empty: every non-terminal state and `FAILED`).
    pub states: Vec<State>,
    pub participant: Option<String>,
    /// Past the due time by at least this much.
    pub older_than: Duration,
    pub limit: u32,
    /// Keyset cursor: strictly after this (created_at, id), newest first.
    pub after: Option<(DateTime<Utc>, Uuid)>,
}

/// Filters and paging of `ListAudit`.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    pub reservation_id: Option<Uuid>,
    pub limit: u32,
    /// Keyset cursor: entries strictly older than this `seq`.
    pub before: Option<i64>,
}

/// The most bytes an operator's reason may have.
pub const MAX_REASON_BYTES: usize = 256;

/// An operator's reason: required, 1..=256 bytes, no NUL.
pub fn admin_reason(value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new("reason", "is required"));
    }
    if value.len() > MAX_REASON_BYTES {
        return Err(FieldError::new(
            "reason",
            format!("must be at most {MAX_REASON_BYTES} bytes"),
        ));
    }
    if value.contains('\0') {
        return Err(FieldError::new("reason", "must not contain NUL"));
    }
    Ok(())
}

/// The states `ListStuck` may filter on: the non-terminal ones and `FAILED`.
pub fn stuck_state(field: &str, state: State) -> Result<State, FieldError> {
    match state {
        State::Trying | State::Held | State::Confirming | State::Cancelling | State::Failed => {
            Ok(state)
        }
        other => Err(FieldError::new(
            field,
            format!(
                "must be TRYING, HELD, CONFIRMING, CANCELLING or FAILED (stuck work), not {other}"
            ),
        )),
    }
}

/// A `Resolve` outcome: `CONFIRMED` or `CANCELLED`.
pub fn resolve_outcome(state: Option<State>) -> Result<AdminAction, FieldError> {
    match state {
        Some(State::Confirmed) => Ok(AdminAction::ResolveConfirmed),
        Some(State::Cancelled) => Ok(AdminAction::ResolveCancelled),
        _ => Err(FieldError::new("outcome", "must be CONFIRMED or CANCELLED")),
    }
}

/// A participant name given to an admin method: required, at most 128 bytes.
pub fn participant_name(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new(field, "is required"));
    }
    if value.len() > 128 {
        return Err(FieldError::new(field, "must be at most 128 bytes"));
    }
    if value.contains('\0') {
        return Err(FieldError::new(field, "must not contain NUL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_required_and_bounded() {
        assert_eq!(admin_reason("").unwrap_err().field, "reason");
        assert!(admin_reason(&"x".repeat(256)).is_ok());
        assert!(admin_reason(&"x".repeat(257)).is_err());
        assert!(admin_reason("a\0b").is_err());
    }

    #[test]
    fn actions_round_trip() {
        for a in [
            AdminAction::ForceCancel,
            AdminAction::ResolveConfirmed,
            AdminAction::ResolveCancelled,
            AdminAction::Retry,
        ] {
            assert_eq!(AdminAction::parse(a.as_str()), Some(a));
        }
    }
}

/// Reservations by state, read from the database (the console's overview): every live one, and
/// those created in the last hour per minute. Each count is one walk of a small index: the live
/// ones of `reservations_open` (partial: non-terminal rows only), the last hour's a range of
/// `reservations_by_created`; never the whole table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Not terminal, by state as read: a `HELD` one past `expires_at` counts as `EXPIRED`
    /// (its release not yet run).
    pub live: Vec<(State, i64)>,
    /// Created in the last hour, by the minute they were created in (oldest first) and the
    /// state they are in now (as read).
    pub minutes: Vec<(DateTime<Utc>, State, i64)>,
    /// When they were counted (database clock).
    pub at: DateTime<Utc>,
}

/// Most resources one inventory read asks their participants about.
pub(crate) const MAX_INVENTORY_ITEMS: usize = 50;

/// A resource's stock levels as its participant counts them (`tcc.v1.ResourceAdmin`):
/// capacity = available + held + confirmed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StockLevels {
    pub capacity: i64,
    pub available: i64,
    pub held: i64,
    pub confirmed: i64,
}

/// One line of the inventory: a participant's resource and its levels, or why they could not
/// be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryLine {
    pub participant: String,
    pub resource: String,
    pub levels: Result<StockLevels, String>,
}

/// The resources an inventory read asks about: 1 to [`MAX_INVENTORY_ITEMS`] (participant,
/// resource) pairs, each name 1..128 bytes.
pub(crate) fn inventory_items(items: &[(String, String)]) -> Result<(), FieldError> {
    if items.is_empty() || items.len() > MAX_INVENTORY_ITEMS {
        return Err(FieldError::new(
            "resources",
            format!(
                "must name 1 to {MAX_INVENTORY_ITEMS} resources (got {})",
                items.len()
            ),
        ));
    }
    for (i, (participant, resource)) in items.iter().enumerate() {
        for (part, value) in [("participant", participant), ("resource", resource)] {
            if value.is_empty() || value.len() > 128 {
                return Err(FieldError::new(
                    format!("resources[{i}].{part}"),
                    "must be 1..128 bytes",
                ));
            }
        }
    }
    Ok(())
}

/// Where a reservation's unfinished work stands (stuck work): when the coordinator drives it
/// next (`None`: not scheduled, e.g. waiting for its hold to lapse) and how many times the
/// sweep has driven it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkState {
    pub reservation_id: Uuid,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub attempts: i32,
}
