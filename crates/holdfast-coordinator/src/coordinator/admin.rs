//! The operator's control plane (`tcc.v1.Admin`, SPEC 8.1): stuck work, Retry (backoff
//! cleared and driven within the call), ForceCancel (released through the one release path),
//! Resolve of a `FAILED` reservation, and the audit log. Every change is audited by the store in
//! the same transaction as the change; the callers are admins (the auth layer's rule).

use std::collections::HashMap;

use futures_util::future::join_all;
use uuid::Uuid;

use super::{Coordinator, Error, Page, entered, refund_recorded};
use crate::domain::admin::{
    self, AdminAction, AuditEntry, AuditNote, AuditQuery, RetryTarget, StateCounts, StuckQuery,
    WorkState,
};
use crate::domain::validate::{self, FieldError};
use crate::domain::{Actor, Reservation, State};
use crate::store::AdminDecided;

/// The most reservations a Retry answers (it drives them all).
const MAX_RETRY_ANSWER: usize = 500;

/// What Retry did.
#[derive(Debug)]
pub struct Retried {
    /// How many reservations had their backoff cleared and were driven by this call.
    pub driven: usize,
    /// The reservations as they stand afterwards (at most 500), with their audit.
    pub reservations: Vec<Reservation>,
}

/// A page of the audit log, and the `seq` to continue before.
#[derive(Debug)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    pub next: Option<i64>,
}

impl Coordinator {
    /// Fills each reservation's audit entries (oldest first), in one store read.
    pub async fn with_audit(&self, mut rs: Vec<Reservation>) -> Result<Vec<Reservation>, Error> {
        if rs.is_empty() {
            return Ok(rs);
        }
        let ids: Vec<Uuid> = rs.iter().map(|r| r.id).collect();
        let mut by_id: HashMap<Uuid, Vec<AuditEntry>> = HashMap::new();
        for e in self.store.audit_of(&ids).await? {
            if let Some(id) = e.reservation_id {
                by_id.entry(id).or_default().push(e);
            }
        }
        for r in &mut rs {
            r.audit = by_id.remove(&r.id).unwrap_or_default();
        }
        Ok(rs)
    }

    /// One reservation with its audit entries.
    pub async fn with_audit_one(&self, r: Reservation) -> Result<Reservation, Error> {
        let mut rs = self.with_audit(vec![r]).await?;
        rs.pop().ok_or_else(|| {
            Error::Internal("a reservation went missing while reading its audit".into())
        })
    }

    /// Releases a `TRYING` or `HELD` reservation without its token, as a Cancel would.
    pub async fn force_cancel(
        &self,
        actor: &Actor,
        id: Uuid,
        reason: &str,
    ) -> Result<Reservation, Error> {
        admin::admin_reason(reason)?;
        let note = note(actor, AdminAction::ForceCancel, reason, None);
        let (r, leased) = match self.store.force_cancel(id, &note, self.lease()).await? {
            AdminDecided::NotFound => return Err(Error::NotFound(id)),
            AdminDecided::Refused(r) => {
                return Err(Error::Closed {
                    id,
                    state: r.state,
                    refund: None,
                });
            }
            AdminDecided::Done {
                reservation,
                leased,
            } => (*reservation, leased),
        };
        crate::telemetry::admin_action(AdminAction::ForceCancel.as_str());
        tracing::warn!(reservation_id = %id, principal = %note.principal, reason = %reason, "force-cancelled by an operator");
        entered(&r, State::Cancelling);
        // Not leased: another driver (a placement still in flight at another instance, or a
        // sweep) holds it and releases it, or recovery does once its lease ends.
        let r = if leased {
            self.drive_release(r).await?
        } else {
            r
        };
        self.with_audit_one(r).await
    }

