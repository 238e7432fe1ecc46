//! One seed's schedule: provision, arm the failpoints, run the holders while the fault driver
//! cuts and heals, kills and restarts, terminates backends (conservation read live
//! meanwhile), heal everything, wait for quiescence (recovery backlog 0), then check every
//! invariant and replay every definitive client call. A violation panics with the seed, the
//! plan, the reservations involved with their barrier rows and refunds, and the history.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::proto;

use crate::plan::{self, Fault, Plan};
use crate::stack::{Coordinator, Stack, client};
use crate::workload::{self, Current, History, Outcome, Outcomes};
use crate::{check, money, replay};

/// Every reservation terminal and every refund acknowledged within this long after the
/// faults heal.
pub const QUIESCENCE: Duration = Duration::from_secs(45);

/// Removes every failpoint, also when a schedule panics.
pub struct Healed;

impl Drop for Healed {
    fn drop(&mut self) {
        for name in plan::all_failpoints() {
            fail::remove(name);
        }
    }
}

#[derive(Default)]
pub struct Totals {
    pub seeds: u64,
    pub reservations: u64,
    pub by_state: BTreeMap<String, u64>,
    pub acts: BTreeMap<String, u64>,
    pub failpoints: BTreeMap<String, u64>,
    pub panics_planned: u64,
    pub faults: BTreeMap<String, u64>,
    pub backends_terminated: i64,
    pub boundary_seeds: u64,
    pub late_refund_seeds: u64,
    pub refunds: u64,
    pub late_honoured: u64,
    pub replays: u64,
    pub live_checks: u64,
    pub live_skipped: u64,
    /// Seeds that failed (only when going on after a failure).
    pub failed: Vec<u64>,
}

impl Totals {
    pub fn report(&self, started: Instant) -> String {
        format!(
            "{} seeds ({} near expiry, {} under policy refund), {} reservations checked {:?}, \
             acts {:?}, {} refunds, {} late payments honoured, {} replayed calls; \
             failpoints armed {:?} ({} with a panic); faults {:?} ({} backends terminated); \
             {} live conservation reads ({} resource reads skipped: participant down), \
             seeds with a violation: {:?}, {:.1?}",
            self.seeds,
            self.boundary_seeds,
            self.late_refund_seeds,
            self.reservations,
            self.by_state,
            self.acts,
            self.refunds,
            self.late_honoured,
            self.replays,
            self.failpoints,
            self.panics_planned,
            self.faults,
            self.backends_terminated,
            self.live_checks,
            self.live_skipped,
            self.failed,
            started.elapsed()
        )
    }
}

