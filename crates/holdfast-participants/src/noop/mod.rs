//! Reference participant `noop`: holds anything and writes only its barrier - for measuring
//! the coordinator's own cost and for users' tests.
//!
//! Admin counts are per participant, not per resource (noop keeps no resources): `held` and
//! `confirmed` count branches in those phases, `available` is 0 (unlimited is not a number),
//! and `capacity = held + confirmed`. PutResources accepts anything and changes nothing.
//!
//! Each backend's impls are in its own file (`postgres.rs`, `sqlite.rs`); the counts both
//! share are here.

mod postgres;
mod sqlite;

use crate::admin::ResourceCounts;
use crate::participant::BranchCounts;

/// The noop participant: no business data at all.
#[derive(Clone, Debug)]
pub struct Noop {
    name: String,
}

impl Noop {
    /// A noop participant whose barrier rows are scoped by `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// Noop's counts from its branch counts (both backends).
pub(crate) fn noop_counts(resource: &str, counts: BranchCounts) -> ResourceCounts {
    ResourceCounts {
        resource: resource.to_owned(),
        capacity: counts.held + counts.confirmed,
        available: 0,
        held: counts.held,
        confirmed: counts.confirmed,
    }
}
