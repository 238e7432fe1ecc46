//! Placing holds: Reserve records the reservation, then Tries one participant at a time in
//! canonical order, all-or-nothing; the first refusal or unknown outcome stops the fan-out and
//! releases what may be held. A hold a participant finds malformed (`INVALID_ARGUMENT` from
//! its Try) is the caller's mistake: what was placed is released and the reservation is
//! discarded, so nothing of the request stays recorded (see `discard_invalid`). Once a Reserve
//! is validated, recording and placing run in a task of their own: the caller going away
//! does not stop them half way.

use std::time::Duration;

use tracing::Instrument;
use uuid::Uuid;

use super::waitlist::refused_holds;
use super::{Coordinator, Error, entered, faults};
use crate::domain::policy::LimitScope;
use crate::domain::validate::{self, FieldError, RecordAs, ReserveInput};
use crate::domain::{
    Actor, BranchState, Hold, HoldToken, NewReservation, ParticipantBranch, Rejection, Reservation,
    State, TryOutcome,
};
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
    /// Set when the participant found the request malformed and applied nothing.
    pub(super) invalid: Option<InvalidHold>,
}

/// A participant's `INVALID_ARGUMENT` answer to a Try, and where its holds sit.
pub(super) struct InvalidHold {
    /// The field the participant named, in its terms (`items[1].quantity`, `expires_at`).
    field: Option<String>,
    problem: String,
    participant: String,
    /// Canonical position (in the reservation's holds) of the group's first hold.
    first: usize,
}

impl InvalidHold {
    /// The field as the Reserve caller named it: `items[k].x` of this Try is `holds[j].x`,
    /// `j` the caller's index of the group's `k`-th hold (`order` maps canonical positions to
    /// the caller's indexes); `expires_at` comes from `ttl`, `holder` is `holder`; any other
    /// field (or none) is the group's first hold.
    fn caller_error(&self, order: &[usize]) -> FieldError {
        let index = |k: usize| order.get(self.first + k).copied().unwrap_or(self.first);
        let (field, theirs) = match self.field.as_deref() {
            Some("holder") => ("holder".to_owned(), None),
            Some(f) => match item_path(f) {
                Some((k, rest)) => (format!("holds[{}]{rest}", index(k)), None),
                None if f == "expires_at" => ("ttl".to_owned(), Some(f)),
                None => (format!("holds[{}]", index(0)), Some(f)),
            },
            None => (format!("holds[{}]", index(0)), None),
        };
        let theirs = theirs.map_or(String::new(), |f| format!(" (its {f})"));
        FieldError::new(
            field,
            format!(
                "{}; participant {:?} refused the hold{theirs}",
                self.problem, self.participant
            ),
        )
    }
}

