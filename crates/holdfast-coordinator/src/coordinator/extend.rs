//! Extend: a held reservation's deadline pushed out. Unlike Confirm and Cancel, participants
//! hear of it *before* it is recorded: a participant reclaims a hold on its own after the
//! deadline it was told + its orphan grace, so a deadline recorded first and told late (or
//! never) could be reclaimed under a reservation that reads `HELD`. Told first, the worst case
//! of a failure between the two steps is a participant holding longer than the coordinator's
//! record, which the coordinator still releases at its own deadline.
//!
//! The store judges first (token, state, limits: `Verdict::TellParticipants` with the new
//! deadline, nothing written); every participant is told that deadline in parallel
//! (`Participant/Extend`, idempotent, forward only); then the store judges again with
//! `told_until` and records the extension only if the deadline it would write is one the
//! participants hold to.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;

use super::{Coordinator, Error};
use crate::domain::validate::{self, FieldError, RequestId};
use crate::domain::{
    Actor, BranchOutcome, BranchState, Decision, PresentedToken, Reservation, Verdict,
};
use crate::registry::ExtendOutcome;
use uuid::Uuid;

/// How many deadlines one Extend tells at most: the deadline to tell changes only when another
/// Extend of the reservation was recorded meanwhile (or a participant answered that it no
/// longer holds, which is judged once more).
const MAX_ROUNDS: usize = 3;

/// A participant that no longer holds a branch of the reservation.
struct NotHeld {
    participant: String,
    outcome: BranchOutcome,
}

impl Coordinator {
    /// Pushes `expires_at` of a held reservation out by `ttl` (default: its original ttl),
    /// after every participant has moved its hold's deadline there. With a `request_id`, a
    /// repeat of the last applied extension answers the reservation as it is rather than
    /// extending again. A participant that cannot be told: `ExtendUnavailable`, nothing
    /// recorded (participants told already hold longer, harmlessly).
    pub async fn extend(
        &self,
        actor: &Actor,
        id: Uuid,
        token: &PresentedToken,
        ttl: Option<Duration>,
        request_id: Option<RequestId>,
    ) -> Result<Reservation, Error> {
        let by = match ttl {
            Some(t) => Some(validate::ttl("ttl", t, &self.limits)?),
            None => None,
        };
        // Without a ttl the reservation's original one applies (judged under the row lock).
        let mut decision = Decision::Extend {
            by,
            max_extensions: self.policy.max_extensions,
            max_ttl: self.limits.max_ttl,
            request_id,
            told_until: None,
        };
        let mut not_held: Option<NotHeld> = None;
        for _ in 0..MAX_ROUNDS {
            let (verdict, r) = self.decide(actor, id, token, &decision).await?;
            let until = match verdict {
                Verdict::TellParticipants { until } => until,
                Verdict::Extend { .. } | Verdict::AlreadyDone => return Ok(r),
                Verdict::Expire => {
                    self.drive_release(r).await?;
                    return Err(Error::HoldExpired { id, refund: None });
                }
                Verdict::Refuse(refusal) => return Err(self.refusal(refusal, &r)),
                other => return Err(Error::Internal(format!("extend judged as {other:?}"))),
            };
            if let Some(lost) = not_held {
                // Judged again, the reservation is still HELD, yet a participant does not hold
                // its branch: the hold is gone there and cannot be extended.
                tracing::error!(
                    reservation_id = %id,
                    participant = %lost.participant,
                    answer = ?lost.outcome,
                    "a participant no longer holds a branch of a HELD reservation; not extended"
                );
                return Err(Error::HoldExpired { id, refund: None });
            }
            let told = match self.tell_extension(&r, until).await? {
                Ok(()) => Some(until),
                // A Confirm or Cancel may have been decided meanwhile: judge again untold.
                Err(lost) => {
                    not_held = Some(lost);
                    None
                }
            };
            if let Decision::Extend { told_until, .. } = &mut decision {
                *told_until = told;
            }
        }
        Err(Error::Internal(format!(
            "the deadline of reservation {id} kept moving while Extend told its participants"
        )))
    }

    /// Tells every participant holding a branch of `r` the new deadline `until`, in parallel.
    /// `Ok(Ok(()))`: every one holds to it. `Ok(Err(_))`: one answered that it no longer holds
    /// the branch. `Err`: one could not be told (`ExtendUnavailable`) or refused the deadline
    /// (`InvalidArgument` naming `ttl`); nothing of the reservation was recorded.
    async fn tell_extension(
        &self,
        r: &Reservation,
        until: DateTime<Utc>,
    ) -> Result<Result<(), NotHeld>, Error> {
        let branches: Vec<_> = r
            .participant_branches()
            .into_iter()
            .filter(|b| b.state == BranchState::Held)
            .collect();
        let calls = branches.iter().map(|b| async move {
            let answer = match self.registry.require(&b.participant) {
                Ok(p) => p.extend(r.id, b.branch_id, until).await,
                Err(e) => Err(e),
            };
            (b, answer)
        });
        let mut not_held = None;
        for (b, answer) in join_all(calls).await {
            match answer {
                Ok(ExtendOutcome::Held) => {}
                Ok(ExtendOutcome::Settled(outcome)) => {
                    not_held.get_or_insert(NotHeld {
                        participant: b.participant.clone(),
                        outcome,
                    });
                }
                Ok(ExtendOutcome::Invalid { field, problem }) => {
                    let theirs = field.map_or(String::new(), |f| format!(" (its {f})"));
                    return Err(Error::InvalidArgument(FieldError::new(
                        "ttl",
                        format!(
                            "{problem}; participant {:?} refused the extension{theirs}",
                            b.participant
                        ),
                    )));
                }
                Err(e) => {
                    tracing::warn!(reservation_id = %r.id, participant = %b.participant, error = %e, "extend not told");
                    return Err(Error::ExtendUnavailable {
                        id: r.id,
                        participant: b.participant.clone(),
                        detail: e.message,
                    });
                }
            }
        }
        Ok(not_held.map_or(Ok(()), Err))
    }
}
