//! `tcc.v1.ResourceAdmin` for the reference participants: a generic service over an
//! [`Inventory`], the per-participant SQL that creates, resizes and counts resources.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{Pool, Postgres};
use tonic::{Request, Response, Status};

use crate::participant::{Backend, ResourceError};
use crate::proto::resource_admin_server::ResourceAdmin;
use crate::proto::{GetResourceRequest, PutResourcesRequest, PutResourcesResponse, ResourceStatus};

/// Longest resource id accepted, in bytes.
const MAX_RESOURCE_BYTES: usize = 128;

/// One resource's counts. Invariant: `capacity = available + held + confirmed`.
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
        if capacity < 0 {
            return Err("must be >= 0".to_owned());
        }
        Ok(())
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
        if req.resources.is_empty() {
            return Err(ResourceError::invalid("resources", "must not be empty"));
        }
        let mut specs = Vec::with_capacity(req.resources.len());
        for (i, spec) in req.resources.into_iter().enumerate() {
            check_resource(&format!("resources[{i}].resource"), &spec.resource)?;
            self.inventory
                .check_capacity(spec.capacity)
                .map_err(|msg| ResourceError::invalid(format!("resources[{i}].capacity"), msg))?;
            specs.push((spec.resource, spec.capacity, i));
        }
        specs.sort();
        if let Some(w) = specs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(ResourceError::invalid(
                format!("resources[{}].resource", w[1].2),
                format!("duplicates resources[{}]", w[0].2),
            ));
        }
        let mut tx = DB::begin_write(&self.pool).await?;
        let mut out = Vec::with_capacity(specs.len());
        for (resource, capacity, _) in &specs {
            out.push(self.inventory.put(&mut *tx, resource, *capacity).await?);
        }
        tx.commit().await?;
        Ok(out)
    }
}

fn check_resource(field: &str, resource: &str) -> Result<(), ResourceError> {
    if resource.is_empty() {
        return Err(ResourceError::invalid(field, "is required"));
    }
    if resource.len() > MAX_RESOURCE_BYTES {
        return Err(ResourceError::invalid(
            field,
            format!("must be at most {MAX_RESOURCE_BYTES} bytes"),
        ));
    }
    Ok(())
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
        check_resource("resource", &resource)?;
        let mut conn = self.pool.acquire().await.map_err(ResourceError::from)?;
        match self.inventory.get(&mut *conn, &resource).await? {
            Some(counts) => Ok(Response::new(counts.into())),
            None => {
                Err(ResourceError::NotFound(format!("resource {resource:?} does not exist")).into())
            }
        }
    }
}
