//! Payments that come with a decision: a refund recorded once and retried until acknowledged,
//! late payments (refunded by policy, honoured in place, or re-taken as a new generation that
//! confirms or fails and refunds), and the refund of a reservation that failed.

use std::time::Duration;

use holdfast::domain::LatePaymentPolicy;
use holdfast::domain::lifecycle::Refusal;
use holdfast::domain::{BranchState, PresentedToken, RefundState, Reservation, State, Verdict};
use holdfast::store::{BranchReport, Decided, RefundAnswer, WorkLease};
use uuid::Uuid;

use super::{
    FAST, LONG, S, SHORT, SLOW, cancel, confirm_paid, decide, get, held, lapse, lease, payment,
    reports,
};

/// A cancelled reservation (released and done).
async fn cancelled(store: &S) -> (Reservation, PresentedToken) {
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
        duration: SHORT,
    };
    let (one, two) = tokio::join!(
        store.decide(r.id, None, &token, &paid, short()),
        store.decide(r.id, None, &token, &paid, short())
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
    lapse().await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].id, claimed[0].lapsed_hold), (r.id, false));
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
        .record_refund_attempt(r.id, &RefundAnswer::Retry, SLOW)
        .await
        .unwrap();
    assert_eq!(after.refund.as_ref().unwrap().state, RefundState::Pending);
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    let done = store
        .record_refund_attempt(r.id, &RefundAnswer::Refunded, SLOW)
        .await
        .unwrap();
    assert_eq!(done.refund.as_ref().unwrap().state, RefundState::Refunded);
    assert_eq!(done.version, after.version + 1);
    assert_eq!(store.backlog().await.unwrap(), 0);
    let again = store
        .record_refund_attempt(r.id, &RefundAnswer::Refunded, SLOW)
        .await
        .unwrap();
    assert_eq!(again.version, done.version);
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
}

/// A refund the payment service refused for good is `FAILED` with the reason: no longer due
/// work, never claimed again, and later answers change nothing.
pub async fn refused_refund_is_parked(store: S) {
    let (r, token) = cancelled(&store).await;
    decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    let before = get(&store, r.id).await;
    let why = "payments refused the refund: NotFound: payment pay_1 does not exist";
    let failed = store
        .record_refund_attempt(r.id, &RefundAnswer::Refused(why.into()), FAST)
        .await
        .unwrap();
    let refund = failed.refund.clone().unwrap();
    assert_eq!(refund.state, RefundState::Failed);
    assert_eq!(refund.failure.as_deref(), Some(why));
    assert_eq!(failed.version, before.version + 1, "a change watchers see");
    assert_eq!(
        get(&store, r.id).await,
        failed,
        "the answer is what is stored"
    );
    assert_eq!(store.backlog().await.unwrap(), 0, "no longer owed work");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store.claim_due(lease(), 10).await.unwrap().is_empty(),
        "never claimed again"
    );
    let late = store
        .record_refund_attempt(r.id, &RefundAnswer::Refunded, FAST)
        .await
        .unwrap();
    assert_eq!(late, failed, "a FAILED refund stays as it is");
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

/// A reservation released by expiry (reaped, every branch cancelled): `EXPIRED`.
async fn expired_and_released(store: &S) -> (Reservation, PresentedToken) {
    let (r, token) = held(store, "alice", "late", SHORT).await;
    lapse().await;
    let claimed = store.claim_due(lease(), 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(claimed[0].lapsed_hold);
    assert!(store.expire_lapsed_hold(r.id).await.unwrap());
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
