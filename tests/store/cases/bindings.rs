//! Payments bound to reservations (SPEC 7.3): a payment is recorded only once checked
//! (`payment_verified`), one payment_ref belongs to at most one reservation (also when two
//! Confirms race), and a further payment on a settled reservation is recorded with its own
//! refund, retried until acknowledged, never twice.

use holdfast::domain::LatePaymentPolicy;
use holdfast::domain::lifecycle::Refusal;
use holdfast::domain::{BranchState, Decision, Payment, RefundState, State, Verdict};
use holdfast::store::{Decided, RefundAnswer};

use super::{FAST, LONG, S, SLOW, decide, get, held, lease, payment, reports};

fn paying(p: Payment, payment_verified: bool) -> Decision {
    Decision::Confirm {
        payment: Some(p),
        late_policy: LatePaymentPolicy::HonorIfAvailable,
        payment_verified,
    }
}

fn other_payment() -> Payment {
    Payment {
        payment_ref: "pay-2".into(),
        amount_minor: 900,
        ..payment()
    }
}

pub async fn unverified_payment_changes_nothing(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    let (verdict, seen, leased) = decide(&store, r.id, &token, &paying(payment(), false)).await;
    assert_eq!(verdict, Verdict::VerifyPayment);
    assert!(!leased);
    assert_eq!(seen.state, State::Held);
    let after = get(&store, r.id).await;
    assert_eq!((after.state, after.version), (State::Held, r.version));
    assert_eq!(after.payment, None);
    // Checked: recorded with the decision.
    let (verdict, confirming, _) = decide(&store, r.id, &token, &paying(payment(), true)).await;
    assert!(matches!(verdict, Verdict::Transition { .. }), "{verdict:?}");
    assert_eq!(confirming.payment, Some(payment()));
    // A repeat with the same payment needs no check.
    let (verdict, _, _) = decide(&store, r.id, &token, &paying(payment(), false)).await;
    assert_eq!(verdict, Verdict::AlreadyDone);
}

pub async fn payment_ref_belongs_to_one_reservation(store: S) {
    let (a, token_a) = held(&store, "alice", "req-a", LONG).await;
    let (b, token_b) = held(&store, "bob", "req-b", LONG).await;
    decide(&store, a.id, &token_a, &paying(payment(), true)).await;
    let taken = store
        .decide(b.id, None, &token_b, &paying(payment(), true), lease())
        .await
        .unwrap();
    assert!(matches!(taken, Decided::PaymentTaken), "{taken:?}");
    let b_after = get(&store, b.id).await;
    assert_eq!((b_after.state, b_after.version), (State::Held, b.version));
    assert_eq!((b_after.payment, b_after.refund), (None, None));
    // The same payment at another payments participant is another payment.
    let elsewhere = Payment {
        participant: "wallet".into(),
        ..payment()
    };
    let (verdict, _, _) = decide(&store, b.id, &token_b, &paying(elsewhere, true)).await;
    assert!(matches!(verdict, Verdict::Transition { .. }), "{verdict:?}");
}

pub async fn racing_confirms_bind_a_payment_once(store: S) {
    for round in 0..4 {
        let (a, token_a) = held(&store, "alice", &format!("a-{round}"), LONG).await;
        let (b, token_b) = held(&store, "bob", &format!("b-{round}"), LONG).await;
        let p = Payment {
            payment_ref: format!("race-{round}"),
            ..payment()
        };
        let confirm = paying(p.clone(), true);
        let (one, two) = tokio::join!(
            store.decide(a.id, None, &token_a, &confirm, lease()),
            store.decide(b.id, None, &token_b, &confirm, lease())
        );
        let outcomes = [one.unwrap(), two.unwrap()];
        let taken = outcomes
            .iter()
            .filter(|d| matches!(d, Decided::PaymentTaken))
            .count();
        assert_eq!(taken, 1, "{outcomes:?}");
        let (a, b) = (get(&store, a.id).await, get(&store, b.id).await);
        let bound: Vec<_> = [&a, &b]
            .into_iter()
            .filter(|r| r.payment.as_ref() == Some(&p))
            .collect();
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0].state, State::Confirming);
        let loser = if a.payment.is_some() { &b } else { &a };
        assert_eq!((loser.state, loser.payment.as_ref()), (State::Held, None));
    }
}

