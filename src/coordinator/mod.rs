//! The coordinator: the reservation lifecycle driven across participants.
//!
//! Reserve places holds one participant at a time in canonical order, all-or-nothing.
//! Confirm and Cancel take their decision durably (in the store, under the row lock) before
//! any participant hears of it, then fan out in parallel. Release (cancel, expiry, rejection)
//! goes through one path, [`Coordinator::drive_release`]; confirmation through
//! [`Coordinator::drive_confirm`].

pub mod error;
pub mod recovery;
pub mod watch;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use uuid::Uuid;

pub use error::Error;

use crate::domain::lifecycle::Refusal;
use crate::domain::validate::{self, FieldError, Limits, ReserveInput};
use crate::domain::{
    BranchOutcome, BranchState, Decision, HoldToken, LatePaymentPolicy, ListQuery,
    ParticipantBranch, Payment, Rejection, Reservation, State, TryOutcome, Verdict,
};
use crate::registry::{CallError, Registry};
use crate::store::{
    Backoff, BranchReport, Created, Decided, HoldLimits, LimitScope, Store, WorkLease,
};

/// Lifecycle and recovery policy beyond the input limits.
#[derive(Clone, Debug)]
pub struct Policy {
    /// How many times Extend may succeed per reservation.
    pub max_extensions: i32,
    /// How long an instance owns a reservation it drives before another may take it over.
    /// Must exceed the longest fan-out (participant timeout x participants).
    pub lease: Duration,
    /// Retry schedule of confirm/release fan-outs that did not finish.
    pub backoff: Backoff,
    /// How often the reaper and recovery look for due work when idle.
    pub sweep_interval: Duration,
    /// Reservations claimed per sweep.
    pub sweep_batch: u32,
    /// What to do with a payment that arrives after expiry.
    pub late_payment: LatePaymentPolicy,
    /// Caps on live reservations, per holder and overall.
    pub hold_limits: HoldLimits,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_extensions: 1,
            lease: Duration::from_secs(30),
            backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(30),
            },
            sweep_interval: Duration::from_millis(250),
            sweep_batch: 64,
            late_payment: LatePaymentPolicy::HonorIfAvailable,
            hold_limits: HoldLimits {
                per_holder: 5,
                total: 0,
            },
        }
    }
}

/// The result of placing holds in order.
struct Placement {
    reports: Vec<BranchReport>,
    failure: Option<PlacementFailure>,
}

/// Why placing stopped.
struct PlacementFailure {
    rejection: Rejection,
    /// Set when the participant could not be reached (outcome unknown).
    unavailable: Option<String>,
}

/// A page of reservations and the cursor of the next page.
#[derive(Debug)]
pub struct Page {
    pub reservations: Vec<Reservation>,
    pub next: Option<(DateTime<Utc>, Uuid)>,
}

/// Drives reservations through their lifecycle.
#[derive(Clone)]
pub struct Coordinator {
    /// This instance, as a lease owner.
    instance: Uuid,
    store: Arc<dyn Store>,
    registry: Registry,
    limits: Limits,
    policy: Policy,
    watchers: Arc<watch::Watchers>,
}

/// Parses a reservation id field.
fn parse_id(field: &str, value: &str) -> Result<Uuid, FieldError> {
    if value.is_empty() {
        return Err(FieldError::new(field, "is required"));
    }
    Uuid::parse_str(value).map_err(|_| FieldError::new(field, "must be a UUID"))
}

/// Checks a presented token's shape (not its value).
fn check_token(value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new("hold_token", "is required"));
    }
    if value.len() > 256 {
        return Err(FieldError::new("hold_token", "must be at most 256 bytes"));
    }
    Ok(())
}

impl Coordinator {
    pub fn new(
        store: Arc<dyn Store>,
        registry: Registry,
        limits: Limits,
        policy: Policy,
    ) -> Coordinator {
        let watchers = Arc::new(watch::Watchers::default());
        Coordinator {
            instance: Uuid::new_v4(),
            store: Arc::new(watch::Publishing {
                inner: store,
                watchers: watchers.clone(),
            }),
            registry,
            limits,
            policy,
            watchers,
        }
    }

