//! The lifecycle table, case by case.

use super::*;

fn snap(state: State, expired: bool) -> Snapshot {
    let now = Utc::now();
    Snapshot {
        state,
        release_outcome: None,
        expired,
        created_at: now,
        expires_at: now + chrono::Duration::minutes(10),
        extensions_used: 0,
        ttl: Duration::from_secs(600),
        has_payment: false,
        has_refund: false,
        same_payment: false,
        repeats_last_extend: false,
    }
}

fn confirm() -> Decision {
    Decision::Confirm {
        payment: None,
        late_policy: LatePaymentPolicy::HonorIfAvailable,
        payment_verified: false,
    }
}

fn paid(late_policy: LatePaymentPolicy) -> Decision {
    Decision::Confirm {
        payment: Some(Payment {
            participant: "payments".into(),
            payment_ref: "p1".into(),
            amount_minor: 100,
            currency: "EUR".into(),
        }),
        late_policy,
        payment_verified: true,
    }
}

#[test]
fn late_payments_are_honoured_retaken_or_refunded_once() {
    use LatePaymentPolicy::{HonorIfAvailable, Refund};
    assert_eq!(
        decide(&snap(State::Held, true), &paid(HonorIfAvailable)),
        Verdict::HonorLate
    );
    assert_eq!(
        decide(&snap(State::Held, true), &paid(Refund)),
        Verdict::Refund {
            expire: true,
            answer: Refusal::HoldExpired
        }
    );
    assert_eq!(
        decide(&snap(State::Expired, false), &paid(HonorIfAvailable)),
        Verdict::Retake
    );
    assert_eq!(
        decide(&snap(State::Expired, false), &paid(Refund)),
        Verdict::Refund {
            expire: false,
            answer: Refusal::HoldExpired
        }
    );
    // While a late payment is honoured: its repeat waits; another payment waits too, and is
    // recorded and refunded meanwhile (it is not applied, whatever the retake's outcome).
    let mut retaking = snap(State::Expired, false);
    retaking.has_payment = true;
    retaking.same_payment = true;
    assert_eq!(
        decide(&retaking, &paid(HonorIfAvailable)),
        Verdict::Refuse(Refusal::InProgress)
    );
    retaking.same_payment = false;
    assert_eq!(
        decide(&retaking, &paid(HonorIfAvailable)),
        Verdict::RefundExtra {
            answer: Refusal::InProgress
        }
    );
    let Decision::Confirm {
        payment,
        late_policy,
        ..
    } = paid(HonorIfAvailable)
    else {
        unreachable!("paid() is a Confirm")
    };
    let unverified = Decision::Confirm {
        payment,
        late_policy,
        payment_verified: false,
    };
    assert_eq!(
        decide(&retaking, &unverified),
        Verdict::VerifyPayment,
        "recorded only once verified"
    );
    let mut refunded = snap(State::Expired, false);
    refunded.has_payment = true;
    refunded.has_refund = true;
    refunded.same_payment = true;
    assert_eq!(
        decide(&refunded, &paid(HonorIfAvailable)),
        Verdict::Refuse(Refusal::HoldExpired)
    );
    for st in [State::Cancelled, State::Rejected, State::Failed] {
        assert_eq!(
            decide(&snap(st, false), &paid(HonorIfAvailable)),
            Verdict::Refund {
                expire: false,
                answer: Refusal::Closed
            }
        );
    }
    let mut releasing = snap(State::Cancelling, false);
    releasing.release_outcome = Some(State::Expired);
    assert_eq!(
        decide(&releasing, &paid(HonorIfAvailable)),
        Verdict::Refund {
            expire: false,
            answer: Refusal::HoldExpired
        }
    );
    let mut confirmed = snap(State::Confirmed, false);
    confirmed.has_payment = true;
    confirmed.same_payment = true;
    assert_eq!(
        decide(&confirmed, &paid(HonorIfAvailable)),
        Verdict::AlreadyDone
    );
}