/// `items[3].quantity` -> `(3, ".quantity")`.
fn item_path(field: &str) -> Option<(usize, &str)> {
    let rest = field.strip_prefix("items[")?;
    let (k, rest) = rest.split_once(']')?;
    Some((k.parse().ok()?, rest))
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
        // The caller's index of each hold in canonical order (validation sorts them alike),
        // to name a field a participant refuses as the caller wrote it.
        let mut order: Vec<usize> = (0..input.holds.len()).collect();
        order.sort_by(|&a, &b| {
            input.holds[a]
                .canonical_key()
                .cmp(&input.holds[b].canonical_key())
        });
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
        // A resource with a waitlist is not got ahead of, and a hold a participant refused
        // moments ago, with no unit released since, is refused again: either way without a
        // Try. Without `queue` the Reserve is refused before anything is recorded; with it,
        // the reservation joins the queue. A repeat of a recorded request answers its
        // reservation as always (`sold_out`, `waitlist`).
        let mut join_now = None;
        let (probe, refused) = match self.admit(&new.holds).await {
            Ok(probe) => (probe, None),
            Err(refused) => (None, Some(refused)),
        };
        if let Some((hit, refused)) = refused
            && !self
                .store
                .request_recorded(&new.owner, &new.holder, &new.request_id)
                .await?
        {
            if new.queue_wait.is_none() {
                crate::telemetry::sold_out_refused(&hit.participant);
                return Err(Error::SoldOut(hit));
            }
            join_now = Some(refused);
        }
        // From here the caller may go away (its deadline passes, its connection drops) at any
        // point: recording and placing run in a task of their own that the handler only
        // awaits, so the reservation still ends HELD or REJECTED (never TRYING for the sweep,
        // with Cancel tombstones at every participant), and a repeat answers that outcome.
        // A probe of lapsed sold-out hints ends with the placement (`sold_out`).
        let this = self.clone();
        tokio::spawn(
            async move {
                let placed = this.record_and_place(new, token, order, join_now).await;
                drop(probe);
                placed
            }
            .instrument(tracing::Span::current()),
        )
        .await
        .map_err(|e| Error::Internal(format!("placing reservation {id} failed: {e}")))?
    }

    /// Records the validated reservation (or finds the request's earlier one) and places its
    /// holds; the rest of [`Coordinator::reserve`], run to its end whatever the caller does.
    async fn record_and_place(
        &self,
        new: NewReservation,
        token: HoldToken,
        order: Vec<usize>,
        join_now: Option<Vec<Hold>>,
    ) -> Result<Reserved, Error> {
        let wait = new.queue_wait;
        faults::store("coord.create.before")?;
        let created = self
            .store
            .create(&new, self.lease(), self.policy.hold_limits)
            .await?;
        faults::store("coord.create.after")?;
        match created {
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
                    reservation: self.with_queue(existing).await?,
                    token,
                })
            }
            Created::Existing(existing) => Err(Error::RequestIdReused {
                holder: new.holder,
                request_id: new.request_id.into_string(),
                existing: existing.id,
            }),
            Created::New(created) => {
                entered(&created, State::Trying);
                let reservation = match (join_now, wait) {
                    (Some(refused), Some(wait)) => {
                        let queued = self.join_queue(&created, &refused, &[], wait).await?;
                        self.with_queue(queued).await?
                    }
                    _ => self.place_holds(created, &order, wait).await?,
                };
                Ok(Reserved {
                    reservation,
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
        let mut first = 0;
        for group in &groups {
            // A long placement keeps its lease, so no other instance releases it meanwhile;
            // one that lost it (another instance took the reservation over and releases it)
            // stops. Checked before each Try and after the last (a release may follow).
            self.keep_lease(r.id, &mut leased_at, &group.participant)
                .await?;
            let epoch = self.sold_out.epoch(&group.participant);
            let outcome = self.try_group(r, group).await;
            let (report, failure) = self.judge_try(r, group, outcome, epoch, first);
            if groups
                .last()
                .is_some_and(|g| g.branch_id == group.branch_id)
                || failure.is_some()
            {
                self.keep_lease(r.id, &mut leased_at, &group.participant)
                    .await?;
            }
            reports.push(report);
            first += group.holds.len();
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

    /// One participant's Try of its holds in `r`, through the failpoints around it.
    async fn try_group(
        &self,
        r: &Reservation,
        group: &ParticipantBranch,
    ) -> Result<TryOutcome, CallError> {
        match self.registry.require(&group.participant) {
            Ok(p) => match faults::call("coord.try.before") {
                Some(e) => Err(e),
                None => p
                    .try_hold(r.id, group.branch_id, &r.holder, &group.holds, r.expires_at)
                    .await
                    .and_then(|o| faults::call("coord.try.after").map_or(Ok(o), Err)),
            },
            // The rejection already names the participant; this wording is what clients see
            // in `rejection.reason`.
            Err(e) => Err(CallError {
                message: "participant is no longer registered".into(),
                ..e
            }),
        }
    }

    /// What one Try's outcome makes of its branch, and why placement stops, if it does.
    fn judge_try(
        &self,
        r: &Reservation,
        group: &ParticipantBranch,
        outcome: Result<TryOutcome, CallError>,
        epoch: u64,
        first: usize,
    ) -> (BranchReport, Option<PlacementFailure>) {
        let report = |state, error| BranchReport {
            branch_id: group.branch_id,
            state,
            error,
        };
        let rejection = |reason| Rejection {
            participant: group.participant.clone(),
            resource: group
                .holds
                .first()
                .map(|h| h.resource.clone())
                .unwrap_or_default(),
            reason,
        };
        match outcome {
            Ok(TryOutcome::Held) => (report(BranchState::Held, None), None),
            Ok(TryOutcome::Rejected { reason }) => {
                // A refusal of one hold is remembered: the same hold is refused without a
                // write until a unit comes back (`sold_out`).
                if let [only] = group.holds.as_slice() {
                    self.sold_out.refused(only, &reason, epoch);
                }
                let failure = PlacementFailure {
                    rejection: rejection(reason),
                    unavailable: None,
                    invalid: None,
                };
                (report(BranchState::Rejected, None), Some(failure))
            }
            // Nothing applied: like a rejection, it needs no release.
            Ok(TryOutcome::Invalid { field, problem }) => {
                let reason = match &field {
                    Some(f) => format!("invalid request: {f} {problem}"),
                    None => format!("invalid request: {problem}"),
                };
                let failure = PlacementFailure {
                    rejection: rejection(reason),
                    unavailable: None,
                    invalid: Some(InvalidHold {
                        field,
                        problem,
                        participant: group.participant.clone(),
                        first,
                    }),
                };
                (report(BranchState::Rejected, None), Some(failure))
            }
            Err(e) => {
                // Outcome unknown (or refused outright): stays PENDING with one attempt, so
                // the release cancels it too.
                tracing::warn!(reservation_id = %r.id, participant = %group.participant, error = %e, "try failed");
                let reason = if e.refused {
                    e.message.clone()
                } else {
                    format!("participant unavailable: {}", e.message)
                };
                let failure = PlacementFailure {
                    rejection: rejection(reason),
                    unavailable: (!e.refused).then(|| e.message.clone()),
                    invalid: None,
                };
                (report(BranchState::Pending, Some(e.message)), Some(failure))
            }
        }
    }

    /// Renews the placer's lease on `id` once half of it has passed since `leased_at`; a
    /// placer that lost it stops (the reservation is another instance's to release now).
    async fn keep_lease(
        &self,
        id: Uuid,
        leased_at: &mut std::time::Instant,
        participant: &str,
    ) -> Result<(), Error> {
        if leased_at.elapsed() <= self.policy.lease / 2 {
            return Ok(());
        }
        if !self.store.renew_lease(id, self.lease()).await? {
            tracing::warn!(reservation_id = %id, "lost the lease while placing holds; another instance releases them");
            return Err(Error::ParticipantUnavailable {
                reservation_id: id,
                participant: participant.to_owned(),
                detail: "this coordinator lost the reservation while placing its holds; \
                         another instance releases them"
                    .into(),
            });
        }
        *leased_at = std::time::Instant::now();
        Ok(())
    }

    /// Places a new reservation's holds; all held -> HELD, else released and REJECTED (or,
    /// for a hold a participant found malformed, released and discarded). `order` maps
    /// canonical positions to the caller's hold indexes.
    async fn place_holds(
        &self,
        r: Reservation,
        order: &[usize],
        wait: Option<Duration>,
    ) -> Result<Reservation, Error> {
        let placement = self.place_in_order(&r).await?;
        let Some(failure) = placement.failure else {
            faults::store("coord.record_held.before")?;
            let held = self.store.record_held(r.id, &placement.reports).await?;
            faults::store("coord.record_held.after")?;
            entered(&held, State::Held);
            return Ok(held);
        };
        if let Some(invalid) = &failure.invalid {
            self.discard_invalid(r.id, &failure.rejection, &placement.reports)
                .await?;
            return Err(Error::InvalidArgument(invalid.caller_error(order)));
        }
        // Refused for capacity with `queue`: it waits instead (SPEC 11).
        if let (Some(wait), Some(refused)) = (wait, refused_holds(&r, &placement.reports)) {
            match self
                .join_queue(&r, &refused, &placement.reports, wait)
                .await
            {
                Err(full @ Error::QueueFull { .. }) => {
                    self.abort_placement(r.id, &failure.rejection, &placement.reports)
                        .await?;
                    return Err(full);
                }
                Ok(queued) => return self.with_queue(queued).await,
                Err(e) => return Err(e),
            }
        }
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

    /// A participant found the request malformed: nothing of it is kept, as if it had been
    /// refused before it was recorded. When no hold was placed (the first participant
    /// refused) the `TRYING` row is deleted at once; otherwise the holds already placed are
    /// released through the one release path and the row is deleted once it is `REJECTED`.
    /// A release that cannot finish now leaves the reservation to recovery (it ends
    /// `REJECTED`, readable); that is logged.
    async fn discard_invalid(
        &self,
        id: Uuid,
        rejection: &Rejection,
        reports: &[BranchReport],
    ) -> Result<(), Error> {
        if reports.iter().any(|rep| rep.state != BranchState::Rejected) {
            let released = self.abort_placement(id, rejection, reports).await?;
            if released.stored_state != State::Rejected {
                tracing::warn!(reservation_id = %id, state = %released.stored_state, "invalid request: holds not yet released; the reservation stays until they are");
                return Ok(());
            }
        }
        if !self.store.discard(id, self.instance).await? {
            tracing::warn!(reservation_id = %id, "invalid request: the reservation could not be discarded");
        }
        Ok(())
    }

    /// Records the rejection (the reservation is CANCELLING, ending REJECTED) and releases
    /// every branch that may hold something; when nothing was placed (every Try answered was
    /// a refusal) the one write records it REJECTED and there is nothing to release.
    async fn abort_placement(
        &self,
        id: Uuid,
        rejection: &Rejection,
        reports: &[BranchReport],
    ) -> Result<Reservation, Error> {
        faults::store("coord.record_rejected.before")?;
        let recorded = self
            .store
            .record_rejected(id, Some(rejection), reports)
            .await?;
        faults::store("coord.record_rejected.after")?;
        entered(&recorded, State::Rejected);
        entered(&recorded, State::Cancelling);
        self.drive_release(recorded).await
    }
}