    fn lease(&self) -> WorkLease {
        WorkLease {
            owner: self.instance,
            duration: self.policy.lease,
        }
    }

    /// The input limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Records a reservation and places its holds, in canonical order, all-or-nothing.
    pub async fn reserve(&self, input: ReserveInput) -> Result<Reservation, Error> {
        let participants: Vec<String> = input.holds.iter().map(|h| h.participant.clone()).collect();
        let new = validate::reserve(input, &self.limits)?;
        for (i, name) in participants.iter().enumerate() {
            if self.registry.get(name).is_none() {
                return Err(Error::UnknownParticipant {
                    field: format!("holds[{i}].participant"),
                    name: name.clone(),
                });
            }
        }
        let token = HoldToken::generate()
            .map_err(|e| Error::Internal(format!("no randomness for a hold token: {e}")))?;
        match self
            .store
            .create(&new, &token, self.lease(), self.policy.hold_limits)
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
            Created::Existing(existing) if new.same_body_as(&existing) => Ok(existing),
            Created::Existing(existing) => Err(Error::RequestIdReused {
                holder: new.holder,
                request_id: new.request_id,
                existing: existing.id,
            }),
            Created::New(created) => {
                entered(&created, State::Trying);
                self.place_holds(created).await
            }
        }
    }

    /// Try, one participant at a time in canonical order; the first refusal or unknown outcome
    /// stops the fan-out. Renews the lease on a long placement.
    async fn place_in_order(&self, r: &Reservation) -> Result<Placement, Error> {
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

    /// Honours a payment that arrived after every hold was released: places the holds again
    /// as new branches, in order; all held -> confirmed (`late_payment_honored`), otherwise
    /// releases what it re-took and refunds the payment.
    async fn retake(&self, r: Reservation) -> Result<Reservation, Error> {
        let r = self.store.begin_retake(r.id).await?;
        let placement = self.place_in_order(&r).await?;
        match placement.failure {
            None => {
                let r = self.store.finish_retake(r.id, &placement.reports).await?;
                entered(&r, State::Confirming);
                self.drive_confirm(r).await
            }
            Some(failure) => {
                let reason = format!(
                    "the payment arrived after the hold expired and {} could no longer hold {}: {}",
                    failure.rejection.participant,
                    failure.rejection.resource,
                    failure.rejection.reason
                );
                let r = self
                    .store
                    .fail_retake(r.id, &placement.reports, &reason)
                    .await?;
                entered(&r, State::Cancelling);
                refund_recorded(&r);
                let r = self.drive_release(r).await?;
                let r = self.drive_refund(r).await?;
                Err(Error::HoldExpired {
                    id: r.id,
                    refund: r.refund,
                })
            }
        }
    }

    /// Sends the reservation's pending refund to its payment participant, once; a failure is
    /// retried by recovery with backoff until acknowledged.
    pub async fn drive_refund(&self, r: Reservation) -> Result<Reservation, Error> {
        let (Some(refund), Some(payment)) = (&r.refund, &r.payment) else {
            return Ok(r);
        };
        if refund.state != crate::domain::RefundState::Pending {
            return Ok(r);
        }
        let acknowledged = match self.registry.require(&payment.participant) {
            Ok(p) => match p.refund(r.id, payment, refund).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(reservation_id = %r.id, refund_id = %refund.refund_id, error = %e, "refund not acknowledged; will retry");
                    false
                }
            },
            Err(_) => {
                tracing::error!(reservation_id = %r.id, participant = %payment.participant, "refund owed by an unregistered payment participant");
                false
            }
        };
        let after = self
            .store
            .record_refund_attempt(r.id, acknowledged, self.policy.backoff)
            .await?;
        if acknowledged {
            crate::telemetry::refund(crate::domain::RefundState::Refunded);
        }
        Ok(after)
    }

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

    /// Confirms a held reservation.
    pub async fn confirm(
        &self,
        id: &str,
        token: &str,
        payment: Option<Payment>,
    ) -> Result<Reservation, Error> {
        let id = parse_id("reservation_id", id)?;
        check_token(token)?;
        let decision = Decision::Confirm {
            payment,
            late_policy: self.policy.late_payment,
        };
        let (verdict, r) = self.decide(id, token, &decision).await?;
        match verdict {
            Verdict::Transition { .. } | Verdict::HonorLate => self.drive_confirm(r).await,
            Verdict::AlreadyDone => Ok(r),
            Verdict::Expire => {
                self.drive_release(r).await?;
                Err(Error::HoldExpired { id, refund: None })
            }
            Verdict::Retake => self.retake(r).await,
            Verdict::Refund { expire, answer } => {
                let r = if expire {
                    self.drive_release(r).await?
                } else {
                    r
                };
                let r = self.drive_refund(r).await?;
                Err(self.refusal(answer, &r))
            }
            Verdict::Extend { .. } => Err(Error::Internal("confirm judged as extend".into())),
            Verdict::Refuse(refusal) => Err(self.refusal(refusal, &r)),
        }
    }

    /// Releases a reservation.
    pub async fn cancel(&self, id: &str, token: &str, reason: &str) -> Result<Reservation, Error> {
        let id = parse_id("reservation_id", id)?;
        check_token(token)?;
        validate::reason("reason", reason, &self.limits)?;
        let decision = Decision::Cancel {
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
        };
        let (verdict, r) = self.decide(id, token, &decision).await?;
        match verdict {
            Verdict::Transition { .. } | Verdict::Expire => self.drive_release(r).await,
            Verdict::AlreadyDone => Ok(r),
            Verdict::Refuse(refusal) => Err(self.refusal(refusal, &r)),
            other => Err(Error::Internal(format!("cancel judged as {other:?}"))),
        }
    }

    /// Pushes `expires_at` of a held reservation out by `ttl` (default: its original ttl).
    /// With a `request_id`, a repeat of the last applied extension answers the reservation as
    /// it is rather than extending again.
    pub async fn extend(
        &self,
        id: &str,
        token: &str,
        ttl: Option<Duration>,
        request_id: &str,
    ) -> Result<Reservation, Error> {
        let id = parse_id("reservation_id", id)?;
        check_token(token)?;
        let by = match ttl {
            Some(t) => Some(validate::ttl("ttl", t, &self.limits)?),
            None => None,
        };
        let request_id = if request_id.is_empty() {
            None
        } else {
            validate::identifier("request_id", request_id, self.limits.max_id_bytes)?;
            Some(request_id.to_owned())
        };
        // Without a ttl the reservation's original one applies (judged under the row lock).
        let decision = Decision::Extend {
            by,
            max_extensions: self.policy.max_extensions,
            max_ttl: self.limits.max_ttl,
            request_id,
        };
        let (verdict, r) = self.decide(id, token, &decision).await?;
        match verdict {
            Verdict::Extend { .. } | Verdict::AlreadyDone => Ok(r),
            Verdict::Expire => {
                self.drive_release(r).await?;
                Err(Error::HoldExpired { id, refund: None })
            }
            Verdict::Refuse(refusal) => Err(self.refusal(refusal, &r)),
            other => Err(Error::Internal(format!("extend judged as {other:?}"))),
        }
    }

    async fn decide(
        &self,
        id: Uuid,
        token: &str,
        decision: &Decision,
    ) -> Result<(Verdict, Reservation), Error> {
        let decided = self.store.decide(id, token, decision, self.lease()).await?;
        match decided {
            Decided::NotFound => Err(Error::NotFound(id)),
            Decided::TokenMismatch => Err(Error::TokenMismatch(id)),
            Decided::Judged {
                verdict,
                reservation,
                leased,
            } => {
                match &verdict {
                    Verdict::Transition { to, .. } => entered(&reservation, *to),
                    Verdict::HonorLate => entered(&reservation, State::Confirming),
                    Verdict::Expire => {
                        entered(&reservation, State::Cancelling);
                        crate::telemetry::hold_expired();
                    }
                    Verdict::Refund { expire, .. } => {
                        if *expire {
                            entered(&reservation, State::Cancelling);
                            crate::telemetry::hold_expired();
                        }
                        refund_recorded(&reservation);
                    }
                    _ => {}
                }
                // Another instance is driving this reservation (a sweep mid-release): it will
                // finish what this decision added; answer without driving it twice.
                let verdict = match verdict {
                    Verdict::Refund { answer, .. } if !leased => Verdict::Refuse(answer),
                    other => other,
                };
                Ok((verdict, *reservation))
            }
        }
    }

    fn refusal(&self, refusal: Refusal, r: &Reservation) -> Error {
        match refusal {
            Refusal::HoldExpired => Error::HoldExpired {
                id: r.id,
                refund: r.refund.clone(),
            },
            Refusal::Closed => Error::Closed {
                id: r.id,
                state: r.state,
                refund: r.refund.clone(),
            },
            Refusal::InProgress => Error::InProgress(r.id),
            Refusal::NotHeld => Error::NotHeld(r.id),
            Refusal::ExtensionLimit => Error::ExtensionLimit {
                id: r.id,
                used: r.extensions_used,
                max: self.policy.max_extensions,
                max_ttl_secs: self.limits.max_ttl.as_secs(),
            },
        }
    }

    /// Subscribes to the changes this process makes to a reservation (see [`watch`]).
    pub fn subscribe(&self, id: Uuid) -> tokio::sync::broadcast::Receiver<Arc<Reservation>> {
        self.watchers.subscribe(id)
    }

    /// Reads one reservation.
    pub async fn get(&self, id: &str) -> Result<Reservation, Error> {
        let id = parse_id("reservation_id", id)?;
        self.store.get(id).await?.ok_or(Error::NotFound(id))
    }

    /// Lists reservations newest first.
    pub async fn list(&self, mut query: ListQuery) -> Result<Page, Error> {
        if let Some(h) = &query.holder {
            validate::identifier("holder", h, self.limits.max_id_bytes)?;
        }
        let page_size = if query.limit == 0 {
            self.limits.default_page_size
        } else {
            query.limit.min(self.limits.max_page_size)
        };
        query.limit = page_size + 1;
        let mut reservations = self.store.list(&query).await?;
        let next = if reservations.len() > page_size as usize {
            reservations.truncate(page_size as usize);
            reservations.last().map(|r| (r.created_at, r.id))
        } else {
            None
        };
        Ok(Page { reservations, next })
    }

    /// Tells every participant to finalise its branch, in parallel, and records the answers.
    /// A participant that does not answer leaves the reservation CONFIRMING: its outcome is
    /// fixed, and recovery finishes it.
    pub async fn drive_confirm(&self, r: Reservation) -> Result<Reservation, Error> {
        let pending: Vec<ParticipantBranch> = r
            .participant_branches()
            .into_iter()
            .filter(|b| !matches!(b.state, BranchState::Confirmed | BranchState::HoldLost))
            .collect();
        let calls = pending.iter().map(|b| async {
            let result = match self.registry.require(&b.participant) {
                Ok(p) => p.confirm(r.id, b.branch_id).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(BranchOutcome::Confirmed) => BranchReport {
                    branch_id: b.branch_id,
                    state: BranchState::Confirmed,
                    error: None,
                },
                Ok(BranchOutcome::HoldLost) => BranchReport {
                    branch_id: b.branch_id,
                    state: BranchState::HoldLost,
                    error: None,
                },
                // The participant released it (Confirm after Cancel): the hold is gone.
                Ok(BranchOutcome::Cancelled) => {
                    tracing::error!(reservation_id = %r.id, participant = %b.participant, "participant had released a hold being confirmed");
                    BranchReport {
                        branch_id: b.branch_id,
                        state: BranchState::HoldLost,
                        error: Some("participant had released the hold".into()),
                    }
                }
                Err(e) => BranchReport {
                    branch_id: b.branch_id,
                    state: b.state,
                    error: Some(e.message),
                },
            }
        });
        let reports = join_all(calls).await;
        let settled = reports
            .iter()
            .all(|rep| rep.error.is_none() || rep.state == BranchState::HoldLost);
        let lost = reports.iter().any(|rep| rep.state == BranchState::HoldLost)
            || r.branches.iter().any(|b| b.state == BranchState::HoldLost);
        let finish = settled.then_some(if lost {
            State::Failed
        } else {
            State::Confirmed
        });
        if lost {
            tracing::error!(reservation_id = %r.id, "a participant lost a granted hold; reservation FAILED");
        }
        let phase = self
            .store
            .record_phase(
                r.id,
                State::Confirming,
                &reports,
                finish,
                self.policy.backoff,
            )
            .await?;
        if let (true, Some(to)) = (phase.finished, finish) {
            entered(&phase.reservation, to);
            if to == State::Failed {
                refund_recorded(&phase.reservation);
            }
        }
        self.drive_refund(phase.reservation).await
    }

    /// Tells every participant that may hold something to release it, in parallel, and
    /// records the answers. The one release path: cancel, expiry and rejection all use it.
    pub async fn drive_release(&self, r: Reservation) -> Result<Reservation, Error> {
        if r.stored_state != State::Cancelling {
            return Ok(r);
        }
        let to_release: Vec<ParticipantBranch> = release_candidates(&r);
        let calls = to_release.iter().map(|b| async {
            let result = match self.registry.require(&b.participant) {
                Ok(p) => p.cancel(r.id, b.branch_id).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(BranchOutcome::Cancelled) => BranchReport {
                    branch_id: b.branch_id,
                    state: BranchState::Cancelled,
                    error: None,
                },
                Ok(BranchOutcome::Confirmed) => {
                    tracing::error!(reservation_id = %r.id, participant = %b.participant, "participant had confirmed a branch being released");
                    BranchReport {
                        branch_id: b.branch_id,
                        state: BranchState::Confirmed,
                        error: Some("participant had confirmed the branch".into()),
                    }
                }
                // Not an answer Cancel gives (SPEC 3.3): a failed call, retried.
                Ok(BranchOutcome::HoldLost) => BranchReport {
                    branch_id: b.branch_id,
                    state: b.state,
                    error: Some("unexpected answer HOLD_LOST to Cancel".into()),
                },
                Err(e) => BranchReport {
                    branch_id: b.branch_id,
                    state: b.state,
                    error: Some(e.message),
                },
            }
        });
        let reports = join_all(calls).await;
        let inconsistent = reports
            .iter()
            .any(|rep| rep.state == BranchState::Confirmed);
        let settled = reports.iter().all(|rep| rep.error.is_none()) || inconsistent;
        let finish = if inconsistent {
            Some(State::Failed)
        } else if settled {
            Some(r.release_outcome.unwrap_or(State::Cancelled))
        } else {
            None
        };
        let phase = self
            .store
            .record_phase(
                r.id,
                State::Cancelling,
                &reports,
                finish,
                self.policy.backoff,
            )
            .await?;
        if let (true, Some(to)) = (phase.finished, finish) {
            entered(&phase.reservation, to);
        }
        Ok(phase.reservation)
    }
}

/// Counts a transition the caller asked for, if the reservation is now in that state.
fn entered(r: &Reservation, to: State) {
    if r.stored_state == to {
        crate::telemetry::reservation_entered(to);
    }
}

/// Counts a refund the caller recorded, if there is one pending.
fn refund_recorded(r: &Reservation) {
    if r.refund
        .as_ref()
        .is_some_and(|f| f.state == crate::domain::RefundState::Pending)
    {
        crate::telemetry::refund(crate::domain::RefundState::Pending);
    }
}

/// Branches that may hold something at their participant: held ones, and ones whose Try was
/// sent without a definite answer. Never-tried and rejected ones are left alone.
fn release_candidates(r: &Reservation) -> Vec<ParticipantBranch> {
    let tried: HashSet<Uuid> = r
        .branches
        .iter()
        .filter(|b| b.attempts > 0)
        .map(|b| b.branch_id)
        .collect();
    r.participant_branches()
        .into_iter()
        .filter(|b| match b.state {
            BranchState::Held => true,
            BranchState::Pending => tried.contains(&b.branch_id),
            BranchState::Rejected
            | BranchState::Cancelled
            | BranchState::Confirmed
            | BranchState::HoldLost => false,
        })
        .collect()
}
