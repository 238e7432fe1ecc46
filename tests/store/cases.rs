//! The conformance cases: storage-level behaviour every backend must show, each written once
//! against `Arc<dyn Store>` (see `main.rs` for how each runs on PostgreSQL and on SQLite).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use holdfast::domain::LatePaymentPolicy;
use holdfast::domain::lifecycle::Refusal;
use holdfast::domain::policy::{Backoff, HoldLimits, LimitScope};
use holdfast::domain::{
    BranchState, Decision, Hold, HoldToken, Interval, ListQuery, NewReservation, Payment,
    RefundState, Rejection, Reservation, State, Verdict,
};
use holdfast::store::{BranchReport, Claimed, Created, Decided, Store, WorkLease};
use uuid::Uuid;

type S = Arc<dyn Store>;

const LONG: Duration = Duration::from_secs(600);
/// A ttl that lapses within the test (then `lapse()` waits it out).
const SHORT: Duration = Duration::from_millis(300);

async fn lapse() {
    tokio::time::sleep(Duration::from_millis(450)).await;
}

fn lease() -> WorkLease {
    WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_secs(30),
    }
}

fn limits(per_holder: u32, total: u32) -> HoldLimits {
    HoldLimits { per_holder, total }
}

const NO_LIMITS: HoldLimits = HoldLimits {
    per_holder: 1000,
    total: 0,
};

/// Retry much later: nothing is due again during the test.
const SLOW: Backoff = Backoff {
    base: Duration::from_secs(3600),
    cap: Duration::from_secs(3600),
};

/// Retry at once.
const FAST: Backoff = Backoff {
    base: Duration::from_millis(1),
    cap: Duration::from_millis(1),
};

fn at(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap()
}

/// Three holds in canonical order: one room slot (microsecond precision), two seats.
fn new_res(holder: &str, request_id: &str, ttl: Duration) -> NewReservation {
    let mut labels = BTreeMap::new();
    labels.insert("order".to_owned(), "o-1".to_owned());
    labels.insert("ünïcode".to_owned(), "\"quoted\" value".to_owned());
    NewReservation {
        request_id: request_id.to_owned(),
        holder: holder.to_owned(),
        ttl,
        holds: vec![
            Hold {
                participant: "rooms".into(),
                resource: "r1".into(),
                quantity: 1,
                during: Some(Interval {
                    start: at(1_900_000_000_123_456),
                    end: at(1_900_003_600_654_321),
                }),
            },
            Hold {
                participant: "seats".into(),
                resource: "A1".into(),
                quantity: 1,
                during: None,
            },
            Hold {
                participant: "seats".into(),
                resource: "A2".into(),
                quantity: 2,
                during: None,
            },
        ],
        labels,
    }
}

/// A new reservation (must be new) and its token.
async fn create_with(
    store: &S,
    holder: &str,
    request_id: &str,
    ttl: Duration,
    lease: WorkLease,
) -> (Reservation, String) {
    let token = HoldToken::generate().unwrap();
    match store
        .create(&new_res(holder, request_id, ttl), &token, lease, NO_LIMITS)
        .await
        .unwrap()
    {
        Created::New(r) => (r, token.expose().to_owned()),
        other => panic!("expected a new reservation, got {other:?}"),
    }
}

async fn create(store: &S, holder: &str, request_id: &str, ttl: Duration) -> (Reservation, String) {
    create_with(store, holder, request_id, ttl, lease()).await
}

fn reports(r: &Reservation, state: BranchState, error: Option<&str>) -> Vec<BranchReport> {
    r.participant_branches()
        .into_iter()
        .map(|b| BranchReport {
            branch_id: b.branch_id,
            state,
            error: error.map(str::to_owned),
        })
        .collect()
}

/// A reservation whose holds are all placed.
async fn held(store: &S, holder: &str, request_id: &str, ttl: Duration) -> (Reservation, String) {
    let (r, token) = create(store, holder, request_id, ttl).await;
    let r = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(r.state, State::Held);
    (r, token)
}

fn confirm() -> Decision {
    Decision::Confirm {
        payment: None,
        late_policy: LatePaymentPolicy::HonorIfAvailable,
    }
}

fn payment() -> Payment {
    Payment {
        participant: "payments".into(),
        payment_ref: "pay-1".into(),
        amount_minor: 4200,
        currency: "EUR".into(),
    }
}

fn confirm_paid(late_policy: LatePaymentPolicy) -> Decision {
    Decision::Confirm {
        payment: Some(payment()),
        late_policy,
    }
}

fn cancel() -> Decision {
    Decision::Cancel {
        reason: Some("changed my mind".into()),
    }
}

fn extend(by: Duration) -> Decision {
    extend_keyed(by, None)
}

fn extend_keyed(by: Duration, request_id: Option<&str>) -> Decision {
    Decision::Extend {
        by: Some(by),
        max_extensions: 1,
        max_ttl: Duration::from_secs(3600),
        request_id: request_id.map(str::to_owned),
    }
}

/// The verdict, the reservation after it, and whether this caller got the lease.
async fn decide(store: &S, id: Uuid, token: &str, d: &Decision) -> (Verdict, Reservation, bool) {
    match store.decide(id, token, d, lease()).await.unwrap() {
        Decided::Judged {
            verdict,
            reservation,
            leased,
        } => (verdict, *reservation, leased),
        other => panic!("expected a verdict, got {other:?}"),
    }
}

async fn get(store: &S, id: Uuid) -> Reservation {
    store.get(id).await.unwrap().expect("reservation exists")
}

fn query(holder: Option<&str>, state: Option<State>, limit: u32) -> ListQuery {
    ListQuery {
        holder: holder.map(str::to_owned),
        state,
        limit,
        after: None,
    }
}

