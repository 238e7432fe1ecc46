//! The gRPC face of `stock-redis`: `tcc.v1.Participant` (requests read and answered by the
//! SDK's wire layer, [`crate::participant::wire`], and counted as the SDK counts its calls,
//! `participant::calls::count_call`) and `tcc.v1.ResourceAdmin`.

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::{NAME, StockRedis};
use crate::participant::calls::{branch_outcome, count_call, extend_outcome, try_outcome};
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
        let started = Instant::now();
        let answered = async {
            let branch = self.check_try(wire::try_branch(request.into_inner())?)?;
            Ok::<_, Status>(self.try_branch(&branch).await?)
        }
        .await;
        let answer = count_call(NAME, "try", started, answered, try_outcome)?;
        Ok(wire::try_response(answer))
    }

    async fn confirm(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let started = Instant::now();
        let answered = async {
            let key = wire::branch_key(request.into_inner())?;
            Ok::<_, Status>(self.confirm_branch(&key).await?)
        }
        .await;
        let answer = count_call(NAME, "confirm", started, answered, branch_outcome)?;
        Ok(wire::branch_response(answer))
    }

    async fn cancel(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let started = Instant::now();
        let answered = async {
            let key = wire::branch_key(request.into_inner())?;
            Ok::<_, Status>(self.cancel_branch(&key).await?)
        }
        .await;
        let answer = count_call(NAME, "cancel", started, answered, branch_outcome)?;
        Ok(wire::branch_response(answer))
    }

    async fn extend(
        &self,
        request: Request<ExtendBranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let started = Instant::now();
        let answered = async {
            let (key, expires_at) = wire::extend_branch(request.into_inner())?;
            self.check_extend(expires_at)?;
            Ok::<_, Status>(self.extend_branch(&key, expires_at).await?)
        }
        .await;
        let answer = count_call(NAME, "extend", started, answered, extend_outcome)?;
        Ok(wire::extend_response(answer))
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
