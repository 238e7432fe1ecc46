//! The operator's writes and reads (`tcc.v1.Admin`) on both databases: ForceCancel and Resolve
//! (one conditional change, refused from any other state), Retry's wake-up and lease, the
//! audit entry written with each change, stuck work and the audit log.

use holdfast::domain::admin::{AdminAction, AuditNote, AuditQuery, RetryTarget, StuckQuery};
use holdfast::domain::{BranchState, State};
use holdfast::store::AdminDecided;
use uuid::Uuid;

use super::*;

fn note(action: AdminAction, reason: &str) -> AuditNote {
    AuditNote {
        principal: "ops".into(),
        action,
        reason: reason.into(),
        participant: None,
    }
}

fn done(d: AdminDecided) -> (Reservation, bool) {
    match d {
        AdminDecided::Done {
            reservation,
            leased,
        } => (*reservation, leased),
        other => panic!("expected a change, got {other:?}"),
    }
}

pub async fn force_cancel_held_and_trying(store: S) {
    let fc = note(AdminAction::ForceCancel, "support ticket 7");
    let (h, _) = held(&store, "alice", "fc-held", LONG).await;
    let (r, leased) = done(store.force_cancel(h.id, &fc, lease()).await.unwrap());
    assert_eq!(r.state, State::Cancelling);
    assert_eq!(r.release_outcome, Some(State::Cancelled));
    assert!(leased);
    // Refused from any other state, nothing written (no second entry).
    let again = store.force_cancel(h.id, &fc, lease()).await.unwrap();
    assert!(matches!(again, AdminDecided::Refused(ref r) if r.state == State::Cancelling));
    let entries = store.audit_of(&[h.id]).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (
            entries[0].principal.as_str(),
            entries[0].action,
            entries[0].reason.as_str()
        ),
        ("ops", AdminAction::ForceCancel, "support ticket 7")
    );
    assert_eq!(entries[0].reservation_id, Some(h.id));

    // TRYING: released with its placement; every unanswered branch counts as tried.
    let (t, _) = create(&store, "alice", "fc-trying", LONG).await;
    let (r, _) = done(store.force_cancel(t.id, &fc, lease()).await.unwrap());
    assert_eq!(r.state, State::Cancelling);
    assert!(r.branches.iter().all(|b| b.attempts >= 1), "{r:?}");
    // The placer's answers no longer apply.
    let after = store
        .record_held(t.id, &reports(&t, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(after.state, State::Cancelling);

    let missing = store
        .force_cancel(Uuid::new_v4(), &fc, lease())
        .await
        .unwrap();
    assert!(matches!(missing, AdminDecided::NotFound));
}

pub async fn resolve_only_failed(store: S) {
    let (r, token) = held(&store, "alice", "rs-1", LONG).await;
    let rs = note(AdminAction::ResolveConfirmed, "checked by hand");
    // HELD: refused, nothing written.
    let refused = store
        .resolve(r.id, State::Confirmed, &rs, lease())
        .await
        .unwrap();
    assert!(matches!(refused, AdminDecided::Refused(ref x) if x.state == State::Held));
    decide(&store, r.id, &token, &confirm()).await;
    store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::HoldLost, None),
            Some(State::Failed),
            FAST,
        )
        .await
        .unwrap();
    let (after, leased) = done(
        store
            .resolve(r.id, State::Confirmed, &rs, lease())
            .await
            .unwrap(),
    );
    assert_eq!(after.state, State::Confirmed);
    assert!(after.refund.is_none());
    assert!(!leased, "nothing left to drive");
    assert_eq!(get(&store, r.id).await.state, State::Confirmed);
    let again = store
        .resolve(r.id, State::Cancelled, &rs, lease())
        .await
        .unwrap();
    assert!(matches!(again, AdminDecided::Refused(ref x) if x.state == State::Confirmed));
    assert_eq!(store.audit_of(&[r.id]).await.unwrap().len(), 1);
}