/// A reservation released by expiry (reaped, every branch cancelled): `EXPIRED`.
async fn expired_and_released(store: &S) -> (Reservation, String) {
    let (r, token) = held(store, "alice", "late", SHORT).await;
    lapse().await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(claimed[0].expired);
    let phase = store
        .record_phase(
            r.id,
            State::Cancelling,
            &reports(&r, BranchState::Cancelled, None),
            Some(State::Expired),
            FAST,
        )
        .await
        .unwrap();
    assert!(phase.finished);
    assert_eq!(phase.reservation.state, State::Expired);
    (phase.reservation, token)
}

// ---------------------------------------------------------------------------------------------

pub async fn create_records_trying(store: S) {
    let new = new_res("alice", "req-1", LONG);
    let token = HoldToken::generate().unwrap();
    let Created::New(r) = store
        .create(&new, &token, lease(), NO_LIMITS)
        .await
        .unwrap()
    else {
        panic!("expected New");
    };
    assert_eq!(r.state, State::Trying);
    assert_eq!(r.stored_state, State::Trying);
    assert_eq!(r.holder, "alice");
    assert_eq!(r.request_id, "req-1");
    assert_eq!(r.ttl, LONG);
    assert_eq!(r.version, 1);
    assert_eq!(r.generation, 0);
    assert_eq!(r.extensions_used, 0);
    assert!(r.hold_token.matches(token.expose()));
    // expires_at = the database clock + ttl (PostgreSQL reads its clock twice in the insert).
    let ttl = (r.expires_at - r.created_at - chrono::Duration::seconds(600)).abs();
    assert!(ttl < chrono::Duration::milliseconds(100), "{ttl}");
    assert!((Utc::now() - r.created_at).num_seconds().abs() < 5);
    // Holds round-trip exactly (microseconds included), in order, PENDING.
    assert!(new.same_body_as(&r), "body differs: {r:?}");
    assert!(r.branches.iter().all(|b| b.state == BranchState::Pending));
    // One participant-level branch per participant, shared by its holds.
    assert_eq!(r.branches[1].branch_id, r.branches[2].branch_id);
    assert_ne!(r.branches[0].branch_id, r.branches[1].branch_id);
    assert_eq!(r.participant_branches().len(), 2);
    let read = get(&store, r.id).await;
    assert!(new.same_body_as(&read));
    assert_eq!(read.labels, new.labels);
    assert_eq!(read.created_at, r.created_at);
    assert_eq!(read.expires_at, r.expires_at);
    assert!(store.get(Uuid::new_v4()).await.unwrap().is_none());
}

pub async fn create_is_idempotent(store: S) {
    let (r, token) = create(&store, "alice", "req-1", LONG).await;
    let again = HoldToken::generate().unwrap();
    match store
        .create(&new_res("alice", "req-1", LONG), &again, lease(), NO_LIMITS)
        .await
        .unwrap()
    {
        Created::Existing(e) => {
            assert_eq!(e.id, r.id);
            assert!(e.hold_token.matches(&token), "the first token is kept");
        }
        other => panic!("expected Existing, got {other:?}"),
    }
    // The key is (holder, request_id): another holder may reuse the request id.
    let (other, _) = create(&store, "bob", "req-1", LONG).await;
    assert_ne!(other.id, r.id);
}

pub async fn hold_limit_per_holder_and_total(store: S) {
    let two = limits(2, 0);
    let mut ids = Vec::new();
    for req in ["a1", "a2"] {
        let t = HoldToken::generate().unwrap();
        match store
            .create(&new_res("alice", req, LONG), &t, lease(), two)
            .await
            .unwrap()
        {
            Created::New(r) => ids.push(r.id),
            other => panic!("expected New, got {other:?}"),
        }
    }
    let t = HoldToken::generate().unwrap();
    assert!(matches!(
        store
            .create(&new_res("alice", "a3", LONG), &t, lease(), two)
            .await
            .unwrap(),
        Created::LimitReached(LimitScope::Holder)
    ));
    // A repeat is answered even at the limit.
    assert!(matches!(
        store
            .create(&new_res("alice", "a1", LONG), &t, lease(), two)
            .await
            .unwrap(),
        Created::Existing(e) if e.id == ids[0]
    ));
    // Released reservations stop counting.
    let (c1, tok) = held(&store, "carol", "c1", LONG).await;
    held(&store, "carol", "c2", LONG).await;
    decide(&store, c1.id, &tok, &cancel()).await;
    assert!(matches!(
        store
            .create(&new_res("carol", "c3", LONG), &t, lease(), two)
            .await
            .unwrap(),
        Created::New(_)
    ));
    // Lapsed holds (database clock) stop counting, before any reaper ran.
    held(&store, "dave", "d1", SHORT).await;
    held(&store, "dave", "d2", SHORT).await;
    lapse().await;
    assert!(matches!(
        store
            .create(&new_res("dave", "d3", LONG), &t, lease(), two)
            .await
            .unwrap(),
        Created::New(_)
    ));
    // Live now: alice 2 (TRYING), carol 2 (HELD + TRYING), dave 1.
    let total = limits(100, 5);
    assert!(matches!(
        store
            .create(&new_res("erin", "e1", LONG), &t, lease(), total)
            .await
            .unwrap(),
        Created::LimitReached(LimitScope::Total)
    ));
    let total = limits(100, 6);
    assert!(matches!(
        store
            .create(&new_res("erin", "e1", LONG), &t, lease(), total)
            .await
            .unwrap(),
        Created::New(_)
    ));
}

