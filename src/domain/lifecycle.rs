//! The lifecycle rules: which decision is allowed from which state.
//!
//! The store evaluates [`decide`] while it holds the reservation's row lock, then applies the
//! verdict with a conditional UPDATE whose row count confirms it; so this table is the one
//! place that says what Confirm, Cancel and Extend may do.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{LatePaymentPolicy, Payment, State};

/// What a holder asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Confirm {
        payment: Option<Payment>,
        late_policy: LatePaymentPolicy,
    },
    Cancel {
        reason: Option<String>,
    },
    Extend {
        /// How much to add; `None`: the reservation's original ttl.
        by: Option<Duration>,
        max_extensions: i32,
        max_ttl: Duration,
        /// The caller's key for this extension: a repeat of the last applied one answers the
        /// reservation as it is instead of extending again.
        request_id: Option<String>,
    },
}

impl Decision {
    /// The idempotency key of an Extend, if it has one.
    pub fn extend_request_id(&self) -> Option<&str> {
        match self {
            Decision::Extend { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }
}

/// The reservation as seen under its row lock.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    pub state: State,
    pub release_outcome: Option<State>,
    /// `expires_at` has passed by the database clock.
    pub expired: bool,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub extensions_used: i32,
    /// The reservation's original ttl (the default extension).
    pub ttl: Duration,
    /// A payment was recorded (by a Confirm, or a late payment being honoured).
    pub has_payment: bool,
    /// The reservation's one refund exists already.
    pub has_refund: bool,
    /// The decision is an Extend whose `request_id` is the last extension's applied.
    pub repeats_last_extend: bool,
}

/// What to do about a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Record `HELD -> to` (CONFIRMING, or CANCELLING ending in `release_outcome`).
    Transition {
        to: State,
        release_outcome: Option<State>,
    },
    /// The hold lapsed: record `HELD -> CANCELLING` ending `EXPIRED`, release, and tell a
    /// Confirm/Extend caller `HOLD_EXPIRED` (a Cancel caller gets the reservation).
    Expire,
    /// Push `expires_at` out by this much (state stays `HELD`).
    Extend { by: Duration },
    /// A payment after expiry while every hold is still in place: confirm them as they are
    /// (`HELD -> CONFIRMING`, `late_payment_honored`).
    HonorLate,
    /// A payment after every hold was released: record it and place the holds again, in order,
    /// as a new generation of branches; confirm if all are held, refund otherwise.
    Retake,
    /// Record the reservation's refund of the payment (and, with `expire`, release the lapsed
    /// holds); answer `answer` with the refund.
    Refund { expire: bool, answer: Refusal },
    /// Already decided this way: answer the reservation as it is.
    AlreadyDone,
    /// Refused; nothing changes.
    Refuse(Refusal),
}

/// Why a decision is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The hold lapsed before the decision.
    HoldExpired,
    /// The reservation is closed to this change.
    Closed,
    /// Holds are still being placed; nothing can be decided yet.
    NotHeld,
    /// Extend beyond `max_extensions` or `max_ttl`.
    ExtensionLimit,
    /// A late payment for this reservation is being honoured right now.
    InProgress,
}

