//! In-test participants: real tonic servers of `tcc.v1.Participant` on loopback that record
//! every call in a shared log, keep the business effects they applied per branch (and the
//! deadline each branch holds to), and can be told at any time to reject, fail, stall or
//! answer late.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::proto;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// Starts fakes named `names`, sharing one call log.
pub async fn spawn_fakes(names: &[&str]) -> Fakes {
    let log = CallLog::default();
    let mut by_name = HashMap::new();
    for name in names {
        by_name.insert((*name).to_owned(), spawn_fake(name, log.clone()).await);
    }
    Fakes { log, by_name }
}

/// One recorded participant call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub participant: String,
    pub method: &'static str,
    pub branch_id: String,
    pub resources: Vec<String>,
}

/// Every call to every fake of one test, in arrival order.
#[derive(Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<Call>>>);

impl CallLog {
    pub fn push(&self, call: Call) {
        self.0.lock().unwrap().push(call);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }

    /// `participant.Method` strings, in order.
    pub fn summary(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| format!("{}.{}", c.participant, c.method))
            .collect()
    }

    /// Every `method` call `participant` received, per branch id - whatever it changed, so a
    /// duplicate send shows up here even when the fake answered it idempotently.
    pub fn per_branch(&self, participant: &str, method: &str) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for c in self.calls() {
            if c.participant == participant && c.method == method {
                *counts.entry(c.branch_id).or_default() += 1;
            }
        }
        counts
    }

    /// Asserts `participant` received `method` for exactly `branches` branches, each exactly
    /// once: no duplicate send, even one answered idempotently.
    pub fn assert_once_per_branch(&self, participant: &str, method: &str, branches: usize) {
        let per_branch = self.per_branch(participant, method);
        let repeated: Vec<_> = per_branch.iter().filter(|(_, n)| **n != 1).collect();
        assert!(
            repeated.is_empty(),
            "{participant}.{method} sent more than once to a branch: {repeated:?}"
        );
        assert_eq!(
            per_branch.len(),
            branches,
            "{participant}.{method}: branches reached"
        );
    }

    pub fn count(&self, participant: &str, method: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.participant == participant && c.method == method)
            .count()
    }
}

/// How a fake behaves; flip at any time.
#[derive(Default)]
pub struct Behaviour {
    /// Answer Try with REJECTED.
    pub reject: AtomicBool,
    /// Fail the next N Try calls with UNAVAILABLE (after recording them).
    pub fail_tries: AtomicUsize,
    /// Fail the next N Confirm calls with UNAVAILABLE.
    pub fail_confirms: AtomicUsize,
    /// Hold Try calls for 30 s (longer than any test's participant timeout).
    pub stall_tries: AtomicBool,
    /// Record the hold, then hold the Try's answer for 30 s: the Try lands, the caller never
    /// hears it (an unknown outcome that did take effect).
    pub stall_after_try: AtomicBool,
    /// Delay each Try by this many milliseconds.
    pub try_delay_ms: std::sync::atomic::AtomicU64,
    /// Hold Confirm calls for 30 s before applying them.
    pub stall_confirms: AtomicBool,
    /// Apply Confirm calls, then hold the answer for 30 s (the caller never hears it).
    pub stall_after_confirm: AtomicBool,
    /// Fail the next N Extend calls with UNAVAILABLE (after recording them).
    pub fail_extends: AtomicUsize,
    /// Hold Cancel calls for 30 s before applying them (a participant gone silent).
    pub stall_cancels: AtomicBool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeBranch {
    Held,
    Confirmed,
    Cancelled,
}

/// The business effects a fake applied, per branch id.
#[derive(Default)]
pub struct FakeState {
    pub branches: HashMap<String, (FakeBranch, Vec<String>)>,
    /// The latest deadline each branch was given (by Try, moved later by Extend), as sent.
    pub deadlines: HashMap<String, prost_types::Timestamp>,
    pub confirm_effects: usize,
    pub cancel_effects: usize,
    /// Every Confirm/Cancel answered, in order: (branch id, method, the state answered).
    pub answers: Vec<(String, &'static str, FakeBranch)>,
}

struct Fake {
    name: String,
    log: CallLog,
    behaviour: Arc<Behaviour>,
    state: Arc<Mutex<FakeState>>,
}

pub struct FakeHandle {
    pub name: String,
    pub url: String,
    pub log: CallLog,
    pub behaviour: Arc<Behaviour>,
    pub state: Arc<Mutex<FakeState>>,
}

impl FakeHandle {
    /// Resources currently held (tried, neither confirmed nor cancelled).
    pub fn held(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        let mut v: Vec<String> = st
            .branches
            .values()
            .filter(|(s, _)| *s == FakeBranch::Held)
            .flat_map(|(_, r)| r.clone())
            .collect();
        v.sort();
        v
    }

    /// The deadline each branch holds to (Try's, moved later by Extend), by branch id.
    pub fn deadlines(&self) -> HashMap<String, prost_types::Timestamp> {
        self.state.lock().unwrap().deadlines.clone()
    }

    /// The states every `method` call for `branch_id` was answered with, in order.
    pub fn answers(&self, branch_id: &str, method: &str) -> Vec<FakeBranch> {
        let st = self.state.lock().unwrap();
        st.answers
            .iter()
            .filter(|(b, m, _)| b == branch_id && *m == method)
            .map(|(_, _, s)| *s)
            .collect()
    }