pub async fn concurrent_creates_respect_the_limit(store: S) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.spawn(async move {
            let t = HoldToken::generate().unwrap();
            store
                .create(
                    &new_res("alice", &format!("req-{i}"), LONG),
                    &t,
                    lease(),
                    limits(5, 0),
                )
                .await
                .unwrap()
        });
    }
    let (mut new, mut refused) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            Created::New(_) => new += 1,
            Created::LimitReached(LimitScope::Holder) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((new, refused), (5, 15));
    let listed = store.list(&query(Some("alice"), None, 100)).await.unwrap();
    assert_eq!(listed.len(), 5);
}

pub async fn decide_confirm(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let (verdict, after, leased) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(
        verdict,
        Verdict::Transition {
            to: State::Confirming,
            release_outcome: None
        }
    );
    assert_eq!(after.state, State::Confirming);
    assert_eq!(after.version, r.version + 1);
    assert!(leased);
    let (verdict, again, leased) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(verdict, Verdict::AlreadyDone);
    assert_eq!(again.version, after.version);
    assert!(!leased);
    let (verdict, _, _) = decide(&store, r.id, &token, &cancel()).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::Closed));
    // Driving it to the end: CONFIRMED, and the decision stays.
    let phase = store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Confirmed, None),
            Some(State::Confirmed),
            FAST,
        )
        .await
        .unwrap();
    assert!(phase.finished);
    assert_eq!(phase.reservation.state, State::Confirmed);
    assert!(
        phase
            .reservation
            .branches
            .iter()
            .all(|b| b.state == BranchState::Confirmed && b.attempts == 2)
    );
    let (verdict, _, _) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(verdict, Verdict::AlreadyDone);
}

pub async fn decide_cancel(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let (verdict, after, leased) = decide(&store, r.id, &token, &cancel()).await;
    assert_eq!(
        verdict,
        Verdict::Transition {
            to: State::Cancelling,
            release_outcome: Some(State::Cancelled)
        }
    );
    assert_eq!(after.state, State::Cancelling);
    assert_eq!(after.release_outcome, Some(State::Cancelled));
    assert!(leased);
    let (verdict, _, _) = decide(&store, r.id, &token, &cancel()).await;
    assert_eq!(verdict, Verdict::AlreadyDone);
    let (verdict, _, _) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::Closed));
    let (verdict, _, _) = decide(&store, r.id, &token, &extend(LONG)).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::Closed));
}

pub async fn decide_extend(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let by = Duration::from_secs(300);
    let (verdict, after, leased) = decide(&store, r.id, &token, &extend(by)).await;
    assert_eq!(verdict, Verdict::Extend { by });
    assert_eq!(after.state, State::Held);
    assert_eq!(
        after.expires_at,
        r.expires_at + chrono::Duration::seconds(300)
    );
    assert_eq!(after.extensions_used, 1);
    assert!(!leased, "Extend starts no fan-out");
    let (verdict, same, _) = decide(&store, r.id, &token, &extend(by)).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::ExtensionLimit));
    assert_eq!(same.expires_at, after.expires_at);
    // Never past max_ttl.
    let (r2, token2) = held(&store, "alice", "req-2", LONG).await;
    let (verdict, _, _) = decide(&store, r2.id, &token2, &extend(Duration::from_secs(3001))).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::ExtensionLimit));
}

pub async fn decide_token_mismatch_not_found_not_held(store: S) {
    let (r, token) = create(&store, "alice", "req-1", LONG).await;
    // Still TRYING: nothing can be decided yet.
    let (verdict, _, _) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::NotHeld));
    let r = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    let wrong = HoldToken::generate().unwrap();
    for d in [confirm(), cancel(), extend(LONG)] {
        assert!(matches!(
            store
                .decide(r.id, wrong.expose(), &d, lease())
                .await
                .unwrap(),
            Decided::TokenMismatch
        ));
    }
    let after = get(&store, r.id).await;
    assert_eq!((after.state, after.version), (State::Held, r.version));
    assert!(matches!(
        store
            .decide(Uuid::new_v4(), &token, &cancel(), lease())
            .await
            .unwrap(),
        Decided::NotFound
    ));
}

pub async fn lazy_expiry(store: S) {
    let (r, _) = held(&store, "alice", "req-1", SHORT).await;
    assert_eq!(get(&store, r.id).await.state, State::Held);
    let (live, _) = held(&store, "alice", "req-2", LONG).await;
    lapse().await;
    // No reaper ran: the row is HELD, every read says EXPIRED.
    let read = get(&store, r.id).await;
    assert_eq!(
        (read.state, read.stored_state),
        (State::Expired, State::Held)
    );
    let expired = store
        .list(&query(None, Some(State::Expired), 10))
        .await
        .unwrap();
    assert_eq!(expired.iter().map(|r| r.id).collect::<Vec<_>>(), vec![r.id]);
    assert_eq!(expired[0].state, State::Expired);
    let held_now = store
        .list(&query(None, Some(State::Held), 10))
        .await
        .unwrap();
    assert_eq!(
        held_now.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![live.id]
    );
    // The lapsed hold is work to do.
    assert_eq!(store.backlog().await.unwrap(), 1);
}

pub async fn decide_on_lapsed_hold_expires_it(store: S) {
    let mut cases = Vec::new();
    for (i, d) in [confirm(), cancel(), extend(LONG)].into_iter().enumerate() {
        let (r, token) = held(&store, "alice", &format!("req-{i}"), SHORT).await;
        cases.push((r, token, d));
    }
    lapse().await;
    for (r, token, d) in cases {
        let (verdict, after, leased) = decide(&store, r.id, &token, &d).await;
        assert_eq!(verdict, Verdict::Expire, "{d:?}");
        assert_eq!(after.stored_state, State::Cancelling);
        assert_eq!(after.release_outcome, Some(State::Expired));
        assert_eq!(after.version, r.version + 1);
        assert!(leased);
        // Decided once: a repeat changes nothing.
        let (verdict, again, _) = decide(&store, r.id, &token, &confirm()).await;
        assert_eq!(verdict, Verdict::Refuse(Refusal::HoldExpired));
        assert_eq!(again.version, after.version);
    }
}

