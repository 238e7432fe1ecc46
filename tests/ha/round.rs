//! One failover under load: the fault suite's holders (`plan.rs`, `workload.rs`: Reserve,
//! Confirm with and without a payment, late payments, Cancel, Extend, walking away, each call
//! repeated with the same request id or token while unanswered) start in waves across the three
//! coordinators while the probes (`probe.rs`) measure; the fault strikes the primary; the
//! round waits until a new primary serves every coordinator, lets the load run on, then checks
//! each wave with the fault suite's checkers (`runner::quiesce`, `runner::verify`: every
//! reservation terminal, conservation, all-or-nothing, refunds, the events, replays) and every
//! answer a holder or probe got (never a wrong one).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use crate::cluster::Cluster;
use crate::patroni;
use crate::plan::Plan;
use crate::probe::{self, Answer, Probed, Probes};
use crate::runner;
use crate::stack::{Coordinator, Stack};
use crate::workload::{self, Current, History, Outcome, Outcomes};

/// The fault a round injects into the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of the primary's postmaster.
    Kill,
    /// Patroni's planned switchover (`POST /switchover`).
    Switchover,
    /// The primary's network cut (its PostgreSQL relay and its link to etcd), restored once
    /// another node leads.
    Cut,
    /// The database unreachable for [`OUTAGE`] (HAProxy stopped, then started again), the
    /// cluster untouched: leases, sweeps and pools must outlast it.
    Outage,
}

/// How long an [`FaultKind::Outage`] lasts.
pub const OUTAGE: Duration = Duration::from_secs(60);

/// Waves of holders a round starts, one every [`WAVE_EVERY`].
const WAVES: u64 = 30;
const WAVE_EVERY: Duration = Duration::from_millis(250);

/// What a round measured.
#[derive(Debug)]
pub struct Report {
    pub kind: FaultKind,
    /// From the first refused call to the first success after the last one.
    pub window: Duration,
    /// From the fault to every coordinator served by the new primary.
    pub recovered: Duration,
    pub answers: BTreeMap<String, u64>,
    pub reservations: usize,
}

/// One wave: a seed's plan, the coordinator its holders call, what they got.
struct Wave {
    plan: Plan,
    current: Current,
    history: History,
    outcomes: Outcomes,
}

async fn provision(stack: &Stack, plan: &Plan) {
    stack.put("stock", &plan.stock).await;
    let ones = |v: &[String]| v.iter().map(|s| (s.clone(), 1)).collect::<Vec<_>>();
    stack.put("seats", &ones(&plan.seats)).await;
    stack.put("rooms", &ones(&plan.rooms)).await;
    stack.put("stock-redis", &plan.redis).await;
    stack
        .put("payments", std::slice::from_ref(&plan.account))
        .await;
}

/// The holders' waves, started one after another in a task of their own.
fn launch(
    stack: &Stack,
    waves: &[Wave],
) -> tokio::task::JoinHandle<Vec<tokio::task::JoinHandle<()>>> {
    let waves: Vec<_> = waves
        .iter()
        .map(|w| {
            let holders: Vec<_> = w.plan.holders.clone();
            (
                w.plan.clone(),
                holders,
                w.current.clone(),
                w.history.clone(),
                w.outcomes.clone(),
            )
        })
        .collect();
    let payments = stack.payments.clone();
    tokio::spawn(async move {
        let mut started = Vec::new();
        for (plan, holders, current, history, outcomes) in waves {
            for h in holders {
                let (plan, current, history) = (plan.clone(), current.clone(), history.clone());
                let (payments, outcomes) = (payments.clone(), outcomes.clone());
                started.push(tokio::spawn(async move {
                    workload::run_holder(&plan, h, current, history, payments, outcomes).await
                }));
            }
            tokio::time::sleep(WAVE_EVERY).await;
        }
        started
    })
}

/// Strikes the primary; returns the old leader's name once the fault is in (a switchover:
/// once Patroni says it is done).
async fn strike(cluster: &Cluster, kind: FaultKind) -> String {
    let leader = cluster.leader().await.expect("a leader before the fault");
    let name = leader.name.clone();
    match kind {
        FaultKind::Kill => {
            let pid = leader
                .running_postmaster()
                .expect("the primary's postmaster");
            let killed = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .expect("kill");
            assert!(killed.success(), "kill -KILL {pid}");
        }
        FaultKind::Switchover => {
            if let Err(e) = patroni::switchover(leader.rest_port, &name).await {
                panic!("switchover: {e}\n{}", cluster.logs());
            }
        }
        FaultKind::Cut => {
            leader.pg_relay.cut().await;
            leader.dcs_relay.cut().await;
        }
        FaultKind::Outage => {
            cluster.stop_routing();
            tokio::time::sleep(OUTAGE).await;
            cluster.start_routing();
        }
    }
    name
}