pub async fn retry_wakes_and_leases_unfinished_work(store: S) {
    let (r, token) = held(&store, "alice", "rt-1", LONG).await;
    decide(&store, r.id, &token, &confirm()).await;
    // A failed Confirm fan-out: backing off for an hour, lease given up.
    store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Held, Some("unreachable")),
            None,
            SLOW,
        )
        .await
        .unwrap();
    let (other, _) = held(&store, "bob", "rt-2", LONG).await;

    let mut rt = note(AdminAction::Retry, "");
    rt.participant = Some("seats".into());
    let mine = lease();
    let woken = store
        .retry(&RetryTarget::Participant("seats".into()), &rt, mine)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(woken.len(), 1, "only unfinished work: {woken:?}");
    assert_eq!((woken[0].id, woken[0].leased), (r.id, true));
    // Leased to this retry now: a sweep does not take it, and another Retry does not either.
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    let second = store
        .retry(
            &RetryTarget::Reservation(r.id),
            &note(AdminAction::Retry, ""),
            lease(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((second[0].id, second[0].leased), (r.id, false));
    // A HELD one has nothing to drive; an unknown one is None.
    let none = store
        .retry(
            &RetryTarget::Reservation(other.id),
            &note(AdminAction::Retry, ""),
            lease(),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(none.is_empty());
    assert!(
        store
            .retry(
                &RetryTarget::Reservation(Uuid::new_v4()),
                &note(AdminAction::Retry, ""),
                lease()
            )
            .await
            .unwrap()
            .is_none()
    );

    // The audit log: newest first, paged by seq; the participant entry has no reservation.
    let all = store
        .audit(&AuditQuery {
            reservation_id: None,
            limit: 10,
            before: None,
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    assert!(all[0].seq > all[1].seq && all[1].seq > all[2].seq);
    assert_eq!(all[2].reservation_id, None);
    assert_eq!(all[2].participant.as_deref(), Some("seats"));
    let older = store
        .audit(&AuditQuery {
            reservation_id: None,
            limit: 10,
            before: Some(all[1].seq),
        })
        .await
        .unwrap();
    assert_eq!(older.len(), 1);
    let of_r = store
        .audit(&AuditQuery {
            reservation_id: Some(r.id),
            limit: 10,
            before: None,
        })
        .await
        .unwrap();
    assert_eq!(of_r.len(), 1);
}

pub async fn list_stuck_filters(store: S) {
    let (r, token) = held(&store, "alice", "st-1", LONG).await;
    decide(&store, r.id, &token, &confirm()).await;
    store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Held, Some("unreachable")),
            None,
            SLOW,
        )
        .await
        .unwrap();
    let (live, _) = held(&store, "alice", "st-2", LONG).await;
    let q = |states: Vec<State>, participant: Option<&str>, older: Duration| StuckQuery {
        states,
        participant: participant.map(str::to_owned),
        older_than: older,
        limit: 10,
        after: None,
    };
    let all = store
        .list_stuck(&q(vec![], None, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(all.iter().map(|x| x.id).collect::<Vec<_>>(), vec![r.id]);
    assert!(!all.iter().any(|x| x.id == live.id));
    for (states, participant, older) in [
        (vec![State::Failed], None, Duration::ZERO),
        (vec![], Some("payments"), Duration::ZERO),
        (vec![], None, Duration::from_secs(3600)),
    ] {
        assert!(
            store
                .list_stuck(&q(states, participant, older))
                .await
                .unwrap()
                .is_empty()
        );
    }
    let by = store
        .list_stuck(&q(vec![State::Confirming], Some("rooms"), Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(by.len(), 1);
}

pub async fn resolve_cancelled_keeps_one_refund(store: S) {
    use holdfast::domain::{LatePaymentPolicy, RefundState};
    let (r, token) = held(&store, "alice", "rs-paid", LONG).await;
    decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    let failed = store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::HoldLost, None),
            Some(State::Failed),
            FAST,
        )
        .await
        .unwrap()
        .reservation;
    let refund = failed.refund.clone().expect("FAILED refunds the payment");
    let rs = note(AdminAction::ResolveCancelled, "released by hand");
    let (after, leased) = done(
        store
            .resolve(r.id, State::Cancelled, &rs, lease())
            .await
            .unwrap(),
    );
    assert_eq!(after.state, State::Cancelled);
    // The refund owed since FAILED, the same one (never twice), to be sent by this resolver.
    let now = after.refund.expect("still refunded");
    assert_eq!(now.refund_id, refund.refund_id);
    assert_eq!(now.state, RefundState::Pending);
    assert!(leased);
}
