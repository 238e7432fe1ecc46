//! Retention (SPEC 8.3): `Store::purge_finished` deletes terminal reservations finished more
//! than `keep` ago with all their rows, and nothing with work left: not one finished recently,
//! not one `HELD`, `CONFIRMING` or `CANCELLING`, not one whose refund is `PENDING`; never more
//! than a batch per call. "Old" is made by moving `updated_at` back a day in SQL
//! ([`Backdate`], per backend in `main.rs`), so nothing waits for time to pass.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use holdfast::domain::{BranchState, LatePaymentPolicy, RefundState, State, Verdict};
use holdfast::store::{Created, Purged};
use uuid::Uuid;

use super::{FAST, LONG, S, cancel, confirm, confirm_paid, decide, held, new_res, reports};

/// Moves a reservation's `updated_at` (its finish time) and any lease a day back.
pub type Backdate = Arc<dyn Fn(Uuid) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What counts as old in these cases: anything finished more than an hour ago.
const KEEP: Duration = Duration::from_secs(3600);

/// A reservation of three holds cancelled and released: terminal, nothing pending.
async fn cancelled(store: &S, request_id: &str) -> Uuid {
    let (r, token) = held(store, "alice", request_id, LONG).await;
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
    assert_eq!(phase.reservation.state, State::Cancelled);
    r.id
}

async fn exists(store: &S, id: Uuid) -> bool {
    store.get(id).await.unwrap().is_some()
}

pub async fn purges_only_finished_old_work(store: S, backdate: Backdate) {
    // Finished and old: goes, with its three branches.
    let old = cancelled(&store, "old").await;
    backdate(old).await;
    // Finished but recent: stays.
    let recent = cancelled(&store, "recent").await;
    // Old but not finished: HELD, CONFIRMING, CANCELLING stay.
    let (h, _) = held(&store, "alice", "held", LONG).await;
    let (c, c_token) = held(&store, "alice", "confirming", LONG).await;
    decide(&store, c.id, &c_token, &confirm()).await;
    let (x, x_token) = held(&store, "alice", "cancelling", LONG).await;
    decide(&store, x.id, &x_token, &cancel()).await;
    // Old and cancelled, but a payment arrived after it: its refund is PENDING, so it stays.
    let refunding = cancelled(&store, "refunding").await;
    let (verdict, after, _) = decide(
        &store,
        refunding,
        &super::token_of(refunding),
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    assert!(matches!(verdict, Verdict::Refund { .. }), "{verdict:?}");
    assert_eq!(after.refund.map(|r| r.state), Some(RefundState::Pending));
    for id in [h.id, c.id, x.id, refunding] {
        backdate(id).await;
    }

    let purged = store.purge_finished(KEEP, 1000).await.unwrap();
    assert_eq!(
        purged,
        Purged {
            reservations: 1,
            branches: 3,
            extra_payments: 0
        }
    );
    assert!(!exists(&store, old).await, "finished and old: deleted");
    for (what, id) in [
        ("recent", recent),
        ("HELD", h.id),
        ("CONFIRMING", c.id),
        ("CANCELLING", x.id),
        ("pending refund", refunding),
    ] {
        assert!(exists(&store, id).await, "{what} must be kept");
    }
    // Nothing more to do: a second pass deletes nothing.
    assert_eq!(
        store.purge_finished(KEEP, 1000).await.unwrap(),
        Purged::default()
    );
}

pub async fn batch_bound_is_respected(store: S, backdate: Backdate) {
    let mut ids = Vec::new();
    for i in 0..5 {
        let id = cancelled(&store, &format!("r-{i}")).await;
        backdate(id).await;
        ids.push(id);
    }
    let mut batches = Vec::new();
    loop {
        let p = store.purge_finished(KEEP, 2).await.unwrap();
        if p.reservations == 0 {
            break;
        }
        assert!(p.reservations <= 2, "a batch of 2 deleted {p:?}");
        assert_eq!(p.branches, 3 * p.reservations);
        batches.push(p.reservations);
    }
    assert_eq!(batches, vec![2, 2, 1]);
    for id in ids {
        assert!(!exists(&store, id).await);
    }
}

pub async fn reserve_after_deletion_is_new(store: S, backdate: Backdate) {
    let first = cancelled(&store, "same-request").await;
    // Before retention, the same request is the same reservation.
    let again = new_res("alice", "same-request", LONG);
    match store
        .create(&again, super::lease(), super::NO_LIMITS)
        .await
        .unwrap()
    {
        Created::Existing(r) => assert_eq!(r.id, first),
        other => panic!("expected the existing reservation, got {other:?}"),
    }
    backdate(first).await;
    assert_eq!(
        store.purge_finished(KEEP, 1000).await.unwrap().reservations,
        1
    );
    // After it, the repeat creates a new one (README: retention must exceed any retry window).
    match store
        .create(&again, super::lease(), super::NO_LIMITS)
        .await
        .unwrap()
    {
        Created::New(r) => {
            assert_ne!(r.id, first);
            assert_eq!(r.state, State::Trying);
        }
        other => panic!("expected a new reservation, got {other:?}"),
    }
}

/// An operator's audit entries go with their reservation (the table cascades), and an entry
/// about a participant, which has no reservation, stays.
pub async fn audit_entries_go_with_their_reservation(store: S, backdate: Backdate) {
    use holdfast::domain::admin::{AdminAction, AuditNote, AuditQuery, RetryTarget};
    use holdfast::store::AdminDecided;

    let note = |action, reason: &str, participant: Option<&str>| AuditNote {
        principal: "ops".into(),
        action,
        reason: reason.into(),
        participant: participant.map(str::to_owned),
    };
    let (h, _) = held(&store, "alice", "audited", LONG).await;
    let decided = store
        .force_cancel(
            h.id,
            &note(AdminAction::ForceCancel, "ticket 9", None),
            super::lease(),
        )
        .await
        .unwrap();
    let AdminDecided::Done { reservation, .. } = decided else {
        panic!("ForceCancel of a HELD reservation: {decided:?}");
    };
    let phase = store
        .record_phase(
            h.id,
            State::Cancelling,
            &reports(&reservation, BranchState::Cancelled, None),
            Some(State::Cancelled),
            FAST,
        )
        .await
        .unwrap();
    assert_eq!(phase.reservation.state, State::Cancelled);
    store
        .retry(
            &RetryTarget::Participant("seats".into()),
            &note(AdminAction::Retry, "", Some("seats")),
            super::lease(),
        )
        .await
        .unwrap();
    assert_eq!(store.audit_of(&[h.id]).await.unwrap().len(), 1);

    backdate(h.id).await;
    let purged = store.purge_finished(KEEP, 100).await.unwrap();
    assert_eq!(purged.reservations, 1, "{purged:?}");
    assert!(!exists(&store, h.id).await);
    assert!(store.audit_of(&[h.id]).await.unwrap().is_empty());
    let all = store
        .audit(&AuditQuery {
            reservation_id: None,
            limit: 10,
            before: None,
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].participant.as_deref(), Some("seats"));
    assert_eq!(all[0].reservation_id, None);
}
