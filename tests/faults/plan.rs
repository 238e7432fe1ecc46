//! What a seed picks: the workload (resources, holders and what each does) and the fault plan.

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
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

/// Every failpoint in `src/` (RELIABILITY.md).
pub const COORDINATOR_STORE: [&str; 16] = [
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
    "coord.offer.before",
    "coord.offer.placed",
];
pub const COORDINATOR_CALLS: [&str; 6] = [
    "coord.try.before",
    "coord.try.after",
    "coord.confirm.before",
    "coord.confirm.after",
    "coord.cancel.before",
    "coord.cancel.after",
];
pub const PARTICIPANT: [&str; 8] = [
    "participant.try.between",
    "participant.try.committed",
    "participant.confirm.between",
    "participant.confirm.committed",
    "participant.cancel.between",
    "participant.cancel.committed",
    "stock_redis.confirm.between",
    "stock_redis.confirm.committed",
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
    /// Charges a card for the reservation, then Confirms with that payment.
    Pay,
    /// Walks away past `expires_at`, then charges and Confirms with the payment: a late
    /// payment, honoured or refunded by the policy (SPEC 3.1).
    PayLate,
    Cancel,
    /// Cancels, then Confirms with a payment: refunded (`RESERVATION_CLOSED`).
    CancelThenPay,
    ExtendThenConfirm,
    /// Walks away: the hold lapses and the reaper releases it.
    Abandon,
}

impl Act {
    pub fn pays(self) -> bool {
        matches!(self, Act::Pay | Act::PayLate | Act::CancelThenPay)
    }
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
    /// The payment's amount (acts that pay).
    pub amount: i64,
    /// Reserves with `queue` (SPEC 11): refused for capacity, it waits up to [`QUEUED_HOLDER_WAIT`]
    /// for an offer, then acts once it holds.
    pub queue: bool,
}

/// How long a queued holder waits for an offer: short, so every wait ends within the seed.
pub const QUEUED_HOLDER_WAIT: Duration = Duration::from_secs(3);

