//! Reference participant `noop`: holds anything and writes only its barrier - for measuring
//! the coordinator's own cost and for users' tests.
//!
//! Admin counts are per participant, not per resource (noop keeps no resources): `held` and
//! `confirmed` count branches in those phases, `available` is 0 (unlimited is not a number),
//! and `capacity = held + confirmed`. PutResources accepts anything and changes nothing.

mod sqlite;

use async_trait::async_trait;
use sqlx::PgConnection;

use super::admin::{Inventory, ResourceCounts};
use crate::participant::{
    BranchCounts, BranchCtx, ConfirmOutcome, Resource, ResourceError, TryAnswer, branch_counts,
};

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

#[async_trait]
impl Resource for Noop {
    fn barrier_only(&self) -> bool {
        true
    }

    async fn try_hold(
        &self,
        _conn: &mut PgConnection,
        _branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        _conn: &mut PgConnection,
        _branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        Ok(ConfirmOutcome::Confirmed)
    }

    async fn cancel(
        &self,
        _conn: &mut PgConnection,
        _branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        Ok(())
    }
}

#[async_trait]
impl Inventory for Noop {
    async fn put(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        _capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        Inventory::<sqlx::Postgres>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal("noop counts missing".to_owned()))
    }

    async fn get(
        &self,
        conn: &mut PgConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        let counts = branch_counts(conn, &self.name).await?;
        Ok(Some(noop_counts(resource, counts)))
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