pub async fn record_held_only_from_trying(store: S) {
    let (r, token) = create(&store, "alice", "req-1", LONG).await;
    let after = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(after.state, State::Held);
    assert_eq!(after.version, 2);
    assert!(
        after
            .branches
            .iter()
            .all(|b| b.state == BranchState::Held && b.attempts == 1 && b.last_error.is_none())
    );
    // A second report (or one after the reservation moved on) changes nothing.
    let again = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(again.version, 2);
    assert!(again.branches.iter().all(|b| b.attempts == 1));
    decide(&store, r.id, &token, &cancel()).await;
    let late = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(late.state, State::Cancelling);
}

pub async fn record_rejected_then_finish(store: S) {
    let (r, _) = create(&store, "alice", "req-1", LONG).await;
    let pbs = r.participant_branches();
    let rejection = Rejection {
        participant: "seats".into(),
        resource: "A1".into(),
        reason: "sold out".into(),
    };
    let recorded = store
        .record_rejected(
            r.id,
            Some(&rejection),
            &[
                BranchReport {
                    branch_id: pbs[0].branch_id,
                    state: BranchState::Held,
                    error: None,
                },
                BranchReport {
                    branch_id: pbs[1].branch_id,
                    state: BranchState::Rejected,
                    error: None,
                },
            ],
        )
        .await
        .unwrap();
    assert_eq!(recorded.state, State::Cancelling);
    assert_eq!(recorded.release_outcome, Some(State::Rejected));
    assert_eq!(recorded.rejection.as_ref(), Some(&rejection));
    assert_eq!(recorded.branches[0].state, BranchState::Held);
    assert_eq!(recorded.branches[2].state, BranchState::Rejected);
    // Only from TRYING.
    let again = store.record_rejected(r.id, None, &[]).await.unwrap();
    assert_eq!(again.version, recorded.version);
    assert_eq!(again.rejection.as_ref(), Some(&rejection));
    // Finish only from the expected state, once.
    let wrong = store
        .record_phase(r.id, State::Confirming, &[], Some(State::Confirmed), FAST)
        .await
        .unwrap();
    assert!(!wrong.finished);
    assert_eq!(wrong.reservation.state, State::Cancelling);
    let done = store
        .record_phase(
            r.id,
            State::Cancelling,
            &reports(&r, BranchState::Cancelled, None),
            Some(State::Rejected),
            FAST,
        )
        .await
        .unwrap();
    assert!(done.finished);
    assert_eq!(done.reservation.state, State::Rejected);
    let twice = store
        .record_phase(r.id, State::Cancelling, &[], Some(State::Rejected), FAST)
        .await
        .unwrap();
    assert!(!twice.finished);
    assert_eq!(twice.reservation.version, done.reservation.version);
    assert_eq!(store.backlog().await.unwrap(), 0);
}

pub async fn record_phase_backoff_and_wrong_state(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    decide(&store, r.id, &token, &cancel()).await;
    let pbs = r.participant_branches();
    let phase = store
        .record_phase(
            r.id,
            State::Cancelling,
            &[
                BranchReport {
                    branch_id: pbs[0].branch_id,
                    state: BranchState::Cancelled,
                    error: None,
                },
                BranchReport {
                    branch_id: pbs[1].branch_id,
                    state: BranchState::Held,
                    error: Some("seats unavailable".into()),
                },
            ],
            None,
            SLOW,
        )
        .await
        .unwrap();
    assert!(!phase.finished);
    let after = phase.reservation;
    assert_eq!(after.state, State::Cancelling);
    assert_eq!(after.branches[0].state, BranchState::Cancelled);
    assert_eq!(
        after.branches[1].last_error.as_deref(),
        Some("seats unavailable")
    );
    assert_eq!(after.branches[1].attempts, 2);
    // The lease is free but the retry is not due yet.
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    assert_eq!(store.backlog().await.unwrap(), 1);
    // With a tiny backoff it is due at once.
    store
        .record_phase(r.id, State::Cancelling, &[], None, FAST)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, r.id);
    assert!(!claimed[0].expired);
}

pub async fn claim_due_expires_and_leases(store: S) {
    let (r, token) = held(&store, "alice", "req-1", SHORT).await;
    held(&store, "alice", "req-2", LONG).await;
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    lapse().await;
    let a = WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_millis(400),
    };
    let b = WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_secs(30),
    };
    let claimed = store.claim_due(a, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].expired), (r.id, true));
    // Expired in the claim itself.
    let after = get(&store, r.id).await;
    assert_eq!(after.stored_state, State::Cancelling);
    assert_eq!(after.release_outcome, Some(State::Expired));
    assert_eq!(after.version, r.version + 1);
    // A Confirm racing the reaper sees the release.
    let (verdict, _, leased) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::HoldExpired));
    assert!(!leased);
    // Leased: nobody else claims it until the lease ends.
    assert!(store.claim_due(b, 10).await.unwrap().is_empty());
    assert!(!store.renew_lease(r.id, b).await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = store.claim_due(b, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].id, taken[0].expired), (r.id, false));
    assert_eq!(get(&store, r.id).await.version, after.version);
    assert!(store.claim_due(a, 10).await.unwrap().is_empty());
    assert!(!store.renew_lease(r.id, a).await.unwrap(), "a lost it");
}

pub async fn claim_due_takes_abandoned_trying(store: S) {
    let short = WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_millis(300),
    };
    let (r, _) = create_with(&store, "alice", "req-1", LONG, short).await;
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].expired), (r.id, false));
    assert_eq!(get(&store, r.id).await.state, State::Trying);
}

