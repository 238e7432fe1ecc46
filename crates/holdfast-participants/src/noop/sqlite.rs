//! `noop` on SQLite: nothing but the barrier; counts come from it.

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection};

use super::{Noop, noop_counts};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{
    Backend, BranchCtx, ConfirmOutcome, Resource, ResourceError, Shortcuts, TryAnswer,
};

#[async_trait]
impl Resource<Sqlite> for Noop {
    async fn try_hold(
        &self,
        _conn: &mut SqliteConnection,
        _branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        _conn: &mut SqliteConnection,
        _branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        Ok(ConfirmOutcome::Confirmed)
    }

    async fn cancel(
        &self,
        _conn: &mut SqliteConnection,
        _branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        Ok(())
    }

    fn shortcuts(&self) -> Option<&dyn Shortcuts<Sqlite>> {
        Some(self)
    }
}

/// No business data: every call is the barrier's statement alone.
impl Shortcuts<Sqlite> for Noop {
    fn barrier_only(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inventory<Sqlite> for Noop {
    async fn put(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
        _capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        Inventory::<Sqlite>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal("noop counts missing".to_owned()))
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        let counts = Sqlite::branch_counts(conn, &self.name).await?;
        Ok(Some(noop_counts(resource, counts)))
    }
}