/// A fault at a point of the workload.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Cut the network to a participant, heal it after the duration.
    Cut(&'static str, Duration),
    /// Kill the coordinator (drop its runtime) and start another on the same database.
    KillCoordinator,
    /// Kill a participant, restart it on the same port and database after the duration.
    KillParticipant(&'static str, Duration),
    /// `pg_terminate_backend` every Postgres backend of the coordinator (this database only).
    TerminateBackends,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// (resource, capacity) per participant name.
    pub stock: Vec<(String, i64)>,
    pub seats: Vec<String>,
    pub rooms: Vec<String>,
    pub redis: Vec<(String, i64)>,
    /// The account holds authorise on and payments are charged to.
    pub account: (String, i64),
    pub holders: Vec<HolderPlan>,
    /// (failpoint, fail crate action) active during the workload.
    pub failpoints: Vec<(&'static str, String)>,
    /// Faults, by when they strike.
    pub faults: Vec<(Duration, Fault)>,
    /// Late payment policy `refund` (else `honor_if_available`).
    pub late_refund: bool,
    /// ttls of 1 s and think times around them: Confirms race expiry.
    pub boundary: bool,
    pub workload: Duration,
}

/// The participants a cut or a kill may hit.
const TARGETS: [&str; 5] = ["seats", "stock", "rooms", "payments", "stock-redis"];

impl Plan {
    pub fn from_seed(seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let stock: Vec<(String, i64)> = (0..rng.range(1, 2))
            .map(|i| (format!("s{seed}-item{i}"), rng.range(2, 5) as i64))
            .collect();
        let seats: Vec<String> = (0..rng.range(2, 3))
            .map(|i| format!("s{seed}-seat{i}"))
            .collect();
        let rooms: Vec<String> = (0..rng.range(1, 2))
            .map(|i| format!("s{seed}-room{i}"))
            .collect();
        let redis: Vec<(String, i64)> = vec![(format!("s{seed}-flash"), rng.range(2, 4) as i64)];
        let account = (format!("s{seed}-card"), 1_000_000);
        let workload = rng.millis(700, 1200);
        let boundary = rng.chance(30);
        let late_refund = rng.chance(30);
        let holders = (0..rng.range(3, 7))
            .map(|h| {
                let mut holds = Vec::new();
                let kinds = [
                    ("stock", 40, stock.len()),
                    ("seats", 40, seats.len()),
                    ("rooms", 25, rooms.len()),
                    ("stock-redis", 30, redis.len()),
                    ("payments", 20, 1),
                ];
                for (p, chance, n) in kinds {
                    if rng.chance(chance) {
                        let i = rng.range(0, n as u64 - 1) as usize;
                        let q = match p {
                            "stock" | "stock-redis" => rng.range(1, 2) as i64,
                            "payments" => rng.range(100, 900) as i64,
                            _ => 1,
                        };
                        holds.push((p, i, q));
                    }
                }
                if holds.is_empty() {
                    let i = rng.range(0, seats.len() as u64 - 1) as usize;
                    holds.push(("seats", i, 1));
                }
                let act = match rng.range(0, 19) {
                    0..=5 => Act::Confirm,
                    6..=8 => Act::Pay,
                    9 | 10 => Act::PayLate,
                    11 | 12 => Act::Cancel,
                    13 => Act::CancelThenPay,
                    14..=16 => Act::ExtendThenConfirm,
                    _ => Act::Abandon,
                };
                // Mostly the shortest ttl (1 s, SPEC 3.2's floor): expiry, late payments and
                // abandoned holds then settle within the seed's few seconds.
                let ttl = if boundary || !rng.chance(20) {
                    Duration::from_secs(1)
                } else {
                    Duration::from_secs(2)
                };
                // Near the boundary the holder thinks about as long as its ttl, so its
                // Confirm reaches the coordinator just before or just after expires_at.
                let think = if boundary && !matches!(act, Act::PayLate | Act::Abandon) {
                    rng.millis(850, 1100)
                } else {
                    rng.millis(0, 300)
                };
                HolderPlan {
                    name: format!("s{seed}-h{h}"),
                    start_after: rng.millis(0, workload.as_millis() as u64 / 2),
                    holds,
                    ttl,
                    act,
                    think,
                    amount: rng.range(1_000, 5_000) as i64,
                    queue: rng.chance(30),
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
        let w = workload.as_millis() as u64;
        let mut faults = Vec::new();
        if rng.chance(25) {
            let who = TARGETS[rng.range(0, TARGETS.len() as u64 - 1) as usize];
            faults.push((rng.millis(0, w), Fault::Cut(who, rng.millis(100, 800))));
        }
        if rng.chance(20) {
            faults.push((rng.millis(100, w), Fault::KillCoordinator));
        }
        if rng.chance(20) {
            let who = TARGETS[rng.range(0, TARGETS.len() as u64 - 1) as usize];
            faults.push((
                rng.millis(0, w),
                Fault::KillParticipant(who, rng.millis(50, 600)),
            ));
        }
        if rng.chance(20) {
            for _ in 0..rng.range(1, 2) {
                faults.push((rng.millis(0, w), Fault::TerminateBackends));
            }
        }
        faults.sort_by_key(|(at, _)| *at);
        Plan {
            seed,
            stock,
            seats,
            rooms,
            redis,
            account,
            holders,
            failpoints,
            faults,
            late_refund,
            boundary,
            workload,
        }
    }

    /// Every (participant, resource, provisioned capacity).
    pub fn resources(&self) -> Vec<(&'static str, String, i64)> {
        let mut out: Vec<(&'static str, String, i64)> = Vec::new();
        out.extend(self.stock.iter().map(|(r, c)| ("stock", r.clone(), *c)));
        out.extend(self.seats.iter().map(|r| ("seats", r.clone(), 1)));
        out.extend(self.rooms.iter().map(|r| ("rooms", r.clone(), 1)));
        out.extend(
            self.redis
                .iter()
                .map(|(r, c)| ("stock-redis", r.clone(), *c)),
        );
        out.push(("payments", self.account.0.clone(), self.account.1));
        out
    }

    /// The resource id of a holder's hold.
    pub fn resource(&self, participant: &str, i: usize) -> String {
        match participant {
            "stock" => self.stock[i].0.clone(),
            "seats" => self.seats[i].clone(),
            "rooms" => self.rooms[i].clone(),
            "stock-redis" => self.redis[i].0.clone(),
            _ => self.account.0.clone(),
        }
    }
}
