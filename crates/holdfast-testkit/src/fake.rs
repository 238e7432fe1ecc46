//! Scripted participants: real tonic servers of `tcc.v1.Participant` on loopback that record
//! every call (method, branch, resources, answer) in a log, keep the business effects they
//! applied per branch (and the deadline each branch holds to), and can be told - at start with
//! a [`Script`] or at any time through [`Behaviour`] - to reject, fail, stall or answer after
//! the coordinator gave up.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use holdfast_proto as proto;
use tokio::net::TcpListener;

/// How long a stalled call waits: longer than any participant timeout a test sets, so the
/// coordinator gives up first.
pub const STALL: Duration = Duration::from_secs(30);

/// Starts fakes named `names` on loopback, sharing one call log.
pub async fn spawn_fakes(names: &[&str]) -> Fakes {
    let log = CallLog::default();
    let mut by_name = HashMap::new();
    for name in names {
        by_name.insert((*name).to_owned(), spawn_fake(name, log.clone()).await);
    }
    Fakes { log, by_name }
}

/// What a fake answered a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Try: the hold is placed.
    Held,
    /// Try: refused (a scripted rejection, or a Try after its branch was cancelled).
    Rejected,
    /// Confirm/Cancel/Extend: the branch's state.
    Confirmed,
    Cancelled,
    HoldLost,
    /// The scripted failure: `UNAVAILABLE`.
    Unavailable,
}

/// One recorded participant call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub participant: String,
    /// `Try`, `Confirm`, `Cancel` or `Extend`.
    pub method: &'static str,
    pub branch_id: String,
    /// The resources a Try asked for (empty for the other methods).
    pub resources: Vec<String>,
    /// What the fake answered; `None` while it has not decided (a stalled call) or when the
    /// call was not answered by a fake (a pass-through that only logs).
    pub answer: Option<Answer>,
}

/// Every call to every fake sharing it, in arrival order.
#[derive(Clone, Default, Debug)]
pub struct CallLog(Arc<Mutex<Vec<Call>>>);

impl CallLog {
    fn lock(&self) -> MutexGuard<'_, Vec<Call>> {
        // A test that panicked while holding the log poisons it; the log is still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a call; its position, for [`CallLog::answered`].
    pub fn push(&self, call: Call) -> usize {
        let mut calls = self.lock();
        calls.push(call);
        calls.len() - 1
    }

