//! Crash tests against the real participants (#21 item 4): seats, stock and payments as real
//! gRPC servers on loopback with their real tables, a coordinator stopped at one exact step by
//! a failpoint (`panic`: the task dies there, then its runtime is killed like a process), and a
//! fresh coordinator on the same database that recovers. Each test checks the end state at the
//! participants (resource counts by `GetResource`, barrier rows), in the coordinator (state,
//! refund), and the calls every branch got across both coordinators (through
//! `common::spawn_tap`).
//!
//! Failpoints are process-global, so this binary is separate from `tests/coordinator` (whose
//! parallel tests would hit them) and its tests take turns ([`serial`]).

#[allow(dead_code, unused_imports)]
#[path = "../coordinator/common/mod.rs"]
mod common;
mod decided;
mod late;
mod placement;
mod waitlist;

use std::time::Duration;

use holdfast::app::CoordinatorSettings;
use holdfast::participants::{self, Kind, ParticipantSettings};
use holdfast::proto;
use sqlx::PgPool;

use common::{
    CallLog, KillableApp, PaymentsGate, put_resources, resource, settings, spawn_killable,
    spawn_participant_with, spawn_payments_gate,
};

/// Upper bound of every wait in this binary (recovery after a 2 s lease, on a loaded machine).
const PATIENCE: Duration = Duration::from_secs(30);

/// The lease of every coordinator here: what the second one waits out before it recovers.
const LEASE: Duration = Duration::from_secs(2);