/// Waits until a node other than `old` leads and every coordinator served a probe sent after
/// that; restores a cut node's network then.
async fn await_new_primary(
    cluster: &Cluster,
    probes: &Probes,
    old: &str,
    kind: FaultKind,
    n: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let elected = if kind == FaultKind::Outage {
        // The primary stays; the database is back once HAProxy routes again.
        Instant::now()
    } else {
        new_leader(cluster, old, kind, deadline).await
    };
    if kind == FaultKind::Cut
        && let Some(node) = cluster.nodes.iter().find(|n| n.name == old)
    {
        node.pg_relay.restore().await;
        node.dcs_relay.restore().await;
    }
    while !probes.all_served_since(elected, n) {
        assert!(
            Instant::now() < deadline,
            "the coordinators are not served 120 s after {kind:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// When a node other than `old` leads.
async fn new_leader(cluster: &Cluster, old: &str, kind: FaultKind, deadline: Instant) -> Instant {
    loop {
        if let Some(l) = cluster.leader().await
            && l.name != old
        {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "no new leader after {kind:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a holder's refusal is a wrong answer: INTERNAL or UNKNOWN, or UNAVAILABLE other
/// than the storage's (with RetryInfo) or a participant's.
fn wrong(s: &Status) -> bool {
    match s.code() {
        Code::Internal | Code::Unknown => true,
        Code::Unavailable => !matches!(
            probe::classify(&Err(s.clone())),
            Answer::StorageUnavailable | Answer::ParticipantUnavailable
        ),
        _ => false,
    }
}

fn wrong_answers(outcomes: &[Outcome]) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for o in outcomes {
        let answers = o.reserved.iter().chain(o.calls.iter().map(|(_, a)| a));
        for a in answers {
            if let Err(s) = a
                && wrong(s)
            {
                v.push((o.holder.clone(), format!("a wrong answer: {s:?}")));
            }
        }
    }
    v
}

/// Runs one round; panics with every violation found.
pub async fn round(
    cluster: &Cluster,
    stack: &Stack,
    coordinators: &[Coordinator],
    kind: FaultKind,
    round: u64,
) -> Report {
    let addrs: Vec<_> = coordinators.iter().map(|c| c.addr).collect();
    let mut waves = Vec::new();
    for i in 0..WAVES {
        let mut plan = Plan::from_seed(round * 1000 + i + 1);
        // The fault is the round's; the coordinators' late payment policy is the stack's.
        plan.failpoints.clear();
        plan.faults.clear();
        plan.late_refund = false;
        provision(stack, &plan).await;
        waves.push(Wave {
            plan,
            current: Arc::new(Mutex::new(addrs[i as usize % addrs.len()])),
            history: Arc::new(Mutex::new(Vec::new())),
            outcomes: Arc::new(Mutex::new(Vec::new())),
        });
    }
    let probes = Probes::start(&addrs, round as usize);
    let launcher = launch(stack, &waves);
    let began = Instant::now();
    while !probes.all_served_since(began, addrs.len()) {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "no load before the fault"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let fault = Instant::now();
    let old = strike(cluster, kind).await;
    await_new_primary(cluster, &probes, &old, kind, addrs.len()).await;
    let recovered = fault.elapsed();
    let holders = launcher.await.expect("the launcher");
    // The load runs on a while against the new primary.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for h in holders {
        tokio::time::timeout(Duration::from_secs(120), h)
            .await
            .expect("a holder finishes within 120 s")
            .expect("a holder");
    }
    let probed = probes.stop().await;
    // The probes' reservations settle first: the event log is read once, at quiescence.
    let mut violations = check_probes(stack, &probed, fault).await;
    let (found, reservations) = check_waves(stack, &waves).await;
    violations.extend(found);
    if !violations.is_empty() {
        panic!("VIOLATIONS after {kind:?} (round {round}): {violations:#?}");
    }
    let mut answers = BTreeMap::new();
    for p in probed.iter().filter(|p| p.sent >= fault) {
        *answers.entry(format!("{:?}", p.answer)).or_default() += 1;
    }
    cluster.healthy(Duration::from_secs(120)).await;
    Report {
        kind,
        window: probe::refused_window(&probed, fault),
        recovered,
        answers,
        reservations,
    }
}

/// Each wave checked as the fault suite checks a seed; (violations, reservations checked).
async fn check_waves(stack: &Stack, waves: &[Wave]) -> (Vec<(String, String)>, usize) {
    let (mut violations, mut n) = (Vec::new(), 0);
    for w in waves {
        let reservations = runner::quiesce(stack, &w.plan, &w.current, &w.history).await;
        n += reservations.len();
        let outcomes = w.outcomes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (found, _) = runner::verify(stack, &w.plan, &w.current, &reservations, &outcomes).await;
        violations.extend(found);
        violations.extend(wrong_answers(&outcomes));
    }
    (violations, n)
}

/// Every probe answer a success or a refusal to act on; the probe resource conserved, nothing
/// left held once its reservations expired.
async fn check_probes(stack: &Stack, probed: &[Probed], fault: Instant) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = probed
        .iter()
        .filter(|p| p.answer == Answer::Wrong)
        .map(|p| {
            let at = p.sent.saturating_duration_since(fault);
            (
                String::new(),
                format!(
                    "probe {} +{at:?}: a wrong answer: {}",
                    p.coordinator, p.said
                ),
            )
        })
        .collect();
    let deadline = Instant::now() + runner::QUIESCENCE;
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE holder LIKE 'ha-probe-%' \
             AND state NOT IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')",
        )
        .fetch_one(&stack.pool)
        .await
        .unwrap_or_else(|e| panic!("reading the probes' reservations: {e}"));
        let s = stack.resource("stock", probe::PROBE_ITEM).await;
        if s.available + s.held + s.confirmed != probe::PROBE_CAPACITY {
            v.push((
                String::new(),
                format!("probe resource not conserved: {s:?}"),
            ));
            break;
        }
        if s.held == 0 && open == 0 {
            break;
        }
        if Instant::now() > deadline {
            v.push((
                String::new(),
                format!("probes: {open} reservations open, {s:?} at quiescence"),
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    v
}

impl Report {
    pub fn line(&self) -> String {
        format!(
            "{:?}: refused window {:.2?}, every coordinator served {:.2?} after the fault, \
             {} reservations, probe answers {:?}",
            self.kind, self.window, self.recovered, self.reservations, self.answers
        )
    }
}
