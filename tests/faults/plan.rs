//! What a seed picks: the workload (holders and what each does) and the fault plan.

use std::time::Duration;

/// splitmix64: small, seedable, good enough to pick schedules.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// In `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Every failpoint in `src/` (RELIABILITY.md).
pub const COORDINATOR_STORE: [&str; 14] = [
    "coord.create.before",
    "coord.create.after",
    "coord.record_held.before",
    "coord.record_held.after",
    "coord.record_rejected.before",
    "coord.record_rejected.after",
    "coord.decide.before",
    "coord.decide.after",
    "coord.record_phase.before",
    "coord.record_phase.after",
    "coord.refund_attempt.before",
    "coord.refund_attempt.after",
    "coord.claim_due.before",
    "coord.claim_due.after",
];
pub const COORDINATOR_CALLS: [&str; 6] = [
    "coord.try.before",
    "coord.try.after",
    "coord.confirm.before",
    "coord.confirm.after",
    "coord.cancel.before",
    "coord.cancel.after",
];
pub const PARTICIPANT: [&str; 6] = [
    "participant.try.between",
    "participant.try.committed",
    "participant.confirm.between",
    "participant.confirm.committed",
    "participant.cancel.between",
    "participant.cancel.committed",
];
/// Failpoints that run inside the placement task (its panic is a JoinError, answered
/// INTERNAL): the ones a plan may make panic.
pub const PANICKABLE: [&str; 3] = [
    "coord.try.after",
    "coord.record_held.before",
    "coord.record_held.after",
];

pub fn all_failpoints() -> impl Iterator<Item = &'static str> {
    COORDINATOR_STORE
        .into_iter()
        .chain(COORDINATOR_CALLS)
        .chain(PARTICIPANT)
}

/// What one holder does after its Reserve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Confirm,
    Cancel,
    ExtendThenConfirm,
    /// Walks away: the hold lapses and the reaper releases it.
    Abandon,
}

#[derive(Clone, Debug)]
pub struct HolderPlan {
    pub name: String,
    pub start_after: Duration,
    /// (participant, resource index, quantity)
    pub holds: Vec<(&'static str, usize, i64)>,
    pub ttl: Duration,
    pub act: Act,
    pub think: Duration,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// (stock resource, capacity)
    pub stock: Vec<(String, i64)>,
    pub seats: Vec<String>,
    pub holders: Vec<HolderPlan>,
    /// (failpoint, fail crate action) active during the workload.
    pub failpoints: Vec<(&'static str, String)>,
    /// Cut the network to this participant at .1 for .2.
    pub cut: Option<(&'static str, Duration, Duration)>,
    /// Kill the coordinator (drop its runtime) at this point and start another.
    pub kill_at: Option<Duration>,
    pub workload: Duration,
}

impl Plan {
    pub fn from_seed(seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let stock: Vec<(String, i64)> = (0..rng.range(1, 2))
            .map(|i| (format!("s{seed}-item{i}"), rng.range(2, 5) as i64))
            .collect();
        let seats: Vec<String> = (0..rng.range(2, 4))
            .map(|i| format!("s{seed}-seat{i}"))
            .collect();
        let workload = Duration::from_millis(rng.range(800, 1500));
        let holders = (0..rng.range(3, 7))
            .map(|h| {
                let mut holds = Vec::new();
                if rng.chance(70) {
                    let i = rng.range(0, stock.len() as u64 - 1) as usize;
                    holds.push(("stock", i, rng.range(1, 2) as i64));
                }
                if holds.is_empty() || rng.chance(60) {
                    let i = rng.range(0, seats.len() as u64 - 1) as usize;
                    holds.push(("seats", i, 1));
                }
                let act = match rng.range(0, 9) {
                    0..=4 => Act::Confirm,
                    5 => Act::Cancel,
                    6 | 7 => Act::ExtendThenConfirm,
                    _ => Act::Abandon,
                };
                HolderPlan {
                    name: format!("s{seed}-h{h}"),
                    start_after: Duration::from_millis(
                        rng.range(0, workload.as_millis() as u64 / 2),
                    ),
                    holds,
                    ttl: Duration::from_secs(rng.range(1, 2)),
                    act,
                    think: Duration::from_millis(rng.range(0, 300)),
                }
            })
            .collect();
        let mut failpoints = Vec::new();
        let names: Vec<&str> = all_failpoints().collect();
        for _ in 0..rng.range(0, 4) {
            let name = names[rng.range(0, names.len() as u64 - 1) as usize];
            if failpoints.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let action = if PANICKABLE.contains(&name) && rng.chance(50) {
                format!("{}%1*panic", rng.range(10, 50))
            } else {
                format!("{}%return", rng.range(5, 40))
            };
            failpoints.push((name, action));
        }
        let cut = rng.chance(30).then(|| {
            let who = if rng.chance(50) { "seats" } else { "stock" };
            let at = Duration::from_millis(rng.range(0, workload.as_millis() as u64));
            (who, at, Duration::from_millis(rng.range(100, 800)))
        });
        let kill_at = rng
            .chance(25)
            .then(|| Duration::from_millis(rng.range(100, workload.as_millis() as u64)));
        Plan {
            seed,
            stock,
            seats,
            holders,
            failpoints,
            cut,
            kill_at,
            workload,
        }
    }
}