#[test]
fn a_second_different_payment_is_refunded_never_dropped() {
    use LatePaymentPolicy::HonorIfAvailable;
    for st in [State::Confirming, State::Confirmed] {
        // Confirmed with another payment, or with none.
        for has_payment in [true, false] {
            let mut s = snap(st, false);
            s.has_payment = has_payment;
            assert_eq!(
                decide(&s, &paid(HonorIfAvailable)),
                Verdict::RefundExtra {
                    answer: Refusal::Closed
                }
            );
        }
    }
    let mut refunded = snap(State::Expired, false);
    refunded.has_payment = true;
    refunded.has_refund = true;
    assert_eq!(
        decide(&refunded, &paid(HonorIfAvailable)),
        Verdict::RefundExtra {
            answer: Refusal::HoldExpired
        }
    );
    let mut cancelled = snap(State::Cancelled, false);
    cancelled.has_payment = true;
    cancelled.has_refund = true;
    assert_eq!(
        decide(&cancelled, &paid(HonorIfAvailable)),
        Verdict::RefundExtra {
            answer: Refusal::Closed
        }
    );
    cancelled.same_payment = true;
    assert_eq!(
        decide(&cancelled, &paid(HonorIfAvailable)),
        Verdict::Refuse(Refusal::Closed),
        "a repeat answers the refund that exists"
    );
}

#[test]
fn a_payment_is_recorded_only_once_verified() {
    let unverified = |late_policy| match paid(late_policy) {
        Decision::Confirm {
            payment,
            late_policy,
            ..
        } => Decision::Confirm {
            payment,
            late_policy,
            payment_verified: false,
        },
        other => other,
    };
    use LatePaymentPolicy::HonorIfAvailable;
    for (s, verified) in [
        (
            snap(State::Held, false),
            Verdict::Transition {
                to: State::Confirming,
                release_outcome: None,
            },
        ),
        (snap(State::Held, true), Verdict::HonorLate),
        (snap(State::Expired, false), Verdict::Retake),
        (
            snap(State::Cancelled, false),
            Verdict::Refund {
                expire: false,
                answer: Refusal::Closed,
            },
        ),
        (
            snap(State::Confirmed, false),
            Verdict::RefundExtra {
                answer: Refusal::Closed,
            },
        ),
    ] {
        assert_eq!(decide(&s, &paid(HonorIfAvailable)), verified);
        assert_eq!(
            decide(&s, &unverified(HonorIfAvailable)),
            Verdict::VerifyPayment
        );
    }
    // Refusals and repeats record nothing: no check needed.
    let mut confirmed = snap(State::Confirmed, false);
    confirmed.has_payment = true;
    confirmed.same_payment = true;
    assert_eq!(
        decide(&confirmed, &unverified(HonorIfAvailable)),
        Verdict::AlreadyDone
    );
    assert_eq!(
        decide(&snap(State::Trying, false), &unverified(HonorIfAvailable)),
        Verdict::Refuse(Refusal::NotHeld)
    );
}

/// An Extend whose participants hold long enough already (see `extend_tells_first`).
fn extend() -> Decision {
    Decision::Extend {
        by: Some(Duration::from_secs(600)),
        max_extensions: 1,
        max_ttl: Duration::from_secs(3600),
        request_id: None,
        told_until: Some(DateTime::<Utc>::MAX_UTC),
    }
}

#[test]
fn extend_tells_participants_before_it_is_recorded() {
    let held = snap(State::Held, false);
    let until = held.expires_at + chrono::Duration::seconds(600);
    let told = |told_until| Decision::Extend {
        by: Some(Duration::from_secs(600)),
        max_extensions: 1,
        max_ttl: Duration::from_secs(3600),
        request_id: None,
        told_until,
    };
    let untold = told(None);
    assert_eq!(decide(&held, &untold), Verdict::TellParticipants { until });
    let told = |t| told(Some(t));
    assert_eq!(
        decide(&held, &told(until)),
        Verdict::Extend {
            by: Duration::from_secs(600)
        }
    );
    // Told a shorter deadline (the reservation moved meanwhile): tell again.
    assert_eq!(
        decide(&held, &told(until - chrono::Duration::microseconds(1))),
        Verdict::TellParticipants { until }
    );
    // Refusals and lapses need no participant.
    let mut used = held;
    used.extensions_used = 1;
    assert_eq!(
        decide(&used, &untold),
        Verdict::Refuse(Refusal::ExtensionLimit)
    );
    assert_eq!(decide(&snap(State::Held, true), &untold), Verdict::Expire);
}

