//! `tcc.v1.ResourceAdmin` for the reference participants: a generic service over an
//! [`Inventory`], the per-participant SQL that creates, resizes and counts resources.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{Pool, Postgres};
use tonic::{Request, Response, Status};

use crate::db::WriteTransaction;
use crate::participant::validate::check_id;
use crate::participant::{Backend, ResourceError};
use crate::proto::resource_admin_server::ResourceAdmin;
use crate::proto::{GetResourceRequest, PutResourcesRequest, PutResourcesResponse, ResourceStatus};

/// One resource's counts. Invariant: `capacity = available + held + confirmed`. Where a kind
/// keeps units in a counter (`stock`, `payments`), `capacity` is the stored fact PutResources
/// set, `available` the counter Try takes from and `held`/`confirmed` are summed from the
/// hold rows, so the invariant is a real cross-check: a lost or duplicated unit breaks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceCounts {
    /// Resource id.
    pub resource: String,
    /// Total units.
    pub capacity: i64,
    /// Units that can be held now.
    pub available: i64,
    /// Units held by live holds.
    pub held: i64,
    /// Units sold / captured.
    pub confirmed: i64,
}

impl ResourceCounts {
    /// Counts from a row of `capacity`, `available`, `held`, `confirmed` (any database).
    pub(crate) fn from_row<'r, R: sqlx::Row>(
        resource: &str,
        row: &'r R,
    ) -> Result<Self, ResourceError>
    where
        &'r str: sqlx::ColumnIndex<R>,
        i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Self {
            resource: resource.to_owned(),
            capacity: row.try_get("capacity")?,
            available: row.try_get("available")?,
            held: row.try_get("held")?,
            confirmed: row.try_get("confirmed")?,
        })
    }
}

impl From<ResourceCounts> for ResourceStatus {
    fn from(c: ResourceCounts) -> Self {
        ResourceStatus {
            resource: c.resource,
            capacity: c.capacity,
            available: c.available,
            held: c.held,
            confirmed: c.confirmed,
        }
    }
}

/// Resource administration SQL of one reference participant on database `DB`
/// (PostgreSQL by default, or SQLite).
#[async_trait]
pub trait Inventory<DB: Backend = Postgres>: Send + Sync + 'static {
    /// Why `capacity` is not acceptable for this kind of resource, if it is not.
    fn check_capacity(&self, capacity: i64) -> Result<(), String> {
        non_negative(capacity)
    }

    /// Creates `resource` with `capacity`, or resizes it; refuses (FailedPrecondition) a
    /// capacity below what is held and confirmed. Runs in the caller's transaction.
    async fn put(
        &self,
        conn: &mut DB::Connection,
        resource: &str,
        capacity: i64,
    ) -> Result<ResourceCounts, ResourceError>;

    /// Reads one resource's counts; `None` when it does not exist.
    async fn get(
        &self,
        conn: &mut DB::Connection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError>;
}

/// The `tcc.v1.ResourceAdmin` service over an [`Inventory`].
pub struct AdminService<I, DB: Backend = Postgres> {
    inventory: Arc<I>,
    pool: Pool<DB>,
}

impl<DB: Backend, I: Inventory<DB>> AdminService<I, DB> {
    /// Administers `inventory`'s resources in `pool`.
    pub fn new(inventory: Arc<I>, pool: Pool<DB>) -> Self {
        Self { inventory, pool }
    }

    /// Applies every spec in one transaction, in resource order (the lock order), all or
    /// nothing.
    async fn put_all(
        &self,
        req: PutResourcesRequest,
    ) -> Result<Vec<ResourceCounts>, ResourceError> {
        let specs = checked_specs(
            req.resources
                .into_iter()
                .map(|spec| (spec.resource, spec.capacity))
                .collect(),
            |capacity| self.inventory.check_capacity(capacity),
        )?;
        let mut tx = DB::begin_write(&self.pool).await?;
        let mut out = Vec::with_capacity(specs.len());
        for (resource, capacity) in &specs {
            out.push(self.inventory.put(&mut *tx, resource, *capacity).await?);
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// The capacity rule of most resources: any number of units, none included.
pub(crate) fn non_negative(capacity: i64) -> Result<(), String> {
    if capacity < 0 {
        return Err("must be >= 0".to_owned());
    }
    Ok(())
}

/// Checks the specs of a PutResources - some, each resource named and its capacity acceptable
/// to `check_capacity`, no resource twice (field names index the caller's list) - and sorts
/// them by resource, the lock order.
pub(crate) fn checked_specs(
    specs: Vec<(String, i64)>,
    check_capacity: impl Fn(i64) -> Result<(), String>,
) -> Result<Vec<(String, i64)>, ResourceError> {
    if specs.is_empty() {
        return Err(ResourceError::invalid("resources", "must not be empty"));
    }
    let mut sorted = Vec::with_capacity(specs.len());
    for (i, (resource, capacity)) in specs.into_iter().enumerate() {
        check_id(&format!("resources[{i}].resource"), &resource)?;
        check_capacity(capacity)
            .map_err(|msg| ResourceError::invalid(format!("resources[{i}].capacity"), msg))?;
        sorted.push((resource, capacity, i));
    }
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ResourceError::invalid(
            format!("resources[{}].resource", w[1].2),
            format!("duplicates resources[{}]", w[0].2),
        ));
    }
    Ok(sorted
        .into_iter()
        .map(|(resource, capacity, _)| (resource, capacity))
        .collect())
}

#[tonic::async_trait]
impl<DB: Backend, I: Inventory<DB>> ResourceAdmin for AdminService<I, DB> {
    async fn put_resources(
        &self,
        request: Request<PutResourcesRequest>,
    ) -> Result<Response<PutResourcesResponse>, Status> {
        let counts = self.put_all(request.into_inner()).await?;
        Ok(Response::new(PutResourcesResponse {
            resources: counts.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_resource(
        &self,
        request: Request<GetResourceRequest>,
    ) -> Result<Response<ResourceStatus>, Status> {
        let resource = request.into_inner().resource;
        check_id("resource", &resource)?;
        let mut conn = self.pool.acquire().await.map_err(ResourceError::from)?;
        match self.inventory.get(&mut *conn, &resource).await? {
            Some(counts) => Ok(Response::new(counts.into())),
            None => {
                Err(ResourceError::NotFound(format!("resource {resource:?} does not exist")).into())
            }
        }
    }
}