fn note(history: &History, line: String) {
    history.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

/// Runs one seed's schedule and checks it; with `keep_going`, a violation (a panic) is
/// reported on stderr and counted in `totals.failed`, and the next seed runs (long unattended
/// runs); else it panics.
pub async fn run_seed_or_record(stack: &Stack, seed: u64, totals: &mut Totals, keep_going: bool) {
    if !keep_going {
        run_seed(stack, seed, totals).await;
        return;
    }
    use futures_util::FutureExt;
    let ran = std::panic::AssertUnwindSafe(run_seed(stack, seed, totals))
        .catch_unwind()
        .await;
    if ran.is_err() {
        eprintln!("faults: seed {seed} FAILED (its report is above); going on");
        totals.failed.push(seed);
    }
}

/// A seed that ran and passed its checks, its coordinator still up (for `mutations.rs`).
pub struct Ran {
    pub plan: Plan,
    pub current: Current,
    pub reservations: Vec<proto::Reservation>,
    pub outcomes: Vec<Outcome>,
    _coordinator: Option<Coordinator>,
}

/// Runs one seed's schedule and checks it; panics on a violation.
pub async fn run_seed(stack: &Stack, seed: u64, totals: &mut Totals) -> Ran {
    run_plan(stack, Plan::from_seed(seed), totals).await
}

/// Runs a schedule and checks it; panics on a violation.
pub async fn run_plan(stack: &Stack, plan: Plan, totals: &mut Totals) -> Ran {
    let seed = plan.seed;
    let _healed = Healed;
    stack.put("stock", &plan.stock).await;
    let ones = |v: &[String]| v.iter().map(|s| (s.clone(), 1)).collect::<Vec<_>>();
    stack.put("seats", &ones(&plan.seats)).await;
    stack.put("rooms", &ones(&plan.rooms)).await;
    stack.put("stock-redis", &plan.redis).await;
    stack
        .put("payments", std::slice::from_ref(&plan.account))
        .await;

    let settings = stack.settings(plan.late_refund);
    let coordinator = Coordinator::start(&stack.pool, settings.clone(), &stack.events.url).await;
    let current: Current = Arc::new(Mutex::new(coordinator.addr));
    let mut coordinator = Some(coordinator);
    let history: History = Arc::new(Mutex::new(Vec::new()));
    let outcomes: Outcomes = Arc::new(Mutex::new(Vec::new()));
    for (name, action) in &plan.failpoints {
        fail::cfg(*name, action).unwrap_or_else(|e| panic!("failpoint {name} = {action}: {e}"));
        *totals.failpoints.entry((*name).to_owned()).or_default() += 1;
        totals.panics_planned += u64::from(action.contains("panic"));
    }
    let started = Instant::now();
    let holders: Vec<_> = plan
        .holders
        .iter()
        .cloned()
        .map(|h| {
            let (plan, current, history) = (plan.clone(), current.clone(), history.clone());
            let (payments, outcomes) = (stack.payments.clone(), outcomes.clone());
            tokio::spawn(async move {
                workload::run_holder(&plan, h, current, history, payments, outcomes).await
            })
        })
        .collect();

    // The fault driver; conservation read live meanwhile.
    let mut next = 0;
    // (when, participant, restart rather than reconnect)
    let mut heals: Vec<(Duration, &'static str, bool)> = Vec::new();
    let mut live = Vec::new();
    while started.elapsed() < plan.workload || next < plan.faults.len() || !heals.is_empty() {
        let t = started.elapsed();
        while next < plan.faults.len() && plan.faults[next].0 <= t {
            let fault = plan.faults[next].1.clone();
            next += 1;
            let kind = match fault {
                Fault::Cut(who, len) => {
                    stack.participant(who).relay.cut().await;
                    heals.push((t + len, who, false));
                    format!("cut {who}")
                }
                Fault::KillParticipant(who, down) => {
                    stack.participant(who).kill();
                    heals.push((t + down, who, true));
                    format!("kill {who}")
                }
                Fault::KillCoordinator => {
                    if let Some(mut old) = coordinator.take() {
                        old.kill();
                    }
                    let started =
                        Coordinator::start(&stack.pool, settings.clone(), &stack.events.url).await;
                    *current.lock().unwrap_or_else(|e| e.into_inner()) = started.addr;
                    coordinator = Some(started);
                    "kill coordinator".to_owned()
                }
                Fault::TerminateBackends => {
                    let n = stack.terminate_coordinator_backends().await;
                    totals.backends_terminated += n;
                    format!("pg_terminate_backend x{n}")
                }
            };
            note(&history, format!("fault: {kind} at {t:?}"));
            let family = kind.split(" x").next().unwrap_or(&kind).to_owned();
            *totals.faults.entry(family).or_default() += 1;
        }
        let mut i = 0;
        while i < heals.len() {
            if heals[i].0 <= t {
                let (_, who, restart) = heals.remove(i);
                if restart {
                    stack.participant(who).restart().await;
                    note(
                        &history,
                        format!("fault: restarted {who} at {:?}", started.elapsed()),
                    );
                } else {
                    stack.participant(who).relay.restore().await;
                    note(
                        &history,
                        format!("fault: healed {who} at {:?}", started.elapsed()),
                    );
                }
            } else {
                i += 1;
            }
        }
        let (found, skipped) = check::conservation(stack, &plan).await;
        live.extend(found);
        totals.live_checks += 1;
        totals.live_skipped += skipped;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for h in holders {
        if tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .is_err()
        {
            panic!("seed {seed}: a holder did not finish within 60 s\nplan: {plan:#?}");
        }
    }
    for name in plan::all_failpoints() {
        fail::remove(name);
    }
    note(
        &history,
        format!("failpoints removed at {:?}", started.elapsed()),
    );

    let reservations = quiesce(stack, &plan, &current, &history).await;
    let outcomes = outcomes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut violations: Vec<(String, String)> = live
        .into_iter()
        .map(|v| (String::new(), format!("live: {v}")))
        .collect();
    let (found, n) = verify(stack, &plan, &current, &reservations, &outcomes).await;
    violations.extend(found);
    totals.replays += n;
    let ids: Vec<String> = reservations.iter().map(|r| r.id.clone()).collect();
    let refunds_after = money::refunds_at_payments(&stack.pool, &ids).await;
    if !violations.is_empty() {
        let ids: Vec<String> = violations.iter().map(|(id, _)| id.clone()).collect();
        let involved: Vec<&proto::Reservation> = reservations
            .iter()
            .filter(|r| ids.contains(&r.id))
            .collect();
        let barriers = check::barriers(&stack.pool, &ids).await;
        panic!(
            "VIOLATION, seed {seed} (replay: HOLDFAST_FAULT_SEED={seed} cargo test --test faults)\n\
             violations: {violations:#?}\nplan: {plan:#?}\nreservations involved: {involved:#?}\n\
             their barrier rows: {barriers:#?}\nrefunds at the payment service: {refunds_after:#?}\nhistory:\n{}",
            history.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
        );
    }
    totals.seeds += 1;
    totals.boundary_seeds += u64::from(plan.boundary);
    totals.late_refund_seeds += u64::from(plan.late_refund);
    totals.reservations += reservations.len() as u64;
    for h in &plan.holders {
        *totals.acts.entry(format!("{:?}", h.act)).or_default() += 1;
    }
    for r in &reservations {
        let state = proto::reservation::State::try_from(r.state)
            .map_or_else(|_| "?".to_owned(), |s| s.as_str_name().to_owned());
        *totals.by_state.entry(state).or_default() += 1;
        totals.refunds += u64::from(r.refund.is_some());
        totals.late_honoured += u64::from(r.late_payment_honored);
    }
    Ran {
        plan,
        current,
        reservations,
        outcomes,
        _coordinator: coordinator,
    }
}

/// Every check after quiescence (`check.rs`, `money.rs`, then the replays of `replay.rs` and
/// what they must not change); returns (reservation id, problem) pairs and the number of
/// calls replayed.
pub async fn verify(
    stack: &Stack,
    plan: &Plan,
    current: &Current,
    reservations: &[proto::Reservation],
    outcomes: &[Outcome],
) -> (Vec<(String, String)>, u64) {
    let mut violations = check::settled(stack, plan, reservations).await;
    violations.extend(check::event_log(&stack.pool, reservations).await);
    violations.extend(stack.events.check(&stack.pool).await);
    violations.extend(money::check(&stack.pool, plan, reservations, outcomes).await);
    let ids: Vec<String> = reservations.iter().map(|r| r.id.clone()).collect();
    let refunds_before = money::refunds_at_payments(&stack.pool, &ids).await;
    let (replayed, n) = replay::replay(current, outcomes).await;
    violations.extend(replayed);
    let after = read_all(current, plan.seed, &ids).await;
    for (a, b) in reservations.iter().zip(&after) {
        if a.state != b.state
            || a.refund.as_ref().map(|r| &r.refund_id) != b.refund.as_ref().map(|r| &r.refund_id)
        {
            violations.push((
                a.id.clone(),
                format!("changed by the replays: {a:?} -> {b:?}"),
            ));
        }
    }
    let refunds_after = money::refunds_at_payments(&stack.pool, &ids).await;
    if refunds_after != refunds_before {
        violations.push((
            String::new(),
            format!("the replays changed the refunds: {refunds_before:?} -> {refunds_after:?}"),
        ));
    }
    (violations, n)
}

/// Waits until the recovery backlog of the seed is 0 (nothing TRYING, HELD, CONFIRMING or
/// CANCELLING, no late payment being honoured, no refund pending), then reads each
/// reservation from the coordinator.
pub async fn quiesce(
    stack: &Stack,
    plan: &Plan,
    current: &Current,
    history: &History,
) -> Vec<proto::Reservation> {
    let seed = plan.seed;
    let deadline = Instant::now() + QUIESCENCE;
    let pattern = format!("s{seed}-%");
    loop {
        let open: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT id::text, state, coalesce(refund_state, '') FROM reservations \
             WHERE holder LIKE $1 AND (state NOT IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED') \
               OR refund_state = 'PENDING' \
               OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)) \
             UNION ALL SELECT e.reservation_id::text, 'extra payment', e.refund_state \
             FROM extra_payments e JOIN reservations r ON r.id = e.reservation_id \
             WHERE r.holder LIKE $1 AND e.refund_state = 'PENDING'",
        )
        .bind(&pattern)
        .fetch_all(&stack.pool)
        .await
        .unwrap_or_else(|e| panic!("reading the recovery backlog: {e}"));
        if open.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "LIVENESS VIOLATION, seed {seed}: recovery backlog not 0 {QUIESCENCE:?} after the faults healed; still open: {open:?}\nplan: {plan:#?}\nhistory:\n{}",
                history.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT id::text FROM reservations WHERE holder LIKE $1 ORDER BY id")
            .bind(&pattern)
            .fetch_all(&stack.pool)
            .await
            .unwrap_or_else(|e| panic!("reading the seed's reservations: {e}"));
    read_all(current, seed, &ids).await
}

async fn read_all(current: &Current, seed: u64, ids: &[String]) -> Vec<proto::Reservation> {
    let addr = *current.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = client(addr)
        .await
        .expect("a client of the live coordinator");
    let mut out = Vec::new();
    for id in ids {
        let request = proto::GetReservationRequest {
            reservation_id: id.clone(),
        };
        let mut tries = 0;
        let r = loop {
            match c.get_reservation(request.clone()).await {
                Ok(r) => break r.into_inner(),
                // UNAVAILABLE with STORAGE_UNAVAILABLE says "retry the same request" (SPEC 3.2): a pooled connection whose
                // backend a fault ended answers one statement with an error before the pool
                // replaces it, as a client of a real deployment sees after a failover.
                Err(e) if e.code() == tonic::Code::Unavailable && tries < READ_TRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("seed {seed}: GetReservation {id} (try {tries}): {e}"),
            }
        };
        out.push(r);
    }
    out
}

/// How often a final read is repeated while the coordinator answers UNAVAILABLE.
const READ_TRIES: u32 = 10;
