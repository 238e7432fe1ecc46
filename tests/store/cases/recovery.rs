//! The work a sweeping instance finds: `claim_due` (lapsed holds leased as they are and
//! expired by their driver, abandoned TRYING rows, leases nobody else can take), the backlog
//! and its wake-up when a participant answers again, and lease renewal by its owner only.

use std::collections::HashSet;
use std::time::Duration;

use holdfast::domain::lifecycle::Refusal;
use holdfast::domain::{BranchState, State, Verdict};
use holdfast::store::{BranchReport, Claimed, WorkLease};
use uuid::Uuid;

use super::{
    FAST, LONG, S, SHORT, SLOW, cancel, confirm, confirm_paid, create, create_with, decide, get,
    held, lapse, lease, reports,
};

/// The claim leases a lapsed hold as it is (`HELD`, its version unchanged); the expiry is one
/// write of its own (`expire_lapsed_hold`, the statement a decision runs), applied once.
pub async fn claim_due_leases_lapsed_holds_as_they_are(store: S) {
    let (r, token) = held(&store, "alice", "req-1", SHORT).await;
    held(&store, "alice", "req-2", LONG).await;
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    assert!(!store.expire_lapsed_hold(r.id).await.unwrap(), "not lapsed");
    lapse().await;
    let a = WorkLease {
        owner: Uuid::new_v4(),
        duration: SHORT,
    };
    let b = WorkLease {
        owner: Uuid::new_v4(),
        duration: Duration::from_secs(30),
    };
    let claimed = store.claim_due(a, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].lapsed_hold), (r.id, true));
    // The claim changed no state.
    let leased = get(&store, r.id).await;
    assert_eq!(leased.stored_state, State::Held);
    assert_eq!(leased.state, State::Expired, "reads as lapsed");
    assert_eq!(leased.release_outcome, None);
    assert_eq!(leased.version, r.version);
    // Its driver expires it, once.
    assert!(store.expire_lapsed_hold(r.id).await.unwrap());
    assert!(
        !store.expire_lapsed_hold(r.id).await.unwrap(),
        "expired already"
    );
    let after = get(&store, r.id).await;
    assert_eq!(after.stored_state, State::Cancelling);
    assert_eq!(after.release_outcome, Some(State::Expired));
    assert_eq!(after.version, r.version + 1);
    // The driver keeps its lease.
    assert!(store.renew_lease(r.id, a).await.unwrap());
    // A Confirm racing the reaper sees the release.
    let (verdict, _, leased) = decide(&store, r.id, &token, &confirm()).await;
    assert_eq!(verdict, Verdict::Refuse(Refusal::HoldExpired));
    assert!(!leased);
    // Leased: nobody else claims it until the lease ends.
    assert!(store.claim_due(b, 10).await.unwrap().is_empty());
    assert!(!store.renew_lease(r.id, b).await.unwrap());
    lapse().await;
    let taken = store.claim_due(b, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].id, taken[0].lapsed_hold), (r.id, false));
    assert_eq!(get(&store, r.id).await.version, after.version);
    assert!(store.claim_due(a, 10).await.unwrap().is_empty());
    assert!(!store.renew_lease(r.id, a).await.unwrap(), "a lost it");
}

/// A decision on a claimed lapsed hold before its driver's expiry: a Cancel expires it
/// itself (the sweep keeps the lease), a late payment is honoured; the driver's expiry then
/// misses and changes nothing.
pub async fn a_decision_before_the_sweeps_expiry_wins(store: S) {
    let (cancelled, ctoken) = held(&store, "alice", "req-1", SHORT).await;
    let (paid, ptoken) = held(&store, "bob", "req-2", SHORT).await;
    lapse().await;
    let sweep = lease();
    let claimed = store.claim_due(sweep, 10).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.lapsed_hold));

    let (verdict, after, leased) = decide(&store, cancelled.id, &ctoken, &cancel()).await;
    assert_eq!(verdict, Verdict::Expire);
    assert_eq!(after.stored_state, State::Cancelling);
    assert!(!leased, "the sweep drives it");
    assert!(!store.expire_lapsed_hold(cancelled.id).await.unwrap());
    let now = get(&store, cancelled.id).await;
    assert_eq!(
        (now.stored_state, now.release_outcome, now.version),
        (
            State::Cancelling,
            Some(State::Expired),
            cancelled.version + 1
        )
    );
    assert!(store.renew_lease(cancelled.id, sweep).await.unwrap());

    let late = confirm_paid(holdfast::domain::LatePaymentPolicy::HonorIfAvailable);
    let (verdict, _, _) = decide(&store, paid.id, &ptoken, &late).await;
    assert_eq!(verdict, Verdict::HonorLate);
    assert!(!store.expire_lapsed_hold(paid.id).await.unwrap());
    let now = get(&store, paid.id).await;
    assert_eq!(now.stored_state, State::Confirming);
    assert_eq!(now.release_outcome, None);
}

