//! The conformance cases: storage-level behaviour every backend must show, each written once
//! against `Arc<dyn Store>` (see `main.rs` for how each runs on PostgreSQL and on SQLite), one
//! file per topic. This file holds what several topics build on: the fixture reservation, the
//! durations, leases and limits, and short forms of the store calls.

pub mod admin;
pub mod backoff;
pub mod bindings;
pub mod create;
pub mod decide;
pub mod events;
pub mod failed_batch;
pub mod find;
pub mod list;
pub mod list_filters;
pub mod lost_ack;
pub mod payments;
pub mod phases;
pub mod recovery;
pub mod retention;
pub mod shared_confirms;
pub mod waitlist;
pub mod writes;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use holdfast::domain::LatePaymentPolicy;
use holdfast::domain::PresentedToken;
use holdfast::domain::policy::{Backoff, HoldLimits};
use holdfast::domain::validate::RequestId;
use holdfast::domain::{
    BranchState, Decision, Hold, Interval, ListQuery, NewReservation, Payment, Reservation, State,
    TokenCheck, Verdict,
};
use holdfast::store::{BranchReport, Created, Decided, Store, WorkLease};
use uuid::Uuid;

pub(crate) type S = Arc<dyn Store>;

pub(crate) const LONG: Duration = Duration::from_secs(600);
/// A ttl or a lease that lapses within the test (then `lapse()` waits it out). Generous, not
/// a few hundred milliseconds: what a case does before it must lapse (a few statements) has to
/// fit in it on a loaded CI machine, or the case fails for the wrong reason.
const SHORT: Duration = Duration::from_millis(1500);

/// Waits until a [`SHORT`] ttl or lease set before this call has passed, as the database's
/// clock (this host's) reads it, with a margin for its millisecond rounding.
async fn lapse() {
    tokio::time::sleep(SHORT + Duration::from_millis(200)).await;
}

pub(crate) fn lease() -> WorkLease {
    WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_secs(30),
    }
}

fn limits(per_holder: u32, total: u32) -> HoldLimits {
    HoldLimits { per_holder, total }
}

pub(crate) const NO_LIMITS: HoldLimits = HoldLimits {
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
pub(crate) fn new_res(holder: &str, request_id: &str, ttl: Duration) -> NewReservation {
    let mut labels = BTreeMap::new();
    labels.insert("order".to_owned(), "o-1".to_owned());
    labels.insert("ünïcode".to_owned(), "\"quoted\" value".to_owned());
    let id = Uuid::now_v7();
    NewReservation {
        id,
        owner: String::new(),
        token: TokenCheck::of(token_of(id).expose(), None),
        request_id: request_id_of(request_id),
        holder: holder.to_owned(),
        ttl,
        queue_wait: None,
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

/// The hold token of the reservation `new_res` made with `id`.
fn token_of(id: Uuid) -> PresentedToken {
    presented(&format!("token-of-{id}"))
}

/// A request id as a caller would send it.
pub(crate) fn request_id_of(request_id: &str) -> RequestId {
    RequestId::parse(request_id, 128).expect("a well-formed request id")
}

/// A token as a caller would present it.
pub(crate) fn presented(token: &str) -> PresentedToken {
    PresentedToken::parse(token).expect("a well-formed token")
}

/// A new reservation (must be new) and its token.
async fn create_with(
    store: &S,
    holder: &str,
    request_id: &str,
    ttl: Duration,
    lease: WorkLease,
) -> (Reservation, PresentedToken) {
    match store
        .create(&new_res(holder, request_id, ttl), lease, NO_LIMITS)
        .await
        .unwrap()
    {
        Created::New(r) => {
            let token = token_of(r.id);
            (r, token)
        }
        other => panic!("expected a new reservation, got {other:?}"),
    }
}

pub(crate) async fn create(
    store: &S,
    holder: &str,
    request_id: &str,
    ttl: Duration,
) -> (Reservation, PresentedToken) {
    create_with(store, holder, request_id, ttl, lease()).await
}

pub(crate) fn reports(
    r: &Reservation,
    state: BranchState,
    error: Option<&str>,
) -> Vec<BranchReport> {
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
pub(crate) async fn held(
    store: &S,
    holder: &str,
    request_id: &str,
    ttl: Duration,
) -> (Reservation, PresentedToken) {
    let (r, token) = create(store, holder, request_id, ttl).await;
    let r = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(r.state, State::Held);
    (r, token)
}

pub(crate) fn confirm() -> Decision {
    Decision::Confirm {
        payment: None,
        late_policy: LatePaymentPolicy::HonorIfAvailable,
        payment_verified: false,
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

/// A Confirm with [`payment`], checked with its payments service already (the store trusts
/// `payment_verified`; the coordinator sets it).
fn confirm_paid(late_policy: LatePaymentPolicy) -> Decision {
    Decision::Confirm {
        payment: Some(payment()),
        late_policy,
        payment_verified: true,
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
        request_id: request_id.map(request_id_of),
        // The participants hold long enough already (the coordinator tells them first).
        told_until: Some(chrono::DateTime::<chrono::Utc>::MAX_UTC),
    }
}

/// The verdict, the reservation after it, and whether this caller got the lease.
pub(crate) async fn decide(
    store: &S,
    id: Uuid,
    token: &PresentedToken,
    d: &Decision,
) -> (Verdict, Reservation, bool) {
    match store.decide(id, None, token, d, lease()).await.unwrap() {
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
        owner: None,
        holder: holder.map(str::to_owned),
        state,
        limit,
        after: None,
        ..Default::default()
    }
}