pub async fn concurrent_claimers_never_share(store: S) {
    let mut ids = HashSet::new();
    for i in 0..12 {
        let (r, _) = held(&store, &format!("h{i}"), "req", SHORT).await;
        ids.insert(r.id);
    }
    lapse().await;
    let claimer = |store: S| async move {
        let lease = lease();
        let mut got: Vec<Claimed> = Vec::new();
        loop {
            let batch = store.claim_due(lease, 3).await.unwrap();
            if batch.is_empty() {
                return got;
            }
            got.extend(batch);
            tokio::task::yield_now().await;
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(claimer(store.clone())),
        tokio::spawn(claimer(store.clone()))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let a_ids: HashSet<Uuid> = a.iter().map(|c| c.id).collect();
    let b_ids: HashSet<Uuid> = b.iter().map(|c| c.id).collect();
    assert_eq!(
        a_ids.len() + b_ids.len(),
        a.len() + b.len(),
        "claimed twice by one"
    );
    assert!(a_ids.is_disjoint(&b_ids), "claimed by both");
    assert_eq!(&a_ids | &b_ids, ids);
    assert!(a.iter().chain(&b).all(|c| c.expired));
}

/// A cancelled reservation (released and done).
async fn cancelled(store: &S) -> (Reservation, String) {
    let (r, token) = held(store, "alice", "req-1", LONG).await;
    decide(store, r.id, &token, &cancel()).await;
    let phase = store
        .record_phase(
            r.id,
            State::Cancelling,
            &reports(&r, BranchState::Cancelled, None),
            Some(State::Cancelled),
            FAST,
        )
        .await
        .unwrap();
    assert!(phase.finished);
    (phase.reservation, token)
}

pub async fn refund_recorded_once(store: S) {
    let (r, token) = cancelled(&store).await;
    let paid = confirm_paid(LatePaymentPolicy::HonorIfAvailable);
    let short = || WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_millis(300),
    };
    let (one, two) = tokio::join!(
        store.decide(r.id, &token, &paid, short()),
        store.decide(r.id, &token, &paid, short())
    );
    let judged = |d: Decided| match d {
        Decided::Judged {
            verdict,
            reservation,
            leased,
        } => (verdict, *reservation, leased),
        other => panic!("expected a verdict, got {other:?}"),
    };
    let (one, two) = (judged(one.unwrap()), judged(two.unwrap()));
    let refund_verdict = Verdict::Refund {
        expire: false,
        answer: Refusal::Closed,
    };
    let verdicts = [&one.0, &two.0];
    assert_eq!(
        verdicts.iter().filter(|v| ***v == refund_verdict).count(),
        1,
        "{verdicts:?}"
    );
    assert!(verdicts.contains(&&Verdict::Refuse(Refusal::Closed)));
    // Whoever recorded the refund drives it.
    assert_eq!(u8::from(one.2) + u8::from(two.2), 1);
    let (r1, r2) = (one.1.refund.unwrap(), two.1.refund.unwrap());
    assert_eq!(r1.refund_id, r2.refund_id);
    assert_eq!(r1.state, RefundState::Pending);
    assert_eq!((r1.amount_minor, r1.currency.as_str()), (4200, "EUR"));
    let read = get(&store, r.id).await;
    assert_eq!(read.state, State::Cancelled);
    assert_eq!(read.payment, Some(payment()));
    assert_eq!(read.refund.unwrap().refund_id, r1.refund_id);
    // The refund is due work: leased to its decider for now, then anyone's.
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    assert_eq!(store.backlog().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].expired), (r.id, false));
}

pub async fn refund_attempts(store: S) {
    let (r, token) = cancelled(&store).await;
    decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    assert_eq!(store.backlog().await.unwrap(), 1);
    let after = store
        .record_refund_attempt(r.id, false, SLOW)
        .await
        .unwrap();
    assert_eq!(after.refund.as_ref().unwrap().state, RefundState::Pending);
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    let done = store.record_refund_attempt(r.id, true, SLOW).await.unwrap();
    assert_eq!(done.refund.as_ref().unwrap().state, RefundState::Refunded);
    assert_eq!(done.version, after.version + 1);
    assert_eq!(store.backlog().await.unwrap(), 0);
    let again = store.record_refund_attempt(r.id, true, SLOW).await.unwrap();
    assert_eq!(again.version, done.version);
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
}

pub async fn late_payment_refund_policy(store: S) {
    let (r, token) = held(&store, "alice", "req-1", SHORT).await;
    lapse().await;
    let (verdict, after, leased) = decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::Refund),
    )
    .await;
    assert_eq!(
        verdict,
        Verdict::Refund {
            expire: true,
            answer: Refusal::HoldExpired
        }
    );
    assert_eq!(after.stored_state, State::Cancelling);
    assert_eq!(after.release_outcome, Some(State::Expired));
    assert_eq!(after.payment, Some(payment()));
    let refund = after.refund.unwrap();
    assert_eq!(refund.state, RefundState::Pending);
    assert!(refund.reason.contains("after the hold expired"));
    assert!(leased);
}

pub async fn late_payment_honoured_in_place(store: S) {
    let (r, token) = held(&store, "alice", "req-1", SHORT).await;
    lapse().await;
    let (verdict, after, leased) = decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    assert_eq!(verdict, Verdict::HonorLate);
    assert_eq!(after.state, State::Confirming);
    assert!(after.late_payment_honored);
    assert_eq!(after.payment, Some(payment()));
    assert!(after.refund.is_none());
    assert!(leased);
}