    /// Settles a `FAILED` reservation as `CONFIRMED` or `CANCELLED` (its refund, if it owes
    /// one, sent now).
    pub async fn resolve(
        &self,
        actor: &Actor,
        id: Uuid,
        outcome: Option<State>,
        reason: &str,
    ) -> Result<Reservation, Error> {
        let action = admin::resolve_outcome(outcome)?;
        admin::admin_reason(reason)?;
        let to = match action {
            AdminAction::ResolveConfirmed => State::Confirmed,
            _ => State::Cancelled,
        };
        let note = note(actor, action, reason, None);
        let (r, leased) = match self.store.resolve(id, to, &note, self.lease()).await? {
            AdminDecided::NotFound => return Err(Error::NotFound(id)),
            AdminDecided::Refused(r) => {
                return Err(Error::NotFailed { id, state: r.state });
            }
            AdminDecided::Done {
                reservation,
                leased,
            } => (*reservation, leased),
        };
        crate::telemetry::admin_action(action.as_str());
        tracing::warn!(reservation_id = %id, principal = %note.principal, outcome = %to, reason = %reason, "FAILED reservation resolved by an operator");
        entered(&r, to);
        refund_recorded(&r);
        let r = if leased {
            self.drive_refund(r).await?
        } else {
            r
        };
        self.with_audit_one(r).await
    }

    /// Clears the backoff of one reservation, or of every reservation with unfinished work at
    /// a participant, and drives each now (within this call); those another driver holds are
    /// left to it.
    pub async fn retry(
        &self,
        actor: &Actor,
        reservation_id: Option<&str>,
        participant: Option<&str>,
        reason: &str,
    ) -> Result<Retried, Error> {
        let target = match (reservation_id, participant) {
            (Some(id), None) => RetryTarget::Reservation(validate::reservation_id(id)?),
            (None, Some(p)) => {
                admin::participant_name("participant", p)?;
                if self.registry.get(p).is_none() {
                    return Err(Error::UnknownParticipant {
                        field: "participant".into(),
                        name: p.to_owned(),
                    });
                }
                RetryTarget::Participant(p.to_owned())
            }
            _ => {
                return Err(validate::FieldError::new(
                    "target",
                    "exactly one of reservation_id and participant is required",
                )
                .into());
            }
        };
        let named = match &target {
            RetryTarget::Participant(p) => Some(p.clone()),
            RetryTarget::Reservation(_) => None,
        };
        let reason = retry_reason(reason, &target)?;
        let note = note(actor, AdminAction::Retry, &reason, named);
        let Some(woken) = self.store.retry(&target, &note, self.lease()).await? else {
            let RetryTarget::Reservation(id) = target else {
                return Err(Error::Internal(
                    "retry by participant found no reservation".into(),
                ));
            };
            return Err(Error::NotFound(id));
        };
        crate::telemetry::admin_action(AdminAction::Retry.as_str());
        let leased: Vec<Uuid> = woken.iter().filter(|w| w.leased).map(|w| w.id).collect();
        tracing::info!(principal = %note.principal, woken = woken.len(), driven = leased.len(), "retry by an operator");
        for (id, result) in join_all(
            leased
                .iter()
                .map(|id| async move { (*id, self.recover(*id).await) }),
        )
        .await
        {
            if let Err(e) = result {
                tracing::warn!(reservation_id = %id, error = %e, "retry: driving failed; recovery retries it");
            }
        }
        let ids: Vec<Uuid> = match &target {
            RetryTarget::Reservation(id) => vec![*id],
            RetryTarget::Participant(_) => woken.iter().map(|w| w.id).collect(),
        };
        let mut reservations = Vec::with_capacity(ids.len().min(MAX_RETRY_ANSWER));
        for id in ids.into_iter().take(MAX_RETRY_ANSWER) {
            if let Some(r) = self.store.get(id).await? {
                reservations.push(r);
            }
        }
        Ok(Retried {
            driven: leased.len(),
            reservations: self.with_audit(reservations).await?,
        })
    }

    /// Stuck work, newest first, everyone's.
    pub async fn list_stuck(&self, mut query: StuckQuery) -> Result<Page, Error> {
        if let Some(p) = &query.participant {
            admin::participant_name("participant", p)?;
        }
        let page_size = self.page_size(query.limit);
        query.limit = page_size + 1;
        let mut reservations = self.store.list_stuck(&query).await?;
        let next = if reservations.len() > page_size as usize {
            reservations.truncate(page_size as usize);
            reservations.last().map(|r| (r.created_at, r.id))
        } else {
            None
        };
        Ok(Page {
            reservations: self.with_audit(reservations).await?,
            next,
        })
    }