    pub fn effects(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.confirm_effects, st.cancel_effects)
    }
}

pub struct Fakes {
    pub log: CallLog,
    pub by_name: HashMap<String, FakeHandle>,
}

impl Fakes {
    pub fn get(&self, name: &str) -> &FakeHandle {
        &self.by_name[name]
    }
}

#[tonic::async_trait]
impl proto::participant_server::Participant for Fake {
    async fn r#try(
        &self,
        request: Request<proto::TryRequest>,
    ) -> Result<Response<proto::TryResponse>, Status> {
        let req = request.into_inner();
        let resources: Vec<String> = req.items.iter().map(|h| h.resource.clone()).collect();
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Try",
            branch_id: req.branch_id.clone(),
            resources: resources.clone(),
        });
        if self.behaviour.stall_tries.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        let delay = self.behaviour.try_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self
            .behaviour
            .fail_tries
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("fake participant failing on purpose"));
        }
        if self.behaviour.reject.load(Ordering::SeqCst) {
            return Ok(Response::new(proto::TryResponse {
                outcome: proto::try_response::Outcome::Rejected.into(),
                reason: "sold out".into(),
            }));
        }
        let tombstone = {
            let mut st = self.state.lock().unwrap();
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
            return Ok(Response::new(proto::TryResponse {
                outcome: proto::try_response::Outcome::Rejected.into(),
                reason: "branch already cancelled".into(),
            }));
        }
        if self.behaviour.stall_after_try.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(Response::new(proto::TryResponse {
            outcome: proto::try_response::Outcome::Held.into(),
            reason: String::new(),
        }))
    }

    async fn confirm(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let req = request.into_inner();
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Confirm",
            branch_id: req.branch_id.clone(),
            resources: vec![],
        });
        if self.behaviour.stall_confirms.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        if self
            .behaviour
            .fail_confirms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("fake participant failing on purpose"));
        }
        let state = {
            let mut st = self.state.lock().unwrap();
            let state = match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
                Some(FakeBranch::Held) => {
                    st.confirm_effects += 1;
                    if let Some(b) = st.branches.get_mut(&req.branch_id) {
                        b.0 = FakeBranch::Confirmed;
                    }
                    proto::branch::State::Confirmed
                }
                Some(FakeBranch::Confirmed) => proto::branch::State::Confirmed,
                Some(FakeBranch::Cancelled) => proto::branch::State::Cancelled,
                None => proto::branch::State::HoldLost,
            };
            st.answers
                .push((req.branch_id.clone(), "Confirm", answered(state)));
            state
        };
        if self.behaviour.stall_after_confirm.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }

    async fn cancel(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let req = request.into_inner();
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Cancel",
            branch_id: req.branch_id.clone(),
            resources: vec![],
        });
        if self.behaviour.stall_cancels.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        let mut st = self.state.lock().unwrap();
        let state = match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
            Some(FakeBranch::Held) => {
                st.cancel_effects += 1;
                if let Some(b) = st.branches.get_mut(&req.branch_id) {
                    b.0 = FakeBranch::Cancelled;
                }
                proto::branch::State::Cancelled
            }
            Some(FakeBranch::Confirmed) => proto::branch::State::Confirmed,
            Some(FakeBranch::Cancelled) => proto::branch::State::Cancelled,
            None => {
                st.branches
                    .insert(req.branch_id.clone(), (FakeBranch::Cancelled, vec![]));
                proto::branch::State::Cancelled
            }
        };
        st.answers.push((req.branch_id, "Cancel", answered(state)));
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendBranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.extend_branch(request.into_inner()).await
    }
}

impl Fake {
    async fn extend_branch(
        &self,
        req: proto::ExtendBranchRequest,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Extend",
            branch_id: req.branch_id.clone(),
            resources: vec![],
        });
        if self
            .behaviour
            .fail_extends
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("fake participant failing on purpose"));
        }
        let mut st = self.state.lock().unwrap();
        let state = match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
            Some(FakeBranch::Held) => {
                if let Some(expires_at) = req.expires_at {
                    let later = st.deadlines.get(&req.branch_id).is_none_or(|t| {
                        (t.seconds, t.nanos) < (expires_at.seconds, expires_at.nanos)
                    });
                    if later {
                        st.deadlines.insert(req.branch_id, expires_at);
                    }
                }
                proto::branch::State::Held
            }
            Some(FakeBranch::Confirmed) => proto::branch::State::Confirmed,
            Some(FakeBranch::Cancelled) => proto::branch::State::Cancelled,
            None => proto::branch::State::HoldLost,
        };
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }
}

/// The branch state a Confirm/Cancel answer reports (HOLD_LOST reads as not held: `Cancelled`).
fn answered(state: proto::branch::State) -> FakeBranch {
    match state {
        proto::branch::State::Confirmed => FakeBranch::Confirmed,
        proto::branch::State::Held => FakeBranch::Held,
        _ => FakeBranch::Cancelled,
    }
}

/// Starts a fake participant on 127.0.0.1:0.
pub async fn spawn_fake(name: &str, log: CallLog) -> FakeHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = FakeHandle {
        name: name.to_owned(),
        url: format!("http://{addr}"),
        log,
        behaviour: Arc::new(Behaviour::default()),
        state: Arc::new(Mutex::new(FakeState::default())),
    };
    handle.serve(listener);
    handle
}

impl FakeHandle {
    fn serve(&self, listener: TcpListener) {
        let fake = Fake {
            name: self.name.clone(),
            log: self.log.clone(),
            behaviour: self.behaviour.clone(),
            state: self.state.clone(),
        };
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(proto::participant_server::ParticipantServer::new(fake))
                .add_service(tonic_health::server::health_reporter().1)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    }
}