/// An expired reservation with a late payment whose retake has begun.
async fn retaking(store: &S) -> (Reservation, Reservation) {
    let (before, token) = expired_and_released(store).await;
    let paid = confirm_paid(LatePaymentPolicy::HonorIfAvailable);
    let (verdict, after, leased) = decide(store, before.id, &token, &paid).await;
    assert_eq!(verdict, Verdict::Retake);
    assert_eq!(after.state, State::Expired);
    assert_eq!(after.payment, Some(payment()));
    assert_eq!(after.version, before.version + 1);
    assert!(leased);
    let (verdict, _, _) = decide(store, before.id, &token, &paid).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::InProgress));
    let retake = store.begin_retake(before.id).await.unwrap();
    assert_eq!(retake.generation, 1);
    assert_eq!(retake.state, State::Expired);
    assert!(retake.expires_at > before.expires_at);
    assert_eq!(retake.branches.len(), before.branches.len());
    for (new, old) in retake.branches.iter().zip(&before.branches) {
        assert_eq!(new.hold, old.hold);
        assert_ne!(new.branch_id, old.branch_id, "a fresh TCC branch");
        assert_eq!((new.state, new.attempts), (BranchState::Pending, 0));
    }
    assert_eq!(retake.branches[1].branch_id, retake.branches[2].branch_id);
    assert_ne!(retake.branches[0].branch_id, retake.branches[1].branch_id);
    (before, retake)
}

pub async fn retake_confirms(store: S) {
    let (_, retake) = retaking(&store).await;
    let done = store
        .finish_retake(retake.id, &reports(&retake, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(done.state, State::Confirming);
    assert!(done.late_payment_honored);
    assert!(done.branches.iter().all(|b| b.state == BranchState::Held));
    assert!(done.refund.is_none());
    let again = store.finish_retake(retake.id, &[]).await.unwrap();
    assert_eq!(again.version, done.version);
    // begin_retake outside EXPIRED changes nothing.
    let same = store.begin_retake(retake.id).await.unwrap();
    assert_eq!((same.generation, same.version), (1, done.version));
}

pub async fn retake_fails_and_refunds(store: S) {
    let (_, retake) = retaking(&store).await;
    let pbs = retake.participant_branches();
    let failed = store
        .fail_retake(
            retake.id,
            &[
                BranchReport {
                    branch_id: pbs[0].branch_id,
                    state: BranchState::Held,
                    error: None,
                },
                BranchReport {
                    branch_id: pbs[1].branch_id,
                    state: BranchState::Rejected,
                    error: None,
                },
            ],
            "seats could no longer hold A1",
        )
        .await
        .unwrap();
    assert_eq!(failed.state, State::Cancelling);
    assert_eq!(failed.release_outcome, Some(State::Expired));
    assert!(!failed.late_payment_honored);
    let refund = failed.refund.clone().unwrap();
    assert_eq!(refund.state, RefundState::Pending);
    assert_eq!(refund.reason, "seats could no longer hold A1");
    assert_eq!(failed.branches[0].state, BranchState::Held);
    assert_eq!(failed.branches[1].state, BranchState::Rejected);
    let again = store.fail_retake(retake.id, &[], "again").await.unwrap();
    assert_eq!(again.refund.unwrap().refund_id, refund.refund_id);
    assert_eq!(again.version, failed.version);
}

pub async fn failed_refunds_payment(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let (verdict, _, _) = decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    assert!(matches!(
        verdict,
        Verdict::Transition {
            to: State::Confirming,
            ..
        }
    ));
    let phase = store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::HoldLost, None),
            Some(State::Failed),
            FAST,
        )
        .await
        .unwrap();
    assert!(phase.finished);
    assert_eq!(phase.reservation.state, State::Failed);
    let refund = phase.reservation.refund.unwrap();
    assert_eq!(refund.state, RefundState::Pending);
    assert!(refund.reason.contains("lost a hold"));
}

