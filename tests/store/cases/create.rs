//! Creating reservations: what a new one records, idempotency on (holder, request_id), and the
//! hold limits per holder and in total, alone and under concurrent creates.

use chrono::Utc;
use holdfast::domain::policy::LimitScope;
use holdfast::domain::{BranchState, State};
use holdfast::store::Created;
use uuid::Uuid;

use super::{
    LONG, NO_LIMITS, S, SHORT, cancel, create, decide, get, held, lapse, lease, limits, new_res,
    query, request_id_of,
};

pub async fn create_records_trying(store: S) {
    let new = new_res("alice", "req-1", LONG);
    let Created::New(r) = store.create(&new, lease(), NO_LIMITS).await.unwrap() else {
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
    assert!(r.token.verifies(super::token_of(r.id).expose()));
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
    match store
        .create(&new_res("alice", "req-1", LONG), lease(), NO_LIMITS)
        .await
        .unwrap()
    {
        Created::Existing(e) => {
            assert_eq!(e.id, r.id);
            assert!(e.token.verifies(token.expose()), "the first token is kept");
        }
        other => panic!("expected Existing, got {other:?}"),
    }
    // The key is (holder, request_id): another holder may reuse the request id.
    let (other, _) = create(&store, "bob", "req-1", LONG).await;
    assert_ne!(other.id, r.id);
}

/// The very same call again (its fresh id recorded already: an attempt whose commit answer was
/// lost) is answered `New` with the row as recorded, its branches not written twice.
pub async fn the_same_call_again_answers_its_own_row(store: S) {
    let new = new_res("alice", "req-1", LONG);
    let first = match store.create(&new, lease(), NO_LIMITS).await.unwrap() {
        Created::New(r) => r,
        other => panic!("expected New, got {other:?}"),
    };
    match store.create(&new, lease(), NO_LIMITS).await.unwrap() {
        Created::New(again) => {
            assert_eq!(again.id, first.id);
            assert_eq!(again.branches, first.branches);
            assert_eq!(again.branches.len(), new.holds.len());
        }
        other => panic!("expected New, got {other:?}"),
    }
}

pub async fn hold_limit_per_holder_and_total(store: S) {
    let two = limits(2, 0);
    let mut ids = Vec::new();
    for req in ["a1", "a2"] {
        match store
            .create(&new_res("alice", req, LONG), lease(), two)
            .await
            .unwrap()
        {
            Created::New(r) => ids.push(r.id),
            other => panic!("expected New, got {other:?}"),
        }
    }
    assert!(matches!(
        store
            .create(&new_res("alice", "a3", LONG), lease(), two)
            .await
            .unwrap(),
        Created::LimitReached(LimitScope::Holder)
    ));
    // A repeat is answered even at the limit.
    assert!(matches!(
        store
            .create(&new_res("alice", "a1", LONG), lease(), two)
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
            .create(&new_res("carol", "c3", LONG), lease(), two)
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
            .create(&new_res("dave", "d3", LONG), lease(), two)
            .await
            .unwrap(),
        Created::New(_)
    ));
    // Live now: alice 2 (TRYING), carol 2 (HELD + TRYING), dave 1.
    let total = limits(100, 5);
    assert!(matches!(
        store
            .create(&new_res("erin", "e1", LONG), lease(), total)
            .await
            .unwrap(),
        Created::LimitReached(LimitScope::Total)
    ));
    let total = limits(100, 6);
    assert!(matches!(
        store
            .create(&new_res("erin", "e1", LONG), lease(), total)
            .await
            .unwrap(),
        Created::New(_)
    ));
}

pub async fn concurrent_creates_respect_the_limit(store: S) {
    let mut tasks = tokio::task::JoinSet::new();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    for i in 0..20 {
        let (store, start) = (store.clone(), start.clone());
        tasks.spawn(async move {
            start.wait().await;
            store
                .create(
                    &new_res("alice", &format!("req-{i}"), LONG),
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

/// The sold-out fast path's read: (owner, holder, request_id) recorded or not, all three
/// parts counting.
pub async fn request_recorded_reads_the_idempotency_key(store: S) {
    assert!(
        !store
            .request_recorded("", "alice", &request_id_of("req-1"))
            .await
            .unwrap()
    );
    create(&store, "alice", "req-1", LONG).await;
    assert!(
        store
            .request_recorded("", "alice", &request_id_of("req-1"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .request_recorded("", "alice", &request_id_of("req-2"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .request_recorded("", "bob", &request_id_of("req-1"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .request_recorded("someone", "alice", &request_id_of("req-1"))
            .await
            .unwrap()
    );
}