/// Decides a holder's request against the reservation's current state.
pub fn decide(s: &Snapshot, decision: &Decision) -> Verdict {
    let released_by_expiry = s.state == State::Expired
        || (s.state == State::Cancelling && s.release_outcome == Some(State::Expired));
    match (s.state, decision) {
        // A repeat of an applied extension, whatever happened since: as it is.
        (_, Decision::Extend { .. }) if s.repeats_last_extend => Verdict::AlreadyDone,
        (State::Trying, _) => Verdict::Refuse(Refusal::NotHeld),
        (
            State::Held,
            Decision::Confirm {
                payment: Some(_),
                late_policy,
            },
        ) if s.expired => match late_policy {
            LatePaymentPolicy::HonorIfAvailable => Verdict::HonorLate,
            LatePaymentPolicy::Refund => Verdict::Refund {
                expire: true,
                answer: Refusal::HoldExpired,
            },
        },
        (State::Held, _) if s.expired => Verdict::Expire,

        (State::Held, Decision::Confirm { .. }) => Verdict::Transition {
            to: State::Confirming,
            release_outcome: None,
        },
        (State::Confirming | State::Confirmed, Decision::Confirm { .. }) => Verdict::AlreadyDone,
        (_, Decision::Confirm { payment: None, .. }) if released_by_expiry => {
            Verdict::Refuse(Refusal::HoldExpired)
        }
        (_, Decision::Confirm { payment: None, .. }) => Verdict::Refuse(Refusal::Closed),
        // From here on a payment came with the Confirm. One refund per reservation, ever: a
        // repeat answers the refund that exists.
        (_, Decision::Confirm { .. }) if s.has_refund => Verdict::Refuse(if released_by_expiry {
            Refusal::HoldExpired
        } else {
            Refusal::Closed
        }),
        (State::Expired, Decision::Confirm { .. }) if s.has_payment => {
            Verdict::Refuse(Refusal::InProgress)
        }
        (
            State::Expired,
            Decision::Confirm {
                late_policy: LatePaymentPolicy::HonorIfAvailable,
                ..
            },
        ) => Verdict::Retake,
        // Released by expiry (or being released): refund rather than race the release.
        (_, Decision::Confirm { .. }) if released_by_expiry => Verdict::Refund {
            expire: false,
            answer: Refusal::HoldExpired,
        },
        (_, Decision::Confirm { .. }) => Verdict::Refund {
            expire: false,
            answer: Refusal::Closed,
        },

        (State::Held, Decision::Cancel { .. }) => Verdict::Transition {
            to: State::Cancelling,
            release_outcome: Some(State::Cancelled),
        },
        // Released already (or being released): the holder's wish is met.
        (
            State::Cancelling | State::Cancelled | State::Expired | State::Rejected,
            Decision::Cancel { .. },
        ) => Verdict::AlreadyDone,
        (_, Decision::Cancel { .. }) => Verdict::Refuse(Refusal::Closed),

        (
            State::Held,
            Decision::Extend {
                by,
                max_extensions,
                max_ttl,
                ..
            },
        ) => {
            let by = by.unwrap_or(s.ttl);
            let total = (s.expires_at - s.created_at).to_std().unwrap_or_default() + by;
            if s.extensions_used >= *max_extensions || total > *max_ttl {
                Verdict::Refuse(Refusal::ExtensionLimit)
            } else {
                Verdict::Extend { by }
            }
        }
        (_, Decision::Extend { .. }) if released_by_expiry => Verdict::Refuse(Refusal::HoldExpired),
        (_, Decision::Extend { .. }) => Verdict::Refuse(Refusal::Closed),
    }
}

#[cfg(test)]
mod tests {
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
            repeats_last_extend: false,
        }
    }

    fn confirm() -> Decision {
        Decision::Confirm {
            payment: None,
            late_policy: LatePaymentPolicy::HonorIfAvailable,
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
        let mut retaking = snap(State::Expired, false);
        retaking.has_payment = true;
        assert_eq!(
            decide(&retaking, &paid(HonorIfAvailable)),
            Verdict::Refuse(Refusal::InProgress)
        );
        let mut refunded = snap(State::Expired, false);
        refunded.has_payment = true;
        refunded.has_refund = true;
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
        assert_eq!(
            decide(&snap(State::Confirmed, false), &paid(HonorIfAvailable)),
            Verdict::AlreadyDone
        );
    }

    fn extend() -> Decision {
        Decision::Extend {
            by: Some(Duration::from_secs(600)),
            max_extensions: 1,
            max_ttl: Duration::from_secs(3600),
            request_id: None,
        }
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
}
