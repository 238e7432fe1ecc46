//! The `tcc.v1.Participant` service of [`ParticipantService`]: each call decoded (`wire.rs`),
//! run, answered, and counted once here for every participant built on the SDK
//! (`holdfast_participant_calls_total{participant, method, outcome}` and
//! `holdfast_participant_call_seconds{participant, method}`), so no participant instruments
//! itself; `stock-redis`, which serves its own handlers, counts through [`count_call`].

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::barrier::Backend;
use super::service::ParticipantService;
use super::{BranchAnswer, ExtendAnswer, Resource, TryAnswer, wire};
use crate::telemetry::participant_call;
use holdfast_proto::participant_server::Participant;
use holdfast_proto::{BranchRequest, BranchResponse, ExtendBranchRequest, TryRequest, TryResponse};

/// The outcome label of a Try answer.
pub fn try_outcome(answer: &TryAnswer) -> &'static str {
    match answer {
        TryAnswer::Held => "held",
        TryAnswer::Rejected(_) => "rejected",
    }
}

/// The outcome label of a branch answer.
pub fn branch_outcome(answer: &BranchAnswer) -> &'static str {
    match answer {
        BranchAnswer::Confirmed => "confirmed",
        BranchAnswer::Cancelled => "cancelled",
        BranchAnswer::HoldLost => "hold_lost",
    }
}

/// The outcome label of an Extend answer.
pub fn extend_outcome(answer: &ExtendAnswer) -> &'static str {
    match answer {
        ExtendAnswer::Held => "extended",
        ExtendAnswer::Settled(b) => branch_outcome(b),
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

/// Counts one call of `method` with its answer (or error) and how long it took; also used by
/// `stock-redis`, whose calls do not go through [`ParticipantService`].
pub fn count_call<T>(
    participant: &str,
    method: &'static str,
    started: Instant,
    answered: Result<T, Status>,
    outcome: impl FnOnce(&T) -> &'static str,
) -> Result<T, Status> {
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
        let answered = answered.map_err(Status::from);
        let answer = count_call(self.name(), "try", started, answered, try_outcome)?;
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
        let answered = answered.map_err(Status::from);
        let answer = count_call(self.name(), "confirm", started, answered, branch_outcome)?;
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
        let answered = answered.map_err(Status::from);
        let answer = count_call(self.name(), "cancel", started, answered, branch_outcome)?;
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
        let answered = answered.map_err(Status::from);
        let answer = count_call(self.name(), "extend", started, answered, extend_outcome)?;
        Ok(wire::extend_response(answer))
    }
}