// A tokio mutex: each `#[sqlx::test]` has a runtime of its own, and a tokio mutex works
// across runtimes (and is not poisoned by a failed test, which disarms what it armed).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One test at a time: the failpoints are shared by the whole process.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A failpoint armed for as long as this lives (removed on drop, even when the test fails).
pub struct Armed(&'static str);

pub fn arm(name: &'static str, action: &str) -> Armed {
    fail::cfg(name, action).unwrap_or_else(|e| panic!("failpoint {name} = {action}: {e}"));
    Armed(name)
}

impl Drop for Armed {
    fn drop(&mut self) {
        fail::remove(self.0);
    }
}

/// The real participants, each behind a tap (`common::spawn_tap`) sharing one call log, and the payments
/// participant behind a [`PaymentsGate`] (which counts Refund calls); all on the test database.
pub struct Shop {
    pub pool: PgPool,
    pub log: CallLog,
    /// Real URLs by registered name (for `GetResource`).
    pub real: Vec<(&'static str, String)>,
    /// What the coordinators are given: (name, URL of the tap or gate).
    pub registered: Vec<(&'static str, String)>,
    pub gate: PaymentsGate,
    pub payments: String,
}

/// Starts `seats` and `stock` (and `hall`, a second seats participant, when `hall`), each
/// behind a tap, plus payments behind the gate. `seats_grace` is the seats participant's
/// orphan grace. Provisions seats A1 (and hall B1), stock `sku` of 3, card-1 with 100 000.
pub async fn shop(pool: &PgPool, hall: bool, seats_grace: Option<Duration>) -> Shop {
    // Applied once, before several servers would each try to.
    participants::MIGRATOR.run(pool).await.unwrap();
    let log = CallLog::default();
    let mut kinds = vec![("seats", Kind::Seats), ("stock", Kind::Stock)];
    if hall {
        kinds.insert(0, ("hall", Kind::Seats));
    }
    let mut real = Vec::new();
    let mut registered = Vec::new();
    for (name, kind) in kinds {
        let mut s = ParticipantSettings::new(kind);
        if let (true, Some(grace)) = (name == "seats", seats_grace) {
            s.orphan_grace = grace;
        }
        let url = spawn_participant_with(s, pool).await;
        registered.push((name, common::spawn_tap(name, &url, log.clone()).await));
        real.push((name, url));
    }
    let payments = spawn_participant_with(ParticipantSettings::new(Kind::Payments), pool).await;
    let gate = spawn_payments_gate(&payments).await;
    registered.push(("payments", gate.url.clone()));
    let shop = Shop {
        pool: pool.clone(),
        log,
        real,
        registered,
        gate,
        payments,
    };
    put_resources(shop.url("seats"), &[("A1", 1)]).await;
    put_resources(shop.url("stock"), &[("sku", 3)]).await;
    if hall {
        put_resources(shop.url("hall"), &[("B1", 1)]).await;
    }
    put_resources(&shop.payments, &[("card-1", 100_000)]).await;
    shop
}

impl Shop {
    pub fn url(&self, name: &str) -> &str {
        &self
            .real
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is not in the shop"))
            .1
    }

    fn settings(&self) -> CoordinatorSettings {
        let pairs: Vec<(&str, &str)> = self
            .registered
            .iter()
            .map(|(n, u)| (*n, u.as_str()))
            .collect();
        let mut s = settings(&pairs);
        for p in &mut s.participants {
            p.timeout = Duration::from_secs(5);
        }
        s.policy.lease = LEASE;
        s
    }

    /// The coordinator that crashes: it never sweeps (nothing but the step under test runs).
    pub async fn first(&self) -> KillableApp {
        let mut s = self.settings();
        s.policy.sweep_interval = Duration::from_secs(3600);
        s.policy.queue.sweep = Duration::from_secs(3600);
        spawn_killable(&self.pool, s).await
    }

    /// The fresh coordinator that recovers, sweeping every 100 ms.
    pub async fn second(&self) -> KillableApp {
        let mut s = self.settings();
        s.policy.sweep_interval = Duration::from_millis(100);
        s.policy.queue.sweep = Duration::from_millis(100);
        spawn_killable(&self.pool, s).await
    }

    /// (available, held, confirmed) of `resource` at participant `name`.
    pub async fn counts(&self, name: &str, res: &str) -> (i64, i64, i64) {
        let s = resource(self.url(name), res).await;
        assert_eq!(
            s.capacity,
            s.available + s.held + s.confirmed,
            "{name}/{res} not conserved: {s:?}"
        );
        (s.available, s.held, s.confirmed)
    }

    /// How many times each branch of `name` got `method`, sorted (branch ids are random).
    pub fn sent(&self, name: &str, method: &str) -> Vec<usize> {
        let mut n: Vec<usize> = self.log.per_branch(name, method).into_values().collect();
        n.sort_unstable();
        n
    }

    /// The barrier rows of reservation `id` as (participant, state), sorted.
    pub async fn barrier(&self, id: &str) -> Vec<(String, String)> {
        sqlx::query_as(
            "SELECT participant, state FROM tcc_barrier WHERE reservation_id = $1 \
             ORDER BY participant, state",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// The coordinator's row: (state, refund_state, late_payment_honored).
    pub async fn stored(&self, id: &str) -> Stored {
        sqlx::query_as(
            "SELECT state, refund_state, late_payment_honored FROM reservations \
             WHERE id = $1::uuid",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Polls the coordinator's row until its (state, refund_state) is `want`, at most
    /// [`PATIENCE`]; the row.
    pub async fn wait_stored(&self, id: &str, want: (&str, Option<&str>)) -> Stored {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let now = self.stored(id).await;
            if (now.0.as_str(), now.1.as_deref()) == want {
                return now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "reservation {id} stayed {now:?}, expected {want:?}; calls {:?}",
                self.log.summary()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// (refunded_minor, number of refunds) of `payment_ref` at the payments participant.
    pub async fn refunded(&self, payment_ref: &str) -> (i64, usize) {
        let p = common::payment_record(&self.payments, payment_ref).await;
        (p.refunded_minor, p.refunds.len())
    }
}

pub type Stored = (String, Option<String>, bool);

/// A Reserve of `holds` (participant, resource, quantity) for `holder`, with `ttl`.
pub fn reserve(
    holder: &str,
    ttl: Option<Duration>,
    holds: &[(&str, &str, i64)],
) -> proto::ReserveRequest {
    let mut req = common::reserve_request(
        &format!("{holder}-order"),
        holds
            .iter()
            .map(|(p, r, q)| proto::Hold {
                quantity: *q,
                ..common::hold(p, r)
            })
            .collect(),
    );
    req.holder = holder.to_owned();
    req.ttl = ttl.map(common::proto_duration);
    req
}

/// The stored id of the one reservation of `holder` (a Reserve that crashed answered none).
pub async fn id_of(pool: &PgPool, holder: &str) -> String {
    sqlx::query_scalar("SELECT id::text FROM reservations WHERE holder = $1")
        .bind(holder)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Polls `GetReservation` until reservation `id` reads `EXPIRED`, at most [`PATIENCE`].
pub async fn wait_expired(
    client: &mut proto::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
    id: &str,
) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        if now.state == proto::reservation::State::Expired as i32 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never EXPIRED: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
