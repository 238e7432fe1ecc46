//! The scenarios: the database's raw commit rate (`ceiling`), Reserve+Confirm of 2 holds by
//! one or many clients (`latency`, `throughput`) on noop or real (seats + stock) participants,
//! a flash sale of many clients on few units of one stock item through the coordinator
//! (`flash`, on `stock` or `stock-redis`), a stock participant alone (`holds`), and Reserve
//! latency while retention purges a large backlog (`retention`). This module
//! holds what they share: the run context, the workloads, progress counters, the measurement
//! and the helpers for calls and their failures.

mod ceiling;
mod flash;
mod holds;
mod reserve_confirm;
pub mod retention;
mod waitlist;

pub use ceiling::ceiling;
pub use flash::flash;
pub use holds::holds;
pub(crate) use reserve_confirm::reserve_confirm_loop;
pub use waitlist::waitlist;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::bench::credentials::BenchChannel;
use tonic_types::StatusExt;

use super::Transport;
use super::deploy::Endpoints;
use super::stats::{Outcome, Recorder};
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::proto::{Hold, PutResourcesRequest, ResourceSpec};

/// Which participants the 2 holds of a Reserve+Confirm go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workload {
    /// One hold on each of two noop participants (or two resources on one, with `--target`
    /// and a single noop name): the coordinator's own cost.
    Noop,
    /// One seat (distinct for every reservation) and one unit of stock (an item per client,
    /// so clients do not queue on one row lock; `flash` measures that).
    Real,
}

impl Workload {
    /// Short name used in scenario names.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Noop => "noop",
            Workload::Real => "real",
        }
    }
}

/// Shared by every scenario of one run.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub endpoints: Endpoints,
    /// How the clients reach them (plaintext, or TLS).
    pub transport: Transport,
    /// Prefix of every holder, request id and resource this run creates, so runs against a
    /// long-lived `--target` never collide.
    pub run_id: String,
    /// Seats provisioned per client at a time.
    pub seat_block: usize,
}

/// Counters the progress line reads while workers run.
#[derive(Default)]
pub struct Progress {
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
    pub errors: AtomicU64,
}

impl Progress {
    fn count(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Ok => &self.ok,
            Outcome::Rejected => &self.rejected,
            Outcome::Error(_) => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Prints a progress line on stderr every second until the returned handle is aborted.
pub(crate) fn spawn_progress(
    name: String,
    progress: Arc<Progress>,
    planned: Option<Duration>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let secs = start.elapsed().as_secs_f64();
            let ok = progress.ok.load(Ordering::Relaxed);
            let of = planned
                .map(|d| format!("/{}s", d.as_secs()))
                .unwrap_or_default();
            eprintln!(
                "bench: {name:<16} {secs:>4.0}s{of}  ok={ok} rejected={} errors={}  ({:.0} ok/s)",
                progress.rejected.load(Ordering::Relaxed),
                progress.errors.load(Ordering::Relaxed),
                ok as f64 / secs.max(0.001),
            );
        }
    })
}

/// What a timed scenario measured.
pub struct Measured {
    pub recorder: Recorder,
    pub elapsed: Duration,
    pub notes: Vec<String>,
    pub extra: serde_json::Value,
    /// Database transactions the bench itself caused (provisioning, count reads), known
    /// exactly, to take out of the per-operation commit count.
    pub setup_xacts: i64,
}

impl std::fmt::Debug for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Measured")
            .field("ok", &self.recorder.ok())
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

async fn join_workers(handles: Vec<tokio::task::JoinHandle<Recorder>>) -> Recorder {
    let mut all = Recorder::default();
    for h in handles {
        match h.await {
            Ok(rec) => all.merge(rec),
            Err(e) => all.record(
                Outcome::Error(format!("worker task failed: {e}")),
                Duration::ZERO,
            ),
        }
    }
    all
}

/// Names a failed call: `op: CODE REASON` (or a trimmed message when there is no reason).
fn describe(op: &str, status: &tonic::Status) -> String {
    match status.get_error_details().error_info() {
        Some(info) => format!("{op}: {:?} {}", status.code(), info.reason),
        None => {
            let msg: String = status.message().chars().take(80).collect();
            format!("{op}: {:?} {msg}", status.code())
        }
    }
}

fn is_capacity_refusal(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition
        && status
            .get_error_details()
            .error_info()
            .is_some_and(|i| i.reason == "INSUFFICIENT_CAPACITY")
}

fn hold(participant: &str, resource: &str) -> Hold {
    Hold {
        participant: participant.to_owned(),
        resource: resource.to_owned(),
        quantity: 1,
        during: None,
    }
}

async fn put(
    admin: &mut ResourceAdminClient<BenchChannel>,
    specs: Vec<ResourceSpec>,
) -> Result<(), String> {
    admin
        .put_resources(PutResourcesRequest { resources: specs })
        .await
        .map(|_| ())
        .map_err(|s| describe("PutResources", &s))
}