    /// Where the work of each of these reservations stands (stuck work's next retry).
    pub async fn work_of(&self, ids: &[uuid::Uuid]) -> Result<Vec<WorkState>, Error> {
        Ok(self.store.work_of(ids).await?)
    }

    /// Reservations by state from the database: the live ones, the last hour's per minute.
    pub async fn count_by_state(&self) -> Result<StateCounts, Error> {
        Ok(self.store.count_by_state().await?)
    }

    /// The audit log (one reservation's or all), newest first.
    pub async fn list_audit(&self, mut query: AuditQuery) -> Result<AuditPage, Error> {
        let page_size = self.page_size(query.limit);
        query.limit = page_size + 1;
        let mut entries = self.store.audit(&query).await?;
        let next = if entries.len() > page_size as usize {
            entries.truncate(page_size as usize);
            entries.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(AuditPage { entries, next })
    }

    /// Every event sink's state and lag (SPEC 10), by name.
    pub async fn list_sinks(&self) -> Result<Vec<SinkReport>, Error> {
        let log = self.events.log();
        let mut reports = Vec::new();
        for state in log.sinks().await? {
            let lag = log.sink_lag(&state.name).await?;
            reports.push(SinkReport { state, lag });
        }
        Ok(reports)
    }

    /// Resumes the webhook `name` (`--webhook NAME=URL`) after a pause; delivery restarts where
    /// it stopped.
    pub async fn resume_webhook(&self, name: &str) -> Result<SinkReport, Error> {
        if name.is_empty() || name.len() > 128 {
            return Err(FieldError::new("name", "must be 1..128 bytes").into());
        }
        let sink = webhook_sink_name(name);
        let log = self.events.log();
        if !log.resume_sink(&sink).await? {
            return Err(Error::UnknownWebhook(name.to_owned()));
        }
        let reports = self.list_sinks().await?;
        reports
            .into_iter()
            .find(|r| r.state.name == sink)
            .ok_or_else(|| Error::UnknownWebhook(name.to_owned()))
    }

    /// A page size asked for (0: the default), within the limit.
    pub(super) fn page_size(&self, asked: u32) -> u32 {
        if asked == 0 {
            self.limits.default_page_size
        } else {
            asked.min(self.limits.max_page_size)
        }
    }
}

/// The audit entry an action by `actor` records.
/// What a Retry's audit entry says: the operator's reason, checked as every admin reason is,
/// or, without one, what was retried.
fn retry_reason(given: &str, target: &RetryTarget) -> Result<String, Error> {
    if !given.is_empty() {
        admin::admin_reason(given)?;
        return Ok(given.to_owned());
    }
    Ok(match target {
        RetryTarget::Reservation(_) => {
            "retry requested: backoff cleared, the reservation's unfinished work driven now (no reason given)".to_owned()
        }
        RetryTarget::Participant(p) => format!(
            "retry requested: backoff cleared, every reservation with unfinished work at {p} driven now (no reason given)"
        ),
    })
}

fn note(
    actor: &Actor,
    action: AdminAction,
    reason: &str,
    participant: Option<String>,
) -> AuditNote {
    AuditNote {
        principal: admin::audit_principal(&actor.principal),
        action,
        reason: reason.to_owned(),
        participant,
    }
}

/// An event sink's delivery state and how far behind it is ([`Coordinator::list_sinks`]).
#[derive(Clone, Debug)]
pub struct SinkReport {
    pub state: crate::store::events::SinkState,
    /// Age of the oldest event it has not delivered (zero when caught up).
    pub lag: std::time::Duration,
}

/// The sink name a webhook's cursor is kept under.
pub fn webhook_sink_name(webhook: &str) -> String {
    format!("webhook:{webhook}")
}
