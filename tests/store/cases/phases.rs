//! Recording what the participants answered: `record_held` (only from TRYING),
//! `record_rejected`, and `record_phase` with its backoff, its finish and a call from the wrong
//! state.

use std::time::Duration;

use holdfast::domain::{BranchState, Rejection, State};
use holdfast::store::BranchReport;

use super::{
    FAST, LONG, S, SLOW, cancel, create, create_with, decide, held, lease, new_res, reports,
};

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

/// A placement stopped before anything was placed (every report a refusal; a branch without
/// one was never tried) is recorded REJECTED in that one write: nothing to release, no work
/// left. One whose outcome is unknown somewhere still goes through CANCELLING.
pub async fn record_rejected_with_nothing_placed_is_final(store: S) {
    let (r, _) = create(&store, "alice", "req-1", LONG).await;
    let first = r.participant_branches()[0].branch_id;
    let rejection = Rejection {
        participant: "seats".into(),
        resource: "A1".into(),
        reason: "sold out".into(),
    };
    let refused = [BranchReport {
        branch_id: first,
        state: BranchState::Rejected,
        error: None,
    }];
    let recorded = store
        .record_rejected(r.id, Some(&rejection), &refused)
        .await
        .unwrap();
    assert_eq!(recorded.state, State::Rejected);
    assert_eq!(recorded.version, r.version + 1);
    assert_eq!(recorded.release_outcome, Some(State::Rejected));
    assert_eq!(recorded.rejection.as_ref(), Some(&rejection));
    for b in &recorded.branches {
        let expected = if b.branch_id == first {
            (BranchState::Rejected, 1)
        } else {
            (BranchState::Pending, 0)
        };
        assert_eq!((b.state, b.attempts), expected, "{b:?}");
    }
    assert_eq!(store.backlog().await.unwrap(), 0);
    // A release's finish finds nothing left to do.
    let phase = store
        .record_phase(r.id, State::Cancelling, &[], Some(State::Rejected), FAST)
        .await
        .unwrap();
    assert!(!phase.finished);
    assert_eq!(phase.reservation.version, recorded.version);
    // Outcome unknown: it may hold, so it is released first.
    let (u, _) = create(&store, "alice", "req-2", LONG).await;
    let unknown = store
        .record_rejected(
            u.id,
            None,
            &reports(&u, BranchState::Pending, Some("unreachable")),
        )
        .await
        .unwrap();
    assert_eq!(unknown.state, State::Cancelling);
    assert_eq!(store.backlog().await.unwrap(), 1);
}

/// `discard`: a TRYING reservation under the caller's lease, or a REJECTED one, goes with its
/// branches and its (holder, request_id) is free; anything else stays.
pub async fn discard_only_what_holds_nothing(store: S) {
    let mine = lease();
    // TRYING, but under another instance's lease: left alone.
    let (r, _) = create(&store, "alice", "req-1", LONG).await;
    assert!(!store.discard(r.id, mine.owner).await.unwrap());
    assert!(store.get(r.id).await.unwrap().is_some());
    // TRYING under this lease: gone, and the request_id is new again.
    let (r, _) = create_with(&store, "alice", "req-2", LONG, mine).await;
    assert!(store.discard(r.id, mine.owner).await.unwrap());
    assert!(store.get(r.id).await.unwrap().is_none());
    let again = store
        .create(&new_res("alice", "req-2", LONG), mine, super::NO_LIMITS)
        .await
        .unwrap();
    assert!(
        matches!(again, holdfast::store::Created::New(_)),
        "{again:?}"
    );
    // HELD: left alone, whoever asks.
    let (h, _) = held(&store, "alice", "req-3", LONG).await;
    assert!(!store.discard(h.id, mine.owner).await.unwrap());
    assert_eq!(store.get(h.id).await.unwrap().unwrap().state, State::Held);
    // REJECTED (released): gone.
    let (r, _) = create(&store, "alice", "req-4", LONG).await;
    store
        .record_rejected(r.id, None, &reports(&r, BranchState::Rejected, None))
        .await
        .unwrap();
    let done = store
        .record_phase(r.id, State::Cancelling, &[], Some(State::Rejected), FAST)
        .await
        .unwrap();
    assert_eq!(done.reservation.state, State::Rejected);
    assert!(store.discard(r.id, mine.owner).await.unwrap());
    assert!(store.get(r.id).await.unwrap().is_none());
    let listed = store
        .list(&holdfast::domain::ListQuery {
            holder: Some("alice".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut ids: Vec<_> = listed.iter().map(|r| r.request_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["req-1", "req-2", "req-3"]);
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
    assert!(!claimed[0].lapsed_hold);
}
