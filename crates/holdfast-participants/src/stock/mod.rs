//! Reference participant `stock`: interchangeable units. A Try decrements a non-negative
//! `available` counter with a guarded UPDATE (which takes the item row lock) and records a
//! quantity hold; Confirm and Cancel move units only through the hold's winning state
//! transition (a conditional UPDATE whose returned rows decide), so units never move twice.
//!
//! Each backend's SQL is in its own file (`postgres.rs`, `sqlite.rs`: the `Resource` and
//! `Inventory` impls); the rules both share are here.

mod postgres;
mod sqlite;

use std::collections::HashMap;

use crate::participant::{BranchCtx, Item, ResourceError, TryAnswer};

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

/// Why a Try of `item` was refused, given the units `available` (`None`: no such item).
pub(crate) fn refusal(item: &Item, available: Option<i64>) -> TryAnswer {
    TryAnswer::Rejected(match available {
        Some(n) => format!(
            "insufficient stock of {}: {} requested, {n} available",
            item.resource, item.quantity
        ),
        None => format!("item {} does not exist", item.resource),
    })
}

/// A batch of Tries against the units left per item (as locked), in arrival order:
/// each branch is held, all its items or none, if what is left covers it; a branch that does
/// not fit does not stop a later, smaller one. Items missing from `left` do not exist. A
/// branch names each item once (the SDK refuses duplicates, and stock items have no slots), so
/// checking its items one by one against `left` is checking their sum.
pub(crate) fn allocate(mut left: HashMap<String, i64>, branches: &[&BranchCtx]) -> Vec<TryAnswer> {
    branches
        .iter()
        .map(|branch| {
            let short = branch.items.iter().find_map(|item| {
                let n = left.get(&item.resource).copied();
                (n.unwrap_or(0) < item.quantity).then(|| refusal(item, n))
            });
            match short {
                Some(refused) => refused,
                None => {
                    for item in &branch.items {
                        if let Some(n) = left.get_mut(&item.resource) {
                            *n -= item.quantity;
                        }
                    }
                    TryAnswer::Held
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::participant::BranchKey;

    fn branch(id: &str, items: &[(&str, i64)]) -> BranchCtx {
        BranchCtx {
            key: BranchKey {
                reservation_id: id.into(),
                branch_id: id.into(),
            },
            holder: "h".into(),
            items: items
                .iter()
                .map(|(resource, quantity)| Item {
                    resource: (*resource).into(),
                    quantity: *quantity,
                    during: None,
                })
                .collect(),
            expires_at: chrono::Utc::now(),
            hold_until: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_batch_takes_units_in_arrival_order_all_of_a_branch_or_none() {
        let available = HashMap::from([("a".to_string(), 3), ("b".to_string(), 1)]);
        let branches = [
            branch("1", &[("a", 2)]),
            branch("2", &[("a", 2)]),           // 1 left: refused
            branch("3", &[("a", 1), ("b", 2)]), // b short: refused, takes no a
            branch("4", &[("a", 1), ("b", 1)]), // the last a and b
            branch("5", &[("c", 1)]),           // no such item
            branch("6", &[("b", 1)]),           // none left
        ];
        let refs: Vec<&BranchCtx> = branches.iter().collect();
        let held: Vec<bool> = allocate(available.clone(), &refs)
            .iter()
            .map(|a| *a == TryAnswer::Held)
            .collect();
        assert_eq!(held, [true, false, false, true, false, false]);
        let reasons = allocate(available, &refs);
        assert_eq!(
            reasons[1],
            TryAnswer::Rejected("insufficient stock of a: 2 requested, 1 available".into())
        );
        assert_eq!(
            reasons[4],
            TryAnswer::Rejected("item c does not exist".into())
        );
    }
}
