//! Placing holds: Reserve records the reservation, then Tries one participant at a time in
//! canonical order, all-or-nothing; the first refusal or unknown outcome stops the fan-out and
//! releases what may be held.

use uuid::Uuid;

use super::{Coordinator, Error, entered};
use crate::domain::policy::LimitScope;
use crate::domain::validate::{self, RecordAs, ReserveInput};
use crate::domain::{Actor, BranchState, HoldToken, Rejection, Reservation, State, TryOutcome};
use crate::registry::CallError;
use crate::store::{BranchReport, Created};

/// The result of placing holds in order.
pub(super) struct Placement {
    pub(super) reports: Vec<BranchReport>,
    pub(super) failure: Option<PlacementFailure>,
}

/// Why placing stopped.
pub(super) struct PlacementFailure {
    pub(super) rejection: Rejection,
    /// Set when the participant could not be reached (outcome unknown).
    pub(super) unavailable: Option<String>,
}

/// A Reserve's answer: the reservation and, for its own principal, its hold token.
#[derive(Debug)]
pub struct Reserved {
    pub reservation: Reservation,
    /// `None` only for a repeat of a reservation whose token this coordinator cannot derive
    /// (issued before tokens were derived, or under a key it does not have).
    pub token: Option<HoldToken>,
}

impl Coordinator {
    /// Records a reservation for `actor` and places its holds, in canonical order,
    /// all-or-nothing. A repeat of the same request by the same principal answers the same
    /// reservation and token; other principals' reservations never collide with it.
    pub async fn reserve(&self, actor: &Actor, input: ReserveInput) -> Result<Reserved, Error> {
        let participants: Vec<String> = input.holds.iter().map(|h| h.participant.clone()).collect();
        let id = uuid::Uuid::now_v7();
        let (token, check) = self.tokens.issue(id);
        let record = RecordAs {
            id,
            owner: actor.principal.clone(),
            token: check,
        };
        let new = validate::reserve(input, &self.limits, record)?;
        for (i, name) in participants.iter().enumerate() {
            if self.registry.get(name).is_none() {
                return Err(Error::UnknownParticipant {
                    field: format!("holds[{i}].participant"),
                    name: name.clone(),
                });
            }
        }
        match self
            .store
            .create(&new, self.lease(), self.policy.hold_limits)
            .await?
        {
            Created::LimitReached(scope) => Err(Error::HoldLimit {
                holder: new.holder,
                limit: match scope {
                    LimitScope::Holder => self.policy.hold_limits.per_holder,
                    LimitScope::Total => self.policy.hold_limits.total,
                },
                scope,
            }),
            Created::Existing(existing) if new.same_body_as(&existing) => {
                let token = self.tokens.reissue(existing.id, &existing.token);
                if token.is_none() {
                    tracing::warn!(
                        reservation_id = %existing.id,
                        key_id = existing.token.key_id.as_deref().unwrap_or("none"),
                        "a repeated Reserve is answered without its hold token: the key that derived it is not configured here (--token-secret-file)"
                    );
                }
                Ok(Reserved {
                    reservation: existing,
                    token,
                })
            }
            Created::Existing(existing) => Err(Error::RequestIdReused {
                holder: new.holder,
                request_id: new.request_id,
                existing: existing.id,
            }),
            Created::New(created) => {
                entered(&created, State::Trying);
                Ok(Reserved {
                    reservation: self.place_holds(created).await?,
                    token: Some(token),
                })
            }
        }
    }

    /// Try, one participant at a time in canonical order; the first refusal or unknown outcome
    /// stops the fan-out. Renews the lease on a long placement.
    pub(super) async fn place_in_order(&self, r: &Reservation) -> Result<Placement, Error> {
        let groups = r.participant_branches();
        let mut reports = Vec::with_capacity(groups.len());
        let mut leased_at = std::time::Instant::now();
        for group in &groups {
            // A long placement keeps its lease, so no other instance releases it meanwhile.
            if leased_at.elapsed() > self.policy.lease / 2 {
                self.store.renew_lease(r.id, self.lease()).await?;
                leased_at = std::time::Instant::now();
            }
            let first_resource = group
                .holds
                .first()
                .map(|h| h.resource.clone())
                .unwrap_or_default();
            let outcome = match self.registry.require(&group.participant) {
                Ok(p) => {
                    p.try_hold(r.id, group.branch_id, &r.holder, &group.holds, r.expires_at)
                        .await
                }
                // The rejection already names the participant; this wording predates `require`
                // and is what clients see in `rejection.reason`.
                Err(e) => Err(CallError {
                    message: "participant is no longer registered".into(),
                    ..e
                }),
            };
            let (report, failure) = match outcome {
                Ok(TryOutcome::Held) => (
                    BranchReport {
                        branch_id: group.branch_id,
                        state: BranchState::Held,
                        error: None,
                    },
                    None,
                ),
                Ok(TryOutcome::Rejected { reason }) => (
                    BranchReport {
                        branch_id: group.branch_id,
                        state: BranchState::Rejected,
                        error: None,
                    },
                    Some(PlacementFailure {
                        rejection: Rejection {
                            participant: group.participant.clone(),
                            resource: first_resource,
                            reason,
                        },
                        unavailable: None,
                    }),
                ),
                Err(e) => {
                    // Outcome unknown (or refused outright): stays PENDING with one attempt,
                    // so the release cancels it too.
                    tracing::warn!(reservation_id = %r.id, participant = %group.participant, error = %e, "try failed");
                    (
                        BranchReport {
                            branch_id: group.branch_id,
                            state: BranchState::Pending,
                            error: Some(e.message.clone()),
                        },
                        Some(PlacementFailure {
                            rejection: Rejection {
                                participant: group.participant.clone(),
                                resource: first_resource,
                                reason: if e.refused {
                                    e.message.clone()
                                } else {
                                    format!("participant unavailable: {}", e.message)
                                },
                            },
                            unavailable: (!e.refused).then_some(e.message),
                        }),
                    )
                }
            };
            reports.push(report);
            if let Some(failure) = failure {
                return Ok(Placement {
                    reports,
                    failure: Some(failure),
                });
            }
        }
        Ok(Placement {
            reports,
            failure: None,
        })
    }

    /// Places a new reservation's holds; all held -> HELD, else released and REJECTED.
    async fn place_holds(&self, r: Reservation) -> Result<Reservation, Error> {
        let placement = self.place_in_order(&r).await?;
        let Some(failure) = placement.failure else {
            let held = self.store.record_held(r.id, &placement.reports).await?;
            entered(&held, State::Held);
            return Ok(held);
        };
        let released = self
            .abort_placement(r.id, &failure.rejection, &placement.reports)
            .await?;
        Err(match failure.unavailable {
            Some(detail) => Error::ParticipantUnavailable {
                reservation_id: r.id,
                participant: failure.rejection.participant,
                detail,
            },
            None => Error::InsufficientCapacity {
                reservation: Box::new(released),
                rejection: failure.rejection,
            },
        })
    }

    /// Records the rejection (the reservation is CANCELLING, ending REJECTED) and releases
    /// every branch that may hold something.
    async fn abort_placement(
        &self,
        id: Uuid,
        rejection: &Rejection,
        reports: &[BranchReport],
    ) -> Result<Reservation, Error> {
        let recorded = self
            .store
            .record_rejected(id, Some(rejection), reports)
            .await?;
        entered(&recorded, State::Cancelling);
        self.drive_release(recorded).await
    }
}
