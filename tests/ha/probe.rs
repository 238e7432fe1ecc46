//! The refused window, measured: a probe per coordinator sends a Reserve (a new request each
//! time, one unit of a stock resource no holder touches) every 50 ms and records when it went
//! and what came back. Every answer must be a success or a refusal the client can act on:
//! `UNAVAILABLE` with `STORAGE_UNAVAILABLE` and a `RetryInfo` (the coordinator's database),
//! or `UNAVAILABLE` `PARTICIPANT_UNAVAILABLE` (the stock participant's database, which
//! releases whatever it placed); anything else is a wrong answer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::proto;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use holdfast::proto::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

/// The probes' resource (at the stock participant) and its capacity.
pub const PROBE_ITEM: &str = "ha-probe";
pub const PROBE_CAPACITY: i64 = 1_000_000_000;

/// What a probe's answer was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// UNAVAILABLE STORAGE_UNAVAILABLE with RetryInfo.
    StorageUnavailable,
    /// UNAVAILABLE PARTICIPANT_UNAVAILABLE.
    ParticipantUnavailable,
    /// Nothing within the probe's 10 s.
    Silent,
    /// Anything else.
    Wrong,
}

pub fn classify(answer: &Result<proto::Reservation, Status>) -> Answer {
    let Err(s) = answer else {
        return Answer::Ok;
    };
    let reason = s
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default();
    let retry_info = s.get_details_retry_info().is_some();
    match (s.code(), reason.as_str()) {
        (Code::Unavailable, "STORAGE_UNAVAILABLE") if retry_info => Answer::StorageUnavailable,
        (Code::Unavailable, "PARTICIPANT_UNAVAILABLE") => Answer::ParticipantUnavailable,
        (Code::DeadlineExceeded | Code::Cancelled, _) => Answer::Silent,
        _ => Answer::Wrong,
    }
}

/// One probe call: when it was sent and answered, the answer's class and text.
#[derive(Clone, Debug)]
pub struct Probed {
    pub coordinator: usize,
    pub sent: Instant,
    pub answered: Instant,
    pub answer: Answer,
    pub said: String,
}

/// The probes, running until stopped.
pub struct Probes {
    stop: Arc<AtomicBool>,
    pub seen: Arc<Mutex<Vec<Probed>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Probes {
    pub fn start(coordinators: &[SocketAddr], round: usize) -> Probes {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks = coordinators
            .iter()
            .enumerate()
            .map(|(i, addr)| tokio::spawn(probe(*addr, i, round, stop.clone(), seen.clone())))
            .collect();
        Probes { stop, seen, tasks }
    }

    pub async fn stop(self) -> Vec<Probed> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether every coordinator answered a probe with success after `since`.
    pub fn all_served_since(&self, since: Instant, coordinators: usize) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        (0..coordinators).all(|c| {
            seen.iter()
                .any(|p| p.coordinator == c && p.sent > since && p.answer == Answer::Ok)
        })
    }
}

async fn probe(
    addr: SocketAddr,
    coordinator: usize,
    round: usize,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Probed>>>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let request = proto::ReserveRequest {
            request_id: format!("ha-probe-{round}-{coordinator}-{n}"),
            // A holder per call: probes are never limited by the holds per holder.
            holder: format!("ha-probe-{round}-{coordinator}-{n}"),
            ttl: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            holds: vec![proto::Hold {
                participant: "stock".into(),
                resource: PROBE_ITEM.into(),
                quantity: 1,
                during: None,
            }],
            labels: Default::default(),
            queue: None,
        };
        let sent = Instant::now();
        let answer = match probe_client(addr) {
            Some(mut c) => c.reserve(request).await.map(|r| r.into_inner()),
            None => Err(Status::internal("no client")),
        };
        let said = match &answer {
            Ok(r) => format!("{:?}", proto::reservation::State::try_from(r.state)),
            Err(s) => format!("{:?} {}", s.code(), s.message()),
        };
        seen.lock().unwrap_or_else(|e| e.into_inner()).push(Probed {
            coordinator,
            sent,
            answered: Instant::now(),
            answer: classify(&answer),
            said,
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client whose deadline (10 s) outlasts the coordinator's wait for a pooled connection (the
/// pool's 5 s acquire timeout): what the probes record is what the coordinator answers.
fn probe_client(addr: SocketAddr) -> Option<CoordinatorClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10));
    Some(CoordinatorClient::new(endpoint.connect_lazy()))
}

/// The refused window of one fault: from the first refused probe call after `fault` (its
/// sending) to the first success that follows the last refusal (its answer), over every
/// coordinator; zero when nothing was refused.
pub fn refused_window(probes: &[Probed], fault: Instant) -> Duration {
    let after: Vec<&Probed> = probes.iter().filter(|p| p.sent >= fault).collect();
    let refused = || after.iter().filter(|p| p.answer != Answer::Ok);
    let Some(first) = refused().map(|p| p.sent).min() else {
        return Duration::ZERO;
    };
    let last = refused().map(|p| p.answered).max().unwrap_or(first);
    let healed = after
        .iter()
        .filter(|p| p.answer == Answer::Ok && p.sent >= last)
        .map(|p| p.answered)
        .min()
        .unwrap_or(last);
    healed.saturating_duration_since(first)
}
