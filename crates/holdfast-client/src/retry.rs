//! When [`crate::Client::reserve`] tries again: only while the coordinator is unavailable
//! (down, restarting, shutting down, shedding load, the connection dropped under the call) - never after an answer about the
//! reservation itself, and not for `PARTICIPANT_UNAVAILABLE`, which is a recorded outcome a
//! repeat would only read back. The repeat carries the same `request_id`, so the coordinator
//! answers the reservation it already made instead of making a second one.

use std::time::Duration;

use tonic::Code;

use crate::{Error, Reason};

/// Exponential backoff with full jitter, capped; the server's RetryInfo wins when it asks for
/// longer.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0: never retry).
    pub max_retries: u32,
    /// The backoff before the first retry (doubled each time).
    pub initial: Duration,
    /// The largest backoff.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(3),
        }
    }
}

impl RetryPolicy {
    /// Never retry.
    pub fn never() -> RetryPolicy {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    /// How long to wait before retry number `attempt + 1` after `error`, or `None` to give up.
    pub fn delay(&self, attempt: u32, error: &Error) -> Option<Duration> {
        if attempt >= self.max_retries || !retryable(error) {
            return None;
        }
        let ceiling = self
            .initial
            .saturating_mul(2u32.saturating_pow(attempt))
            .min(self.max);
        let jittered = ceiling.mul_f64(fastrand::f64());
        Some(match error.retry_after() {
            Some(asked) => asked.max(jittered),
            None => jittered,
        })
    }
}

fn retryable(error: &Error) -> bool {
    match error.code() {
        Code::Unavailable => *error.reason() != Reason::ParticipantUnavailable,
        // A connection dropped under the call (hyper says "operation was canceled"): the
        // caller did not cancel, and the repeat is idempotent.
        Code::Cancelled => *error.reason() == Reason::Unspecified,
        // Shed before any work; the server says how long to wait.
        Code::ResourceExhausted => *error.reason() == Reason::Overloaded,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(reason: Reason, retry_after: Option<Duration>) -> Error {
        Error::for_test(Code::Unavailable, reason, retry_after)
    }

    #[test]
    fn backs_off_within_a_doubling_capped_ceiling_and_gives_up() {
        let p = RetryPolicy {
            max_retries: 6,
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        };
        let e = unavailable(Reason::Unspecified, None);
        for (attempt, ceiling) in [(0, 100), (1, 200), (2, 400), (3, 500), (5, 500)] {
            for _ in 0..50 {
                let d = p.delay(attempt, &e).unwrap();
                assert!(d <= Duration::from_millis(ceiling), "{attempt}: {d:?}");
            }
        }
        assert_eq!(p.delay(6, &e), None);
    }

    #[test]
    fn honours_retry_info_and_never_retries_an_answer() {
        let p = RetryPolicy::default();
        let asked = unavailable(Reason::ShuttingDown, Some(Duration::from_secs(2)));
        assert!(p.delay(0, &asked).unwrap() >= Duration::from_secs(2));
        let recorded = unavailable(Reason::ParticipantUnavailable, None);
        assert_eq!(p.delay(0, &recorded), None);
        let answer = Error::for_test(Code::FailedPrecondition, Reason::InsufficientCapacity, None);
        let shed = Error::for_test(
            Code::ResourceExhausted,
            Reason::Overloaded,
            Some(Duration::from_millis(250)),
        );
        assert!(p.delay(0, &shed).unwrap() >= Duration::from_millis(250));
        let limit = Error::for_test(Code::ResourceExhausted, Reason::HoldLimitExceeded, None);
        assert_eq!(p.delay(0, &limit), None);
        assert_eq!(p.delay(0, &answer), None);
        assert_eq!(
            RetryPolicy::never().delay(0, &unavailable(Reason::Unspecified, None)),
            None
        );
    }
}
