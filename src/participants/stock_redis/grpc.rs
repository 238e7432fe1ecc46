//! The gRPC face of `stock-redis`: `tcc.v1.Participant` (requests read and answered by the
//! SDK's wire layer, [`crate::participant::wire`]) and `tcc.v1.ResourceAdmin`.

use tonic::{Request, Response, Status};

use super::StockRedis;
use crate::participant::validate::check_id;
use crate::participant::wire;
use crate::proto::participant_server::Participant;
use crate::proto::resource_admin_server::ResourceAdmin;
use crate::proto::{
    BranchRequest, BranchResponse, ExtendBranchRequest, GetResourceRequest, PutResourcesRequest,
    PutResourcesResponse, ResourceStatus, TryRequest, TryResponse,
};

#[tonic::async_trait]
impl Participant for StockRedis {
    async fn r#try(&self, request: Request<TryRequest>) -> Result<Response<TryResponse>, Status> {
        let branch = self.check_try(wire::try_branch(request.into_inner())?)?;
        Ok(wire::try_response(self.try_branch(&branch).await?))
    }

    async fn confirm(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let key = wire::branch_key(request.into_inner())?;
        Ok(wire::branch_response(self.confirm_branch(&key).await?))
    }

    async fn cancel(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let key = wire::branch_key(request.into_inner())?;
        Ok(wire::branch_response(self.cancel_branch(&key).await?))
    }

    async fn extend(
        &self,
        request: Request<ExtendBranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let (key, expires_at) = wire::extend_branch(request.into_inner())?;
        self.check_extend(expires_at)?;
        Ok(wire::extend_response(
            self.extend_branch(&key, expires_at).await?,
        ))
    }
}

#[tonic::async_trait]
impl ResourceAdmin for StockRedis {
    async fn put_resources(
        &self,
        request: Request<PutResourcesRequest>,
    ) -> Result<Response<PutResourcesResponse>, Status> {
        let specs = request
            .into_inner()
            .resources
            .into_iter()
            .map(|s| (s.resource, s.capacity))
            .collect();
        let counts = StockRedis::put_resources(self, specs).await?;
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
        Ok(Response::new(self.counts(&resource).await?.into()))
    }
}
