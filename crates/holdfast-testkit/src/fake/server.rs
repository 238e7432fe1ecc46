//! The `tcc.v1.Participant` a fake serves: records the call, plays its [`Behaviour`], applies
//! the business effect to its [`FakeState`] the way a real participant's barrier would
//! (idempotent repeats, Cancel-before-Try tombstones), and records the answer.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use holdfast_proto as proto;
use holdfast_proto::branch::State as Wire;
use tonic::{Request, Response, Status};

use super::{Answer, Behaviour, Call, CallLog, FakeBranch, FakeState, STALL, take_one};

pub(super) struct Fake {
    pub(super) name: String,
    pub(super) log: CallLog,
    pub(super) behaviour: Arc<Behaviour>,
    pub(super) state: Arc<Mutex<FakeState>>,
}

fn unavailable() -> Status {
    Status::unavailable("fake participant failing on purpose")
}

fn held_or_rejected(held: bool, reason: &str) -> Response<proto::TryResponse> {
    let outcome = if held {
        proto::try_response::Outcome::Held
    } else {
        proto::try_response::Outcome::Rejected
    };
    Response::new(proto::TryResponse {
        outcome: outcome.into(),
        reason: reason.to_owned(),
    })
}

fn branch_answer(state: Wire) -> Answer {
    match state {
        Wire::Confirmed => Answer::Confirmed,
        Wire::Held => Answer::Held,
        Wire::HoldLost => Answer::HoldLost,
        _ => Answer::Cancelled,
    }
}

/// The branch state a Confirm/Cancel answer reports (HOLD_LOST reads as not held: `Cancelled`).
fn answered(state: Wire) -> FakeBranch {
    match state {
        Wire::Confirmed => FakeBranch::Confirmed,
        Wire::Held => FakeBranch::Held,
        _ => FakeBranch::Cancelled,
    }
}