pub async fn list_pages_and_filters(store: S) {
    let mut all = HashSet::new();
    for i in 0..5 {
        let (r, _) = if i < 2 {
            held(&store, "alice", &format!("a{i}"), LONG).await
        } else {
            create(&store, "alice", &format!("a{i}"), LONG).await
        };
        all.insert(r.id);
    }
    for i in 0..2 {
        all.insert(create(&store, "bob", &format!("b{i}"), LONG).await.0.id);
    }
    let everything = store.list(&query(None, None, 100)).await.unwrap();
    assert_eq!(everything.len(), 7);
    // Newest first, by (created_at, id).
    for w in everything.windows(2) {
        assert!((w[0].created_at, w[0].id) > (w[1].created_at, w[1].id));
    }
    // Keyset paging walks the same order without gaps or repeats.
    let mut paged = Vec::new();
    let mut q = query(None, None, 3);
    loop {
        let page = store.list(&q).await.unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        q.after = Some((last.created_at, last.id));
        paged.extend(page.iter().map(|r| r.id));
    }
    assert_eq!(paged, everything.iter().map(|r| r.id).collect::<Vec<_>>());
    assert_eq!(paged.iter().copied().collect::<HashSet<_>>(), all);
    // Branches come with each listed reservation.
    assert!(everything.iter().all(|r| r.branches.len() == 3));
    let alice = store.list(&query(Some("alice"), None, 100)).await.unwrap();
    assert_eq!(alice.len(), 5);
    assert!(alice.iter().all(|r| r.holder == "alice"));
    let held_now = store
        .list(&query(None, Some(State::Held), 100))
        .await
        .unwrap();
    assert_eq!(held_now.len(), 2);
    let trying_bob = store
        .list(&query(Some("bob"), Some(State::Trying), 100))
        .await
        .unwrap();
    assert_eq!(trying_bob.len(), 2);
    assert!(
        store
            .list(&query(Some("nobody"), None, 100))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn backlog_and_wake(store: S) {
    assert_eq!(store.backlog().await.unwrap(), 0);
    let (r, token) = create(&store, "alice", "req-1", LONG).await;
    assert_eq!(store.backlog().await.unwrap(), 1, "TRYING counts");
    let r = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(store.backlog().await.unwrap(), 0, "live HELD does not");
    decide(&store, r.id, &token, &cancel()).await;
    assert_eq!(store.backlog().await.unwrap(), 1, "CANCELLING counts");
    let pbs = r.participant_branches();
    store
        .record_phase(
            r.id,
            State::Cancelling,
            &[
                BranchReport {
                    branch_id: pbs[0].branch_id,
                    state: BranchState::Cancelled,
                    error: None,
                },
                BranchReport {
                    branch_id: pbs[1].branch_id,
                    state: BranchState::Held,
                    error: Some("connection refused".into()),
                },
            ],
            None,
            SLOW,
        )
        .await
        .unwrap();
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    assert_eq!(store.wake_backlog("rooms").await.unwrap(), 0);
    assert_eq!(store.wake_backlog("seats").await.unwrap(), 1);
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, r.id);
    // Due already: waking again finds nothing to bring forward.
    assert_eq!(store.wake_backlog("seats").await.unwrap(), 0);
}

pub async fn renew_lease_only_by_owner(store: S) {
    let a = lease();
    let (r, _) = create_with(&store, "alice", "req-1", LONG, a).await;
    assert!(store.renew_lease(r.id, a).await.unwrap());
    assert!(!store.renew_lease(r.id, lease()).await.unwrap());
    // Recording the holds gives the lease up.
    store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert!(!store.renew_lease(r.id, a).await.unwrap());
    assert!(!store.renew_lease(Uuid::new_v4(), a).await.unwrap());
}

/// Every write answers with the reservation exactly as a later read sees it (the Postgres store
/// builds these answers in the write's own statement rather than reading again).
pub async fn writes_answer_with_the_stored_reservation(store: S) {
    let (r, token) = create(&store, "alice", "req-1", LONG).await;
    assert_eq!(r, get(&store, r.id).await, "create");
    assert_eq!(r.branches.len(), 3);
    let placed = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(placed, get(&store, r.id).await, "record_held");
    let (_, confirming, _) = decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    assert_eq!(confirming.state, State::Confirming);
    assert_eq!(confirming.payment, Some(payment()));
    assert_eq!(confirming, get(&store, r.id).await, "decide");
    // One participant answers, the other does not: the unreported branch keeps its row.
    let groups = r.participant_branches();
    let first = BranchReport {
        branch_id: groups[0].branch_id,
        state: BranchState::Confirmed,
        error: None,
    };
    let second = BranchReport {
        branch_id: groups[1].branch_id,
        state: BranchState::Held,
        error: Some("unreachable".into()),
    };
    let phase = store
        .record_phase(r.id, State::Confirming, &[first], None, SLOW)
        .await
        .unwrap();
    assert!(!phase.finished);
    assert_eq!(phase.reservation, get(&store, r.id).await, "record_phase");
    let states: Vec<BranchState> = phase.reservation.branches.iter().map(|b| b.state).collect();
    assert_eq!(
        states,
        [BranchState::Confirmed, BranchState::Held, BranchState::Held]
    );
    let phase = store
        .record_phase(r.id, State::Confirming, &[second], None, SLOW)
        .await
        .unwrap();
    assert_eq!(phase.reservation, get(&store, r.id).await, "record_phase");
    assert_eq!(
        phase.reservation.branches[2].last_error.as_deref(),
        Some("unreachable")
    );
    let phase = store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Confirmed, None)[1..],
            Some(State::Confirmed),
            FAST,
        )
        .await
        .unwrap();
    assert!(phase.finished);
    assert_eq!(phase.reservation.state, State::Confirmed);
    assert_eq!(phase.reservation, get(&store, r.id).await, "record_phase");
    // A cancel of another held reservation: the same.
    let (r2, token2) = held(&store, "alice", "req-2", LONG).await;
    let (_, cancelling, _) = decide(&store, r2.id, &token2, &cancel()).await;
    assert_eq!(cancelling.state, State::Cancelling);
    assert_eq!(cancelling, get(&store, r2.id).await, "decide cancel");
}

