//! Decisions on a reservation: Confirm, Cancel and Extend with their repeats and refusals, token
//! mismatches and unknown ids, lazy expiry (reads and decisions on a lapsed hold), and a
//! decision on a reservation changed since it was placed.

use std::time::Duration;

use holdfast::domain::lifecycle::Refusal;
use holdfast::domain::{BranchState, HoldToken, PresentedToken, State, Verdict};
use holdfast::store::Decided;
use uuid::Uuid;

use super::{
    FAST, LONG, S, SHORT, cancel, confirm, create, decide, extend, extend_keyed, get, held, lapse,
    lease, presented, query, reports,
};

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
    let wrong: PresentedToken = HoldToken::generate().unwrap().into();
    for d in [confirm(), cancel(), extend(LONG)] {
        assert!(matches!(
            store.decide(r.id, None, &wrong, &d, lease()).await.unwrap(),
            Decided::TokenMismatch
        ));
    }
    let after = get(&store, r.id).await;
    assert_eq!((after.state, after.version), (State::Held, r.version));
    assert!(matches!(
        store
            .decide(Uuid::new_v4(), None, &token, &cancel(), lease())
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
        .decide(r2.id, None, &presented("not-the-token"), &cancel(), lease())
        .await
        .unwrap()
    {
        Decided::TokenMismatch => {}
        other => panic!("expected a token mismatch, got {other:?}"),
    }
    assert_eq!(get(&store, r2.id).await.state, State::Held);
}