#[test]
fn confirm_only_from_unexpired_held() {
    assert_eq!(
        decide(&snap(State::Held, false), &confirm()),
        Verdict::Transition {
            to: State::Confirming,
            release_outcome: None
        }
    );
    assert_eq!(
        decide(&snap(State::Held, true), &confirm()),
        Verdict::Expire
    );
    for st in [State::Confirming, State::Confirmed] {
        assert_eq!(decide(&snap(st, false), &confirm()), Verdict::AlreadyDone);
    }
    for st in [
        State::Cancelling,
        State::Cancelled,
        State::Rejected,
        State::Failed,
    ] {
        assert_eq!(
            decide(&snap(st, false), &confirm()),
            Verdict::Refuse(Refusal::Closed)
        );
    }
    assert_eq!(
        decide(&snap(State::Expired, false), &confirm()),
        Verdict::Refuse(Refusal::HoldExpired)
    );
    assert_eq!(
        decide(&snap(State::Trying, false), &confirm()),
        Verdict::Refuse(Refusal::NotHeld)
    );
}

#[test]
fn cancel_is_idempotent_and_never_undoes_a_confirm() {
    let cancel = Decision::Cancel { reason: None };
    assert_eq!(
        decide(&snap(State::Held, false), &cancel),
        Verdict::Transition {
            to: State::Cancelling,
            release_outcome: Some(State::Cancelled)
        }
    );
    assert_eq!(decide(&snap(State::Held, true), &cancel), Verdict::Expire);
    for st in [
        State::Cancelling,
        State::Cancelled,
        State::Expired,
        State::Rejected,
    ] {
        assert_eq!(decide(&snap(st, false), &cancel), Verdict::AlreadyDone);
    }
    for st in [State::Confirming, State::Confirmed, State::Failed] {
        assert_eq!(
            decide(&snap(st, false), &cancel),
            Verdict::Refuse(Refusal::Closed)
        );
    }
}

#[test]
fn extend_respects_count_and_max_ttl() {
    assert_eq!(
        decide(&snap(State::Held, false), &extend()),
        Verdict::Extend {
            by: Duration::from_secs(600)
        }
    );
    let by_default = Decision::Extend {
        by: None,
        max_extensions: 1,
        max_ttl: Duration::from_secs(3600),
        request_id: None,
        told_until: Some(DateTime::<Utc>::MAX_UTC),
    };
    assert_eq!(
        decide(&snap(State::Held, false), &by_default),
        Verdict::Extend {
            by: Duration::from_secs(600)
        },
        "no ttl: the original one"
    );
    let mut used = snap(State::Held, false);
    used.extensions_used = 1;
    assert_eq!(
        decide(&used, &extend()),
        Verdict::Refuse(Refusal::ExtensionLimit)
    );
    let too_long = Decision::Extend {
        by: Some(Duration::from_secs(3001)),
        max_extensions: 5,
        max_ttl: Duration::from_secs(3600),
        request_id: None,
        told_until: None,
    };
    assert_eq!(
        decide(&snap(State::Held, false), &too_long),
        Verdict::Refuse(Refusal::ExtensionLimit)
    );
    assert_eq!(decide(&snap(State::Held, true), &extend()), Verdict::Expire);
    // A repeat of the applied extension answers as it is, in any state.
    for st in [State::Held, State::Confirmed, State::Expired] {
        let mut repeat = used;
        repeat.state = st;
        repeat.repeats_last_extend = true;
        assert_eq!(decide(&repeat, &extend()), Verdict::AlreadyDone);
    }
    assert_eq!(
        decide(&snap(State::Confirmed, false), &extend()),
        Verdict::Refuse(Refusal::Closed)
    );
}