    /// Records the answer of the call at `position`.
    pub fn answered(&self, position: usize, answer: Answer) {
        if let Some(call) = self.lock().get_mut(position) {
            call.answer = Some(answer);
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.lock().clone()
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
#[derive(Default, Debug)]
pub struct Behaviour {
    /// Answer Try with REJECTED.
    pub reject: AtomicBool,
    /// Answer a Try that asks for one of these resources with REJECTED.
    pub reject_resources: Mutex<HashSet<String>>,
    /// Fail the next N calls, whatever their method, with UNAVAILABLE (after recording them).
    pub fail_calls: AtomicUsize,
    /// Fail the next N Try calls with UNAVAILABLE (after recording them).
    pub fail_tries: AtomicUsize,
    /// Fail the next N Confirm calls with UNAVAILABLE.
    pub fail_confirms: AtomicUsize,
    /// Hold Try calls for [`STALL`] (longer than any test's participant timeout).
    pub stall_tries: AtomicBool,
    /// Record the hold, then hold the Try's answer for [`STALL`]: the Try lands, the caller
    /// never hears it (an unknown outcome that did take effect).
    pub stall_after_try: AtomicBool,
    /// Delay each Try by this many milliseconds.
    pub try_delay_ms: AtomicU64,
    /// Hold Confirm calls for [`STALL`] before applying them.
    pub stall_confirms: AtomicBool,
    /// Apply Confirm calls, then hold the answer for [`STALL`] (the caller never hears it).
    pub stall_after_confirm: AtomicBool,
    /// Fail the next N Extend calls with UNAVAILABLE (after recording them).
    pub fail_extends: AtomicUsize,
    /// Hold Cancel calls for [`STALL`] before applying them (a participant gone silent).
    pub stall_cancels: AtomicBool,
}

/// Takes one from a countdown of failures; true when this call is to fail.
fn take_one(countdown: &AtomicUsize) -> bool {
    countdown
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// What a fake does, set before it starts ([`crate::HarnessBuilder::fake`]) or applied to a
/// running one ([`FakeParticipant::script`]). Every step adds to the script.
#[derive(Clone, Debug, Default)]
pub struct Script {
    reject_all: bool,
    reject_resources: Vec<String>,
    fail_next: usize,
    stall: Option<Duration>,
    stall_tries: bool,
    answer_late: bool,
}

impl Script {
    /// Holds everything, answers at once.
    pub fn new() -> Script {
        Script::default()
    }

    /// Rejects every Try (sold out).
    pub fn reject(mut self) -> Script {
        self.reject_all = true;
        self
    }

    /// Rejects a Try that asks for `resource`; holds the others.
    pub fn reject_resource(mut self, resource: impl Into<String>) -> Script {
        self.reject_resources.push(resource.into());
        self
    }

    /// Fails the next `n` calls, whatever their method, with `UNAVAILABLE`.
    pub fn fail_next(mut self, n: usize) -> Script {
        self.fail_next = n;
        self
    }

    /// Answers each Try only after `delay`.
    pub fn stall(mut self, delay: Duration) -> Script {
        self.stall = Some(delay);
        self
    }

    /// Never answers a Try in time (it waits [`STALL`] first, holding nothing): the
    /// coordinator's call times out.
    pub fn stall_tries(mut self) -> Script {
        self.stall_tries = true;
        self
    }

    /// Places each hold, then answers only after the coordinator gave up (waits [`STALL`]):
    /// the outcome is lost on the way - the hold exists, the coordinator never heard of it.
    pub fn answer_late(mut self) -> Script {
        self.answer_late = true;
        self
    }

    fn apply(&self, behaviour: &Behaviour) {
        behaviour.reject.store(self.reject_all, Ordering::SeqCst);
        *behaviour
            .reject_resources
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = self.reject_resources.iter().cloned().collect();
        behaviour.fail_calls.store(self.fail_next, Ordering::SeqCst);
        let delay_ms = self
            .stall
            .map_or(0, |d| d.as_millis().try_into().unwrap_or(u64::MAX));
        behaviour.try_delay_ms.store(delay_ms, Ordering::SeqCst);
        behaviour
            .stall_tries
            .store(self.stall_tries, Ordering::SeqCst);
        behaviour
            .stall_after_try
            .store(self.answer_late, Ordering::SeqCst);
    }
}

/// A branch's state at a fake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeBranch {
    Held,
    Confirmed,
    Cancelled,
}

/// The business effects a fake applied, per branch id.
#[derive(Default, Debug)]
pub struct FakeState {
    pub branches: HashMap<String, (FakeBranch, Vec<String>)>,
    /// The latest deadline each branch was given (by Try, moved later by Extend), as sent.
    pub deadlines: HashMap<String, prost_types::Timestamp>,
    pub confirm_effects: usize,
    pub cancel_effects: usize,
    /// Every Confirm/Cancel answered, in order: (branch id, method, the state answered).
    pub answers: Vec<(String, &'static str, FakeBranch)>,
}

/// A running fake participant: where it listens, its log, its behaviour and its state.
pub struct FakeParticipant {
    pub name: String,
    pub url: String,
    pub log: CallLog,
    pub behaviour: Arc<Behaviour>,
    pub state: Arc<Mutex<FakeState>>,
    server: Option<tokio::task::AbortHandle>,
}

impl Drop for FakeParticipant {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

impl FakeParticipant {
    /// Replaces what the fake does from its next call on.
    pub fn script(&self, script: &Script) {
        script.apply(&self.behaviour);
    }

    /// Every call this fake received, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.log
            .calls()
            .into_iter()
            .filter(|c| c.participant == self.name)
            .collect()
    }

    /// How many `method` calls this fake received.
    pub fn count(&self, method: &str) -> usize {
        self.log.count(&self.name, method)
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resources currently held (tried, neither confirmed nor cancelled), sorted.
    pub fn held(&self) -> Vec<String> {
        let st = self.state();
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
        self.state().deadlines.clone()
    }

    /// The states every `method` call for `branch_id` was answered with, in order.
    pub fn answers(&self, branch_id: &str, method: &str) -> Vec<FakeBranch> {
        self.state()
            .answers
            .iter()
            .filter(|(b, m, _)| b == branch_id && *m == method)
            .map(|(_, _, s)| *s)
            .collect()
    }

    /// How many Confirms and Cancels changed a branch: (confirmed, cancelled).
    pub fn effects(&self) -> (usize, usize) {
        let st = self.state();
        (st.confirm_effects, st.cancel_effects)
    }
}

/// Fakes sharing one call log, by name.
pub struct Fakes {
    pub log: CallLog,
    pub by_name: HashMap<String, FakeParticipant>,
}

impl Fakes {
    /// The fake named `name`; panics naming it when there is none (a test's mistake).
    pub fn get(&self, name: &str) -> &FakeParticipant {
        match self.by_name.get(name) {
            Some(fake) => fake,
            None => panic!("no fake participant named {name:?}"),
        }
    }
}

/// Starts a fake participant named `name` on 127.0.0.1:0, logging into `log`.
pub async fn spawn_fake(name: &str, log: CallLog) -> FakeParticipant {
    // Loopback port 0 always binds; a test without it cannot run anyway.
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port");
    let addr = listener.local_addr().expect("a bound socket's address");
    let behaviour = Arc::new(Behaviour::default());
    let state = Arc::new(Mutex::new(FakeState::default()));
    let fake = Fake {
        name: name.to_owned(),
        log: log.clone(),
        behaviour: behaviour.clone(),
        state: state.clone(),
    };
    let server = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(proto::participant_server::ParticipantServer::new(fake))
            .add_service(tonic_health::server::health_reporter().1)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
        if let Err(e) = served {
            eprintln!("fake participant stopped: {e}");
        }
    });
    FakeParticipant {
        name: name.to_owned(),
        url: format!("http://{addr}"),
        log,
        behaviour,
        state,
        server: Some(server.abort_handle()),
    }
}

mod server;
use server::Fake;