/// Many concurrent `record_held` and `record_phase` calls (the Postgres store group-commits
/// them into shared statements): each is recorded as if alone, each answer is its own
/// reservation as stored, a repeat and a call from the wrong state change nothing.
pub async fn concurrent_writes_are_each_recorded(store: S) {
    const N: usize = 40;
    // Reserves of 40 holders at once, plus a repeat of the first one's request in the burst.
    let token = HoldToken::generate().unwrap();
    let answers = futures_util::future::join_all((0..=N).map(|i| {
        let store = store.clone();
        let token = token.clone();
        async move {
            let holder = format!("holder-{}", i % N);
            store
                .create(&new_res(&holder, "req", LONG), &token, lease(), NO_LIMITS)
                .await
                .unwrap()
        }
    }))
    .await;
    let (mut created, mut existing) = (Vec::new(), Vec::new());
    for answer in answers {
        match answer {
            Created::New(r) => created.push(r),
            Created::Existing(r) => existing.push(r),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((created.len(), existing.len()), (N, 1));
    assert_eq!(existing[0].holder, "holder-0");
    assert!(created.iter().any(|r| r.id == existing[0].id));
    for r in &created {
        assert_eq!(r, &get(&store, r.id).await);
        assert_eq!(r.branches.len(), 3);
    }
    let placed = futures_util::future::join_all(created.iter().map(|r| {
        let store = store.clone();
        async move {
            store
                .record_held(r.id, &reports(r, BranchState::Held, None))
                .await
                .unwrap()
        }
    }))
    .await;
    for (r, after) in created.iter().zip(&placed) {
        assert_eq!(after.id, r.id);
        assert_eq!(after.state, State::Held);
        assert!(after.branches.iter().all(|b| b.state == BranchState::Held));
        assert_eq!(after, &get(&store, r.id).await);
    }
    // Into CONFIRMING (via the store's claim: lease them all as due work is not needed here).
    let mut confirming = Vec::new();
    for r in &placed {
        let token = r.hold_token.expose().to_owned();
        confirming.push(decide(&store, r.id, &token, &confirm()).await.1);
    }
    // Even ones finish CONFIRMED; odd ones hear from one participant only and stay; the
    // first also gets a repeat and a call from the wrong state in the same burst, the second
    // a second call bringing the other participant's answer (both must be recorded).
    let calls = confirming.iter().enumerate().flat_map(|(i, r)| {
        let mut calls = vec![(i, r.clone(), State::Confirming, 0)];
        if i == 0 {
            calls.push((i, r.clone(), State::Confirming, 0));
            calls.push((i, r.clone(), State::Cancelling, 0));
        }
        if i == 1 {
            calls.push((i, r.clone(), State::Confirming, 1));
        }
        calls
    });
    let answers = futures_util::future::join_all(calls.map(|(i, r, from, part)| {
        let store = store.clone();
        async move {
            let (reports, finish) = if i % 2 == 0 {
                (
                    reports(&r, BranchState::Confirmed, None),
                    Some(State::Confirmed),
                )
            } else {
                (
                    reports(&r, BranchState::Confirmed, None)[part..=part].to_vec(),
                    None,
                )
            };
            let phase = store
                .record_phase(r.id, from, &reports, finish, SLOW)
                .await
                .unwrap();
            (i, from, phase)
        }
    }))
    .await;
    let mut finished_first = 0;
    for (i, from, phase) in answers {
        let r = &confirming[i];
        assert_eq!(phase.reservation.id, r.id);
        if i == 0 {
            finished_first += usize::from(phase.finished);
            if from == State::Cancelling {
                assert!(!phase.finished, "wrong state recorded nothing");
            }
            continue;
        }
        if i == 1 {
            continue;
        }
        assert_eq!(phase.reservation, get(&store, r.id).await);
        if i % 2 == 0 {
            assert!(phase.finished);
            assert_eq!(phase.reservation.state, State::Confirmed);
        } else {
            assert!(!phase.finished);
            assert_eq!(phase.reservation.state, State::Confirming);
            let states: Vec<BranchState> =
                phase.reservation.branches.iter().map(|b| b.state).collect();
            assert_eq!(
                states,
                [BranchState::Confirmed, BranchState::Held, BranchState::Held]
            );
        }
    }
    // Exactly one of the two identical calls finished the first reservation.
    assert_eq!(finished_first, 1);
    let first = get(&store, confirming[0].id).await;
    assert_eq!(first.state, State::Confirmed);
    assert!(first.branches.iter().all(|b| b.attempts == 2));
    let second = get(&store, confirming[1].id).await;
    assert_eq!(second.state, State::Confirming);
    assert!(
        second
            .branches
            .iter()
            .all(|b| b.state == BranchState::Confirmed && b.attempts == 2),
        "both calls recorded: {:?}",
        second.branches
    );
}

/// An Extend with a request id is applied once: its repeat answers the reservation as it is
/// (even after it moved on), another key counts as a new extension.
pub async fn extend_repeat_is_not_applied_twice(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let by = Duration::from_secs(60);
    let (verdict, extended, _) =
        decide(&store, r.id, &token, &extend_keyed(by, Some("ext-1"))).await;
    assert_eq!(verdict, Verdict::Extend { by });
    assert_eq!(extended.extensions_used, 1);
    let (verdict, again, _) = decide(&store, r.id, &token, &extend_keyed(by, Some("ext-1"))).await;
    assert_eq!(verdict, Verdict::AlreadyDone);
    assert_eq!(again, extended);
    assert_eq!(get(&store, r.id).await.expires_at, extended.expires_at);
    // Another key is another extension: past max_extensions.
    let (verdict, _, _) = decide(&store, r.id, &token, &extend_keyed(by, Some("ext-2"))).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::ExtensionLimit));
    let (verdict, _, _) = decide(&store, r.id, &token, &extend(by)).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::ExtensionLimit));
    // Confirmed since: the repeat still answers as it is.
    let (verdict, _, _) = decide(&store, r.id, &token, &confirm()).await;
    assert!(matches!(verdict, Verdict::Transition { .. }));
    let (verdict, now, _) = decide(&store, r.id, &token, &extend_keyed(by, Some("ext-1"))).await;
    assert_eq!(verdict, Verdict::AlreadyDone);
    assert_eq!(now.state, State::Confirming);
}

/// A decision on a reservation changed since it was placed (here extended) sees the change:
/// the Postgres store may decide on the image it recorded at placement, guarded by its version.
pub async fn decide_sees_changes_since_placement(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let (_, extended, _) = decide(&store, r.id, &token, &extend(Duration::from_secs(60))).await;
    assert_eq!(extended.version, r.version + 1);
    let (verdict, after, leased) = decide(&store, r.id, &token, &confirm()).await;
    assert!(matches!(verdict, Verdict::Transition { .. }), "{verdict:?}");
    assert!(leased);
    assert_eq!(after.state, State::Confirming);
    assert_eq!(after.version, extended.version + 1);
    assert_eq!(after.expires_at, extended.expires_at);
    assert_eq!(after.extensions_used, 1);
    assert_eq!(after, get(&store, r.id).await);
    // A wrong token is refused before anything is applied, cached image or not.
    let (r2, _) = held(&store, "alice", "req-2", LONG).await;
    match store
        .decide(r2.id, "not-the-token", &cancel(), lease())
        .await
        .unwrap()
    {
        Decided::TokenMismatch => {}
        other => panic!("expected a token mismatch, got {other:?}"),
    }
    assert_eq!(get(&store, r2.id).await.state, State::Held);
}
