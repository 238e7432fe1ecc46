//! The lifecycle rules: which decision is allowed from which state.
//!
//! The store evaluates [`decide`] while it holds the reservation's row lock, then applies the
//! verdict with a conditional UPDATE whose row count confirms it; so this table is the one
//! place that says what Confirm, Cancel and Extend may do.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::State;

/// What a holder asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Confirm,
    Cancel {
        reason: Option<String>,
    },
    Extend {
        by: Duration,
        max_extensions: i32,
        max_ttl: Duration,
    },
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
}

/// Decides a holder's request against the reservation's current state.
pub fn decide(s: &Snapshot, decision: &Decision) -> Verdict {
    let released_by_expiry = s.state == State::Expired
        || (s.state == State::Cancelling && s.release_outcome == Some(State::Expired));
    match (s.state, decision) {
        (State::Trying, _) => Verdict::Refuse(Refusal::NotHeld),
        (State::Held, _) if s.expired => Verdict::Expire,

        (State::Held, Decision::Confirm) => Verdict::Transition {
            to: State::Confirming,
            release_outcome: None,
        },
        (State::Confirming | State::Confirmed, Decision::Confirm) => Verdict::AlreadyDone,
        (_, Decision::Confirm) if released_by_expiry => Verdict::Refuse(Refusal::HoldExpired),
        (_, Decision::Confirm) => Verdict::Refuse(Refusal::Closed),

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
            },
        ) => {
            let total = (s.expires_at - s.created_at).to_std().unwrap_or_default() + *by;
            if s.extensions_used >= *max_extensions || total > *max_ttl {
                Verdict::Refuse(Refusal::ExtensionLimit)
            } else {
                Verdict::Extend { by: *by }
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
        }
    }

    fn extend() -> Decision {
        Decision::Extend {
            by: Duration::from_secs(600),
            max_extensions: 1,
            max_ttl: Duration::from_secs(3600),
        }
    }

    #[test]
    fn confirm_only_from_unexpired_held() {
        assert_eq!(
            decide(&snap(State::Held, false), &Decision::Confirm),
            Verdict::Transition {
                to: State::Confirming,
                release_outcome: None
            }
        );
        assert_eq!(
            decide(&snap(State::Held, true), &Decision::Confirm),
            Verdict::Expire
        );
        for st in [State::Confirming, State::Confirmed] {
            assert_eq!(
                decide(&snap(st, false), &Decision::Confirm),
                Verdict::AlreadyDone
            );
        }
        for st in [
            State::Cancelling,
            State::Cancelled,
            State::Rejected,
            State::Failed,
        ] {
            assert_eq!(
                decide(&snap(st, false), &Decision::Confirm),
                Verdict::Refuse(Refusal::Closed)
            );
        }
        assert_eq!(
            decide(&snap(State::Expired, false), &Decision::Confirm),
            Verdict::Refuse(Refusal::HoldExpired)
        );
        assert_eq!(
            decide(&snap(State::Trying, false), &Decision::Confirm),
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
        let mut used = snap(State::Held, false);
        used.extensions_used = 1;
        assert_eq!(
            decide(&used, &extend()),
            Verdict::Refuse(Refusal::ExtensionLimit)
        );
        let too_long = Decision::Extend {
            by: Duration::from_secs(3001),
            max_extensions: 5,
            max_ttl: Duration::from_secs(3600),
        };
        assert_eq!(
            decide(&snap(State::Held, false), &too_long),
            Verdict::Refuse(Refusal::ExtensionLimit)
        );
        assert_eq!(decide(&snap(State::Held, true), &extend()), Verdict::Expire);
        assert_eq!(
            decide(&snap(State::Confirmed, false), &extend()),
            Verdict::Refuse(Refusal::Closed)
        );
    }
}
