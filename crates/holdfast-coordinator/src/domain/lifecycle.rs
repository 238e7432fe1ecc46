//! The lifecycle rules: which decision is allowed from which state.
//!
//! The store evaluates [`decide`] while it holds the reservation's row lock, then applies the
//! verdict with a conditional UPDATE whose row count confirms it; so this table is the one
//! place that says what Confirm, Cancel and Extend may do.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::validate::RequestId;
use super::{LatePaymentPolicy, Payment, State};

/// What a holder asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Confirm {
        payment: Option<Payment>,
        late_policy: LatePaymentPolicy,
        /// The payment was checked with its payments service (`Payments/GetPayment`). A verdict
        /// that would record an unchecked payment is [`Verdict::VerifyPayment`] instead.
        payment_verified: bool,
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
        request_id: Option<RequestId>,
        /// The deadline every participant has confirmed it now holds the branches to
        /// (`Participant/Extend`); `None` before they were told. An extension is recorded only
        /// when this reaches its new `expires_at`; otherwise the verdict is
        /// [`Verdict::TellParticipants`] and nothing changes.
        told_until: Option<DateTime<Utc>>,
    },
}

impl Decision {
    /// The idempotency key of an Extend, if it has one.
    pub fn extend_request_id(&self) -> Option<&RequestId> {
        match self {
            Decision::Extend { request_id, .. } => request_id.as_ref(),
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
    /// The Confirm's payment is the one recorded already (same participant and payment_ref).
    pub same_payment: bool,
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
    /// Push `expires_at` out by this much (state stays `HELD`); every participant holds to
    /// the new deadline already.
    Extend { by: Duration },
    /// An extension the participants have not been told of: nothing changes; tell every
    /// participant the new deadline `until`, then decide again with `told_until`.
    TellParticipants { until: DateTime<Utc> },
    /// A payment after expiry while every hold is still in place: confirm them as they are
    /// (`HELD -> CONFIRMING`, `late_payment_honored`).
    HonorLate,
    /// A payment after every hold was released: record it and place the holds again, in order,
    /// as a new generation of branches; confirm if all are held, refund otherwise.
    Retake,
    /// Record the reservation's refund of the payment (and, with `expire`, release the lapsed
    /// holds); answer `answer` with the refund.
    Refund { expire: bool, answer: Refusal },
    /// A payment other than the one recorded, on a reservation whose payment is settled
    /// (confirmed, or refunded): record it as an [`super::ExtraPayment`] and refund it; answer
    /// `answer` with that refund.
    RefundExtra { answer: Refusal },
    /// The decision would record a payment not yet checked with its payments service: nothing
    /// changes; check it, then decide again with `payment_verified`.
    VerifyPayment,
    /// A Cancel of a `QUEUED` reservation: nothing is held, so `QUEUED -> CANCELLED` at once
    /// (it leaves its queues); nothing to drive.
    LeaveQueue,
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

impl Verdict {
    /// Whether applying the verdict records the Confirm's payment (so it must be verified).
    pub fn records_payment(&self) -> bool {
        matches!(
            self,
            Verdict::Transition {
                to: State::Confirming,
                ..
            } | Verdict::HonorLate
                | Verdict::Retake
                | Verdict::Refund { .. }
                | Verdict::RefundExtra { .. }
        )
    }
}

/// Decides a holder's request against the reservation's current state. A payment is recorded
/// only once verified: until then a verdict that would record it is [`Verdict::VerifyPayment`].
/// An extension is recorded only once every participant holds to its new deadline: until
/// then it is [`Verdict::TellParticipants`].
pub fn decide(s: &Snapshot, decision: &Decision) -> Verdict {
    let verdict = judge(s, decision);
    match (decision, verdict) {
        (
            Decision::Confirm {
                payment: Some(_),
                payment_verified: false,
                ..
            },
            verdict,
        ) if verdict.records_payment() => Verdict::VerifyPayment,
        (Decision::Extend { told_until, .. }, Verdict::Extend { by }) => {
            let until = chrono::Duration::from_std(by)
                .ok()
                .and_then(|by| s.expires_at.checked_add_signed(by));
            match until {
                None => Verdict::Refuse(Refusal::ExtensionLimit),
                Some(until) if told_until.is_some_and(|told| told >= until) => {
                    Verdict::Extend { by }
                }
                Some(until) => Verdict::TellParticipants { until },
            }
        }
        (_, verdict) => verdict,
    }
}

fn judge(s: &Snapshot, decision: &Decision) -> Verdict {
    match decision {
        // A repeat of an applied extension, whatever happened since: as it is.
        Decision::Extend { .. } if s.repeats_last_extend => Verdict::AlreadyDone,
        Decision::Cancel { .. } if s.state == State::Queued => Verdict::LeaveQueue,
        // Not held (yet): holds being placed, waiting in a queue, or a failed offer releasing
        // what it placed on its way back to the queue.
        _ if s.state == State::Trying
            || s.state == State::Queued
            || (s.state == State::Cancelling && s.release_outcome == Some(State::Queued)) =>
        {
            Verdict::Refuse(Refusal::NotHeld)
        }
        Decision::Confirm {
            payment,
            late_policy,
            ..
        } => match payment {
            Some(_) => judge_paid_confirm(s, *late_policy),
            None => judge_unpaid_confirm(s),
        },
        Decision::Cancel { .. } => judge_cancel(s),
        Decision::Extend {
            by,
            max_extensions,
            max_ttl,
            ..
        } => judge_extend(s, *by, *max_extensions, *max_ttl),
    }
}

/// Whether the reservation was (or is being) released because its hold expired.
fn released_by_expiry(s: &Snapshot) -> bool {
    s.state == State::Expired
        || (s.state == State::Cancelling && s.release_outcome == Some(State::Expired))
}

/// The refusal of a closed reservation: expired, or closed otherwise.
fn closed(s: &Snapshot) -> Refusal {
    if released_by_expiry(s) {
        Refusal::HoldExpired
    } else {
        Refusal::Closed
    }
}

/// A Confirm without a payment.
fn judge_unpaid_confirm(s: &Snapshot) -> Verdict {
    match s.state {
        State::Held if s.expired => Verdict::Expire,
        State::Held => Verdict::Transition {
            to: State::Confirming,
            release_outcome: None,
        },
        State::Confirming | State::Confirmed => Verdict::AlreadyDone,
        _ => Verdict::Refuse(closed(s)),
    }
}

/// A Confirm with a payment.
fn judge_paid_confirm(s: &Snapshot, late_policy: LatePaymentPolicy) -> Verdict {
    match s.state {
        State::Held if s.expired => match late_policy {
            LatePaymentPolicy::HonorIfAvailable => Verdict::HonorLate,
            LatePaymentPolicy::Refund => Verdict::Refund {
                expire: true,
                answer: Refusal::HoldExpired,
            },
        },
        State::Held => Verdict::Transition {
            to: State::Confirming,
            release_outcome: None,
        },
        // A payment other than the one it was confirmed with (or without): refunded, never
        // dropped.
        State::Confirming | State::Confirmed if !s.same_payment => Verdict::RefundExtra {
            answer: Refusal::Closed,
        },
        State::Confirming | State::Confirmed => Verdict::AlreadyDone,
        // A late payment being honoured: wait - and another payment than that one is
        // recorded and refunded all the same (it is not applied whatever the retake's
        // outcome), so no client needs to call again.
        State::Expired if s.has_payment && !s.has_refund => {
            if s.same_payment {
                Verdict::Refuse(Refusal::InProgress)
            } else {
                Verdict::RefundExtra {
                    answer: Refusal::InProgress,
                }
            }
        }
        // One refund per reservation's payment, ever: a repeat answers the refund that exists;
        // a different payment is refunded on its own.
        _ if s.has_payment && !s.same_payment => Verdict::RefundExtra { answer: closed(s) },
        _ if s.has_refund => Verdict::Refuse(closed(s)),
        State::Expired if late_policy == LatePaymentPolicy::HonorIfAvailable => Verdict::Retake,
        // Released by expiry (or being released): refund rather than race the release.
        _ => Verdict::Refund {
            expire: false,
            answer: closed(s),
        },
    }
}

fn judge_cancel(s: &Snapshot) -> Verdict {
    match s.state {
        State::Held if s.expired => Verdict::Expire,
        State::Held => Verdict::Transition {
            to: State::Cancelling,
            release_outcome: Some(State::Cancelled),
        },
        // Released already (or being released): the holder's wish is met.
        State::Cancelling | State::Cancelled | State::Expired | State::Rejected => {
            Verdict::AlreadyDone
        }
        _ => Verdict::Refuse(Refusal::Closed),
    }
}

fn judge_extend(
    s: &Snapshot,
    by: Option<Duration>,
    max_extensions: i32,
    max_ttl: Duration,
) -> Verdict {
    match s.state {
        State::Held if s.expired => Verdict::Expire,
        State::Held => {
            let by = by.unwrap_or(s.ttl);
            let total = (s.expires_at - s.created_at).to_std().unwrap_or_default() + by;
            if s.extensions_used >= max_extensions || total > max_ttl {
                Verdict::Refuse(Refusal::ExtensionLimit)
            } else {
                Verdict::Extend { by }
            }
        }
        _ => Verdict::Refuse(closed(s)),
    }
}

#[cfg(test)]
mod tests;