pub async fn claim_due_takes_abandoned_trying(store: S) {
    let short = WorkLease {
        owner: Uuid::new_v4(),
        duration: SHORT,
    };
    let (r, _) = create_with(&store, "alice", "req-1", LONG, short).await;
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    lapse().await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].lapsed_hold), (r.id, false));
    assert_eq!(get(&store, r.id).await.state, State::Trying);
}

pub async fn concurrent_claimers_never_share(store: S) {
    let mut ids = HashSet::new();
    for i in 0..12 {
        let (r, _) = held(&store, &format!("h{i}"), "req", SHORT).await;
        ids.insert(r.id);
    }
    lapse().await;
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let claimer = |store: S, start: std::sync::Arc<tokio::sync::Barrier>| async move {
        start.wait().await;
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
        tokio::spawn(claimer(store.clone(), start.clone())),
        tokio::spawn(claimer(store.clone(), start.clone()))
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
    assert!(a.iter().chain(&b).all(|c| c.lapsed_hold));
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

/// Which participants unfinished work waits on (what a coordinator missing one of them
/// reports at start): branches still to be told (held, or tried without an answer) and refunds
/// still owed, with example ids oldest first.
pub async fn waiting_on_names_each_participant_s_work(store: S) {
    // Placing, nothing tried yet: waits on nobody.
    create(&store, "alice", "req-0", LONG).await;
    assert_eq!(store.waiting_on(5).await.unwrap(), []);
    // Held at rooms and seats.
    let (r1, _) = held(&store, "alice", "req-1", LONG).await;
    // Released at rooms, seats did not answer.
    let (r2, token2) = held(&store, "alice", "req-2", LONG).await;
    decide(&store, r2.id, &token2, &cancel()).await;
    let pbs = r2.participant_branches();
    store
        .record_phase(
            r2.id,
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
                    error: Some("participant \"seats\" is not registered".into()),
                },
            ],
            None,
            SLOW,
        )
        .await
        .unwrap();
    // Cancelled everywhere, then paid: its refund is owed by "payments".
    let (r3, token3) = held(&store, "bob", "req-3", LONG).await;
    decide(&store, r3.id, &token3, &cancel()).await;
    store
        .record_phase(
            r3.id,
            State::Cancelling,
            &reports(&r3, BranchState::Cancelled, None),
            Some(State::Cancelled),
            FAST,
        )
        .await
        .unwrap();
    decide(
        &store,
        r3.id,
        &token3,
        &confirm_paid(holdfast::domain::LatePaymentPolicy::HonorIfAvailable),
    )
    .await;

    let waiting = store.waiting_on(5).await.unwrap();
    let seen: Vec<(&str, i64, &[Uuid])> = waiting
        .iter()
        .map(|w| {
            (
                w.participant.as_str(),
                w.reservations,
                w.examples.as_slice(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("payments", 1, &[r3.id][..]),
            ("rooms", 1, &[r1.id][..]),
            ("seats", 2, &[r1.id, r2.id][..]),
        ]
    );
    let one = store.waiting_on(1).await.unwrap();
    assert_eq!(
        (one[2].reservations, one[2].examples.as_slice()),
        (2, &[r1.id][..])
    );
}

/// Test mode's ExpireNow: `make_due` brings a `TRYING` or `HELD` reservation's deadline to the
/// database's now (never later than it was), so the next claim expires it; any other state,
/// or an unknown id, is left alone.
pub async fn make_due_only_trying_or_held(store: S) {
    let (h, _) = held(&store, "alice", "req-1", LONG).await;
    assert!(store.make_due(h.id).await.unwrap());
    let due = get(&store, h.id).await;
    assert_eq!(due.stored_state, State::Held);
    assert_eq!(due.state, State::Expired, "reads as lapsed at once");
    assert!(due.expires_at < h.expires_at - chrono::Duration::seconds(500));
    assert_eq!(due.version, h.version + 1);
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].lapsed_hold), (h.id, true));
    assert!(store.expire_lapsed_hold(h.id).await.unwrap());
    assert!(
        !store.make_due(h.id).await.unwrap(),
        "CANCELLING is not due"
    );

    let (t, _) = create(&store, "bob", "req-2", LONG).await;
    assert!(store.make_due(t.id).await.unwrap());
    let due = get(&store, t.id).await;
    assert_eq!(due.stored_state, State::Trying);
    assert!(due.expires_at < t.expires_at - chrono::Duration::seconds(500));

    // A lapsed hold keeps its earlier deadline.
    let (lapsed, _) = held(&store, "carol", "req-3", SHORT).await;
    lapse().await;
    assert!(store.make_due(lapsed.id).await.unwrap());
    assert_eq!(get(&store, lapsed.id).await.expires_at, lapsed.expires_at);

    let (c, ctoken) = held(&store, "dave", "req-4", LONG).await;
    decide(&store, c.id, &ctoken, &confirm()).await;
    let decided = get(&store, c.id).await;
    assert_eq!(decided.stored_state, State::Confirming);
    assert!(!store.make_due(c.id).await.unwrap());
    let after = get(&store, c.id).await;
    assert_eq!(
        (after.version, after.expires_at),
        (decided.version, decided.expires_at),
        "nothing changed"
    );
    assert!(!store.make_due(Uuid::new_v4()).await.unwrap());
}
