//! The `tcc.v1.Participant` service of [`ParticipantService`]: each call decoded (`wire.rs`),
//! run, answered, and counted once here for every participant built on the SDK
//! (`holdfast_participant_calls_total{participant, method, outcome}` and
//! `holdfast_participant_call_seconds{participant, method}`), so no participant instruments
//! itself.

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::barrier::Backend;
use super::service::ParticipantService;
use super::{BranchAnswer, ExtendAnswer, Resource, ResourceError, TryAnswer, wire};
use crate::proto::participant_server::Participant;
use crate::proto::{BranchRequest, BranchResponse, ExtendBranchRequest, TryRequest, TryResponse};
use crate::telemetry::ops::participant_call;

/// The outcome label of a branch answer.
fn branch_outcome(answer: BranchAnswer) -> &'static str {
    match answer {
        BranchAnswer::Confirmed => "confirmed",
        BranchAnswer::Cancelled => "cancelled",
        BranchAnswer::HoldLost => "hold_lost",
    }
}

/// The outcome label of a failed call: its gRPC code, as Prometheus label values go.
fn error_outcome(status: &Status) -> &'static str {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument => "invalid_argument",
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::FailedPrecondition => "failed_precondition",
        Code::ResourceExhausted => "resource_exhausted",
        Code::NotFound => "not_found",
        Code::Internal => "internal",
        _ => "error",
    }
}

/// Counts one call of `method` with its answer (or error) and how long it took.
fn counted<T>(
    participant: &str,
    method: &'static str,
    started: Instant,
    answered: Result<T, ResourceError>,
    outcome: impl FnOnce(&T) -> &'static str,
) -> Result<T, Status> {
    let answered = answered.map_err(Status::from);
    let label = match &answered {
        Ok(answer) => outcome(answer),
        Err(status) => error_outcome(status),
    };
    participant_call(participant, method, label, started.elapsed());
    answered
}

#[tonic::async_trait]
impl<DB: Backend, R: Resource<DB>> Participant for ParticipantService<R, DB> {
    async fn r#try(&self, request: Request<TryRequest>) -> Result<Response<TryResponse>, Status> {
        let started = Instant::now();
        let answered = match wire::try_branch(request.into_inner()) {
            Ok(branch) => self.try_branch(branch).await,
            Err(e) => Err(e),
        };
        let answer = counted(self.name(), "try", started, answered, |a| match a {
            TryAnswer::Held => "held",
            TryAnswer::Rejected(_) => "rejected",
        })?;
        Ok(wire::try_response(answer))
    }

    async fn confirm(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let started = Instant::now();
        let answered = match wire::branch_key(request.into_inner()) {
            Ok(key) => self.confirm_branch(&key).await,
            Err(e) => Err(e),
        };
        let answer = counted(self.name(), "confirm", started, answered, |a| {
            branch_outcome(*a)
        })?;
        Ok(wire::branch_response(answer))
    }

    async fn cancel(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let started = Instant::now();
        let answered = match wire::branch_key(request.into_inner()) {
            Ok(key) => self.cancel_branch(&key).await,
            Err(e) => Err(e),
        };
        let answer = counted(self.name(), "cancel", started, answered, |a| {
            branch_outcome(*a)
        })?;
        Ok(wire::branch_response(answer))
    }

    async fn extend(
        &self,
        request: Request<ExtendBranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let started = Instant::now();
        let answered = match wire::extend_branch(request.into_inner()) {
            Ok((key, expires_at)) => self.extend_branch(&key, expires_at).await,
            Err(e) => Err(e),
        };
        let answer = counted(self.name(), "extend", started, answered, |a| match a {
            ExtendAnswer::Held => "extended",
            ExtendAnswer::Settled(b) => branch_outcome(*b),
        })?;
        Ok(wire::extend_response(answer))
    }
}