impl Fake {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self, method: &'static str, branch_id: &str, resources: Vec<String>) -> usize {
        self.log.push(Call {
            participant: self.name.clone(),
            method,
            branch_id: branch_id.to_owned(),
            resources,
            answer: None,
        })
    }

    /// The scripted failure of this call, if any: every method counts towards `fail_calls`.
    fn fails(&self, position: usize, per_method: Option<&std::sync::atomic::AtomicUsize>) -> bool {
        let fails = take_one(&self.behaviour.fail_calls) || per_method.is_some_and(take_one);
        if fails {
            self.log.answered(position, Answer::Unavailable);
        }
        fails
    }

    fn rejects(&self, resources: &[String]) -> bool {
        if self.behaviour.reject.load(Ordering::SeqCst) {
            return true;
        }
        let listed = self
            .behaviour
            .reject_resources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        resources.iter().any(|r| listed.contains(r))
    }

    async fn try_branch(
        &self,
        req: proto::TryRequest,
    ) -> Result<Response<proto::TryResponse>, Status> {
        let resources: Vec<String> = req.items.iter().map(|h| h.resource.clone()).collect();
        let at = self.note("Try", &req.branch_id, resources.clone());
        if self.behaviour.stall_tries.load(Ordering::SeqCst) {
            tokio::time::sleep(STALL).await;
        }
        let delay = self.behaviour.try_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.fails(at, Some(&self.behaviour.fail_tries)) {
            return Err(unavailable());
        }
        if self.rejects(&resources) {
            self.log.answered(at, Answer::Rejected);
            return Ok(held_or_rejected(false, "sold out"));
        }
        let tombstone = {
            let mut st = self.state();
            // Cancel-before-Try leaves a tombstone: the late Try is a no-op rejection.
            let tombstone = matches!(
                st.branches.get(&req.branch_id),
                Some((FakeBranch::Cancelled, _))
            );
            if !tombstone {
                if let Some(expires_at) = req.expires_at {
                    st.deadlines.insert(req.branch_id.clone(), expires_at);
                }
                st.branches
                    .entry(req.branch_id)
                    .or_insert((FakeBranch::Held, resources));
            }
            tombstone
        };
        if tombstone {
            self.log.answered(at, Answer::Rejected);
            return Ok(held_or_rejected(false, "branch already cancelled"));
        }
        self.log.answered(at, Answer::Held);
        if self.behaviour.stall_after_try.load(Ordering::SeqCst) {
            tokio::time::sleep(STALL).await;
        }
        Ok(held_or_rejected(true, ""))
    }

    async fn confirm_branch(
        &self,
        req: proto::BranchRequest,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let at = self.note("Confirm", &req.branch_id, vec![]);
        if self.behaviour.stall_confirms.load(Ordering::SeqCst) {
            tokio::time::sleep(STALL).await;
        }
        if self.fails(at, Some(&self.behaviour.fail_confirms)) {
            return Err(unavailable());
        }
        let state = {
            let mut st = self.state();
            let state = match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
                Some(FakeBranch::Held) => {
                    st.confirm_effects += 1;
                    if let Some(b) = st.branches.get_mut(&req.branch_id) {
                        b.0 = FakeBranch::Confirmed;
                    }
                    Wire::Confirmed
                }
                Some(FakeBranch::Confirmed) => Wire::Confirmed,
                Some(FakeBranch::Cancelled) => Wire::Cancelled,
                None => Wire::HoldLost,
            };
            st.answers
                .push((req.branch_id.clone(), "Confirm", answered(state)));
            state
        };
        self.log.answered(at, branch_answer(state));
        if self.behaviour.stall_after_confirm.load(Ordering::SeqCst) {
            tokio::time::sleep(STALL).await;
        }
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }

    async fn cancel_branch(
        &self,
        req: proto::BranchRequest,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let at = self.note("Cancel", &req.branch_id, vec![]);
        if self.behaviour.stall_cancels.load(Ordering::SeqCst) {
            tokio::time::sleep(STALL).await;
        }
        if self.fails(at, None) {
            return Err(unavailable());
        }
        let state = {
            let mut st = self.state();
            let state = match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
                Some(FakeBranch::Held) => {
                    st.cancel_effects += 1;
                    if let Some(b) = st.branches.get_mut(&req.branch_id) {
                        b.0 = FakeBranch::Cancelled;
                    }
                    Wire::Cancelled
                }
                Some(FakeBranch::Confirmed) => Wire::Confirmed,
                Some(FakeBranch::Cancelled) => Wire::Cancelled,
                None => {
                    st.branches
                        .insert(req.branch_id.clone(), (FakeBranch::Cancelled, vec![]));
                    Wire::Cancelled
                }
            };
            st.answers
                .push((req.branch_id.clone(), "Cancel", answered(state)));
            state
        };
        self.log.answered(at, branch_answer(state));
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }

    async fn extend_branch(
        &self,
        req: proto::ExtendBranchRequest,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let at = self.note("Extend", &req.branch_id, vec![]);
        if self.fails(at, Some(&self.behaviour.fail_extends)) {
            return Err(unavailable());
        }
        let state = {
            let mut st = self.state();
            match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
                Some(FakeBranch::Held) => {
                    if let Some(expires_at) = req.expires_at {
                        let later = st.deadlines.get(&req.branch_id).is_none_or(|t| {
                            (t.seconds, t.nanos) < (expires_at.seconds, expires_at.nanos)
                        });
                        if later {
                            st.deadlines.insert(req.branch_id, expires_at);
                        }
                    }
                    Wire::Held
                }
                Some(FakeBranch::Confirmed) => Wire::Confirmed,
                Some(FakeBranch::Cancelled) => Wire::Cancelled,
                None => Wire::HoldLost,
            }
        };
        self.log.answered(at, branch_answer(state));
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }
}

#[tonic::async_trait]
impl proto::participant_server::Participant for Fake {
    async fn r#try(
        &self,
        request: Request<proto::TryRequest>,
    ) -> Result<Response<proto::TryResponse>, Status> {
        self.try_branch(request.into_inner()).await
    }

    async fn confirm(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.confirm_branch(request.into_inner()).await
    }

    async fn cancel(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.cancel_branch(request.into_inner()).await
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendBranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.extend_branch(request.into_inner()).await
    }
}