pub async fn further_payment_is_refunded(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    decide(&store, r.id, &token, &paying(payment(), true)).await;
    let confirmed = store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Confirmed, None),
            Some(State::Confirmed),
            FAST,
        )
        .await
        .unwrap()
        .reservation;
    assert_eq!(confirmed.state, State::Confirmed);
    assert_eq!(store.backlog().await.unwrap(), 0);
    // A second, different payment: checked first, then recorded with its own refund.
    let (verdict, _, _) = decide(&store, r.id, &token, &paying(other_payment(), false)).await;
    assert_eq!(verdict, Verdict::VerifyPayment);
    let extra_refund = |d: Decided| match d {
        Decided::ExtraRefund {
            answer,
            reservation,
            extra,
            leased,
        } => (answer, *reservation, extra, leased),
        other => panic!("expected a further payment's refund, got {other:?}"),
    };
    let (answer, seen, extra, leased) = extra_refund(
        store
            .decide(r.id, None, &token, &paying(other_payment(), true), lease())
            .await
            .unwrap(),
    );
    assert_eq!(answer, Refusal::Closed);
    assert!(leased);
    assert_eq!(seen.state, State::Confirmed);
    assert_eq!(extra.payment, other_payment());
    assert_eq!(extra.refund.state, RefundState::Pending);
    assert_eq!(
        (extra.refund.amount_minor, extra.refund.currency.as_str()),
        (900, "EUR")
    );
    // The reservation itself is unchanged: its payment, no refund of it.
    let after = get(&store, r.id).await;
    assert_eq!(
        (after.version, after.refund.as_ref()),
        (confirmed.version, None)
    );
    assert_eq!(after.payment, Some(payment()));
    // A repeat answers the same refund and records nothing.
    let (_, _, again, leased) = extra_refund(
        store
            .decide(r.id, None, &token, &paying(other_payment(), true), lease())
            .await
            .unwrap(),
    );
    assert_eq!(again.refund.refund_id, extra.refund.refund_id);
    assert!(!leased);
    // The refund is owed work until acknowledged.
    assert_eq!(store.backlog().await.unwrap(), 1);
    assert_eq!(
        store.pending_extra_payments(r.id).await.unwrap(),
        std::slice::from_ref(&extra)
    );
    let failed = store
        .record_extra_refund_attempt(r.id, &extra, &RefundAnswer::Retry, SLOW)
        .await
        .unwrap();
    assert_eq!(failed.refund.state, RefundState::Pending);
    assert!(
        store.claim_due(lease(), 10).await.unwrap().is_empty(),
        "not due yet"
    );
    let done = store
        .record_extra_refund_attempt(r.id, &extra, &RefundAnswer::Refunded, SLOW)
        .await
        .unwrap();
    assert_eq!(done.refund.state, RefundState::Refunded);
    assert_eq!(done.refund.refund_id, extra.refund.refund_id);
    assert!(store.pending_extra_payments(r.id).await.unwrap().is_empty());
    assert_eq!(store.backlog().await.unwrap(), 0);
    // That payment is bound to this reservation now: another one cannot cite it.
    let (b, token_b) = held(&store, "bob", "req-b", LONG).await;
    let taken = store
        .decide(
            b.id,
            None,
            &token_b,
            &paying(other_payment(), true),
            lease(),
        )
        .await
        .unwrap();
    assert!(matches!(taken, Decided::PaymentTaken), "{taken:?}");
    assert_eq!(get(&store, b.id).await.state, State::Held);
}

/// A further payment's refund refused for good is `FAILED` with the reason: no longer owed,
/// never claimed again.
pub async fn refused_further_refund_is_parked(store: S) {
    let (r, token) = held(&store, "alice", "req-1", LONG).await;
    decide(&store, r.id, &token, &paying(payment(), true)).await;
    store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Confirmed, None),
            Some(State::Confirmed),
            FAST,
        )
        .await
        .unwrap();
    let extra = match store
        .decide(r.id, None, &token, &paying(other_payment(), true), lease())
        .await
        .unwrap()
    {
        Decided::ExtraRefund { extra, .. } => extra,
        other => panic!("expected a further payment's refund, got {other:?}"),
    };
    let why = "payments refused the refund: InvalidArgument: currency must match";
    let failed = store
        .record_extra_refund_attempt(r.id, &extra, &RefundAnswer::Refused(why.into()), FAST)
        .await
        .unwrap();
    assert_eq!(failed.refund.state, RefundState::Failed);
    assert_eq!(failed.refund.failure.as_deref(), Some(why));
    assert_eq!(failed.refund.refund_id, extra.refund.refund_id);
    assert!(store.pending_extra_payments(r.id).await.unwrap().is_empty());
    assert_eq!(store.backlog().await.unwrap(), 0);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(store.claim_due(lease(), 10).await.unwrap().is_empty());
    // The reservation's own state is untouched.
    assert_eq!(get(&store, r.id).await.state, State::Confirmed);
}
