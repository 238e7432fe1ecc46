//! `noop` on PostgreSQL: nothing but the barrier; counts come from it.

use async_trait::async_trait;
use sqlx::PgConnection;

use super::{Noop, noop_counts};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{
    BranchCtx, ConfirmOutcome, Resource, ResourceError, Shortcuts, TryAnswer, branch_counts,
};

#[async_trait]
impl Resource for Noop {
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

    fn shortcuts(&self) -> Option<&dyn Shortcuts> {
        Some(self)
    }
}

/// No business data: every call is the barrier's statement alone.
impl Shortcuts for Noop {
    fn barrier_only(&self) -> bool {
        true
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
