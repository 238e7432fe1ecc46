//! Translation between `tcc.v1` messages and domain types: wire shape only (a missing message,
//! a timestamp or duration that is not one, an unknown enum value, a page token this service
//! did not issue). Malformed fields become [`FieldError`]s naming the field; the rules on
//! values live in `domain::validate` and the coordinator.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::PresentedToken;
use crate::domain::validate::{self, FieldError, RequestId, ReserveInput};
use crate::domain::waitlist::{QueueOptions, QueuePlace};
use crate::domain::{
    BranchState, Find, Hold, HoldToken, Interval, ListQuery, Payment, PaymentRecord, PaymentState,
    Refund, RefundState, Reservation, State,
};
use crate::proto;

pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

pub fn from_timestamp(
    field: &str,
    t: &prost_types::Timestamp,
) -> Result<DateTime<Utc>, FieldError> {
    let nanos = u32::try_from(t.nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| FieldError::new(field, "is not a valid timestamp (nanos)"))?;
    if !validate::TIMESTAMP_SECONDS.contains(&t.seconds) {
        return Err(validate::timestamp_out_of_range(field));
    }
    DateTime::from_timestamp(t.seconds, nanos)
        .ok_or_else(|| FieldError::new(field, "is not a valid timestamp"))
}

/// A non-negative protobuf duration.
pub fn from_duration(field: &str, d: &prost_types::Duration) -> Result<Duration, FieldError> {
    let secs = u64::try_from(d.seconds).ok();
    let nanos = u32::try_from(d.nanos).ok().filter(|n| *n < 1_000_000_000);
    match (secs, nanos) {
        (Some(s), Some(n)) => Ok(Duration::new(s, n)),
        _ => Err(FieldError::new(field, "must be a positive duration")),
    }
}

pub(super) fn interval(field: &str, i: &proto::Interval) -> Result<Interval, FieldError> {
    let start = i
        .start
        .as_ref()
        .ok_or_else(|| FieldError::new(format!("{field}.start"), "is required"))?;
    let end = i
        .end
        .as_ref()
        .ok_or_else(|| FieldError::new(format!("{field}.end"), "is required"))?;
    Ok(Interval {
        start: from_timestamp(&format!("{field}.start"), start)?,
        end: from_timestamp(&format!("{field}.end"), end)?,
    })
}

/// A Reserve request, still to be validated.
pub fn reserve_input(req: proto::ReserveRequest) -> Result<ReserveInput, FieldError> {
    let ttl = req
        .ttl
        .as_ref()
        .map(|d| from_duration("ttl", d))
        .transpose()?;
    let holds = req
        .holds
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            Ok(Hold {
                during: h
                    .during
                    .as_ref()
                    .map(|d| interval(&format!("holds[{i}].during"), d))
                    .transpose()?,
                participant: h.participant,
                resource: h.resource,
                quantity: h.quantity,
            })
        })
        .collect::<Result<Vec<_>, FieldError>>()?;
    Ok(ReserveInput {
        request_id: req.request_id,
        holder: req.holder,
        ttl,
        holds,
        labels: req.labels,
        queue: req.queue.as_ref().map(queue_options).transpose()?,
    })
}

/// A Reserve's `queue` option, its `wait_up_to` still to be validated.
fn queue_options(q: &proto::QueueOptions) -> Result<QueueOptions, FieldError> {
    Ok(QueueOptions {
        wait_up_to: q
            .wait_up_to
            .as_ref()
            .map(|d| from_duration("queue.wait_up_to", d))
            .transpose()?,
    })
}

/// Where a QUEUED reservation waits, on the wire.
fn queue_place(p: QueuePlace) -> proto::QueuePlace {
    proto::QueuePlace {
        position: p.position,
        participant: p.key.participant,
        resource: p.key.resource,
        during: p.key.during.map(|d| proto::Interval {
            start: Some(timestamp(d.start)),
            end: Some(timestamp(d.end)),
        }),
        since: Some(timestamp(p.since)),
        until: Some(timestamp(p.until)),
    }
}

pub fn state(s: State) -> proto::reservation::State {
    use proto::reservation::State as P;
    match s {
        State::Trying => P::Trying,
        State::Held => P::Held,
        State::Confirming => P::Confirming,
        State::Confirmed => P::Confirmed,
        State::Cancelling => P::Cancelling,
        State::Cancelled => P::Cancelled,
        State::Expired => P::Expired,
        State::Rejected => P::Rejected,
        State::Failed => P::Failed,
        State::Queued => P::Queued,
    }
}

/// Reservations by state (Admin `CountReservations`): each minute's counts grouped under it.
pub fn state_counts(c: crate::domain::admin::StateCounts) -> proto::CountReservationsResponse {
    let count = |(s, n): (State, i64)| proto::StateCount {
        state: state(s) as i32,
        count: n,
    };
    let mut last_hour: Vec<proto::MinuteCounts> = Vec::new();
    for (minute, s, n) in c.minutes {
        let start = Some(timestamp(minute));
        match last_hour.last_mut() {
            Some(m) if m.start == start => m.counts.push(count((s, n))),
            _ => last_hour.push(proto::MinuteCounts {
                start,
                counts: vec![count((s, n))],
            }),
        }
    }
    proto::CountReservationsResponse {
        live: c.live.into_iter().map(count).collect(),
        last_hour,
        at: Some(timestamp(c.at)),
    }
}

/// Where a stuck reservation's work stands (Admin `ListStuck`).
pub fn stuck_work(w: crate::domain::admin::WorkState) -> proto::StuckWork {
    proto::StuckWork {
        reservation_id: w.reservation_id.to_string(),
        next_attempt_at: w.next_attempt_at.map(timestamp),
        attempts: w.attempts,
    }
}

/// One line of the inventory (Admin `GetInventory`).
pub fn inventory_line(line: crate::domain::admin::InventoryLine) -> proto::InventoryLine {
    let (levels, error) = match line.levels {
        Ok(levels) => (levels, String::new()),
        Err(why) => (Default::default(), why),
    };
    proto::InventoryLine {
        participant: line.participant,
        resource: line.resource,
        capacity: levels.capacity,
        available: levels.available,
        held: levels.held,
        confirmed: levels.confirmed,
        error,
    }
}

/// A ListReservations request as a query; the page size is capped by the coordinator.
pub fn list_query(req: proto::ListReservationsRequest) -> Result<ListQuery, FieldError> {
    if req.page_size < 0 {
        return Err(FieldError::new("page_size", "must be >= 0"));
    }
    Ok(ListQuery {
        owner: None,
        holder: (!req.holder.is_empty()).then_some(req.holder),
        state: state_filter(req.state)?,
        limit: u32::try_from(req.page_size).unwrap_or(0),
        after: if req.page_token.is_empty() {
            None
        } else {
            Some(from_page_token(&req.page_token)?)
        },
        participant: (!req.participant.is_empty()).then_some(req.participant),
        created_after: req
            .created_after
            .as_ref()
            .map(|t| from_timestamp("created_after", t))
            .transpose()?,
        created_before: req
            .created_before
            .as_ref()
            .map(|t| from_timestamp("created_before", t))
            .transpose()?,
        labels: req.labels.into_iter().collect(),
        find: lookup(&req.id_prefix, req.request_id)?,
    })
}

/// The lookup a List asks for instead of its filters, if any (one at most).
fn lookup(id_prefix: &str, request_id: String) -> Result<Option<Find>, FieldError> {
    match (id_prefix.is_empty(), request_id.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Find::id_prefix("id_prefix", id_prefix).map(Some),
        (true, false) => Ok(Some(Find::RequestId(request_id))),
        (false, false) => Err(FieldError::new(
            "request_id",
            "give id_prefix or request_id, not both",
        )),
    }
}

/// A request's `reservation_id`: required, and a UUID. Parsed here once; past `api/` an id is
/// a [`Uuid`].
pub(crate) fn reservation_id(value: &str) -> Result<Uuid, FieldError> {
    validate::reservation_id(value)
}

/// A request's `hold_token`, its shape checked; past `api/` it is a [`PresentedToken`], which
/// never shows the secret in `Debug`.
pub(crate) fn hold_token(value: String) -> Result<PresentedToken, FieldError> {
    PresentedToken::parse(value)
}

/// An Extend's optional `request_id`: empty is none; otherwise at most `max` bytes, no control
/// characters.
pub(crate) fn extend_request_id(value: &str, max: usize) -> Result<Option<RequestId>, FieldError> {
    if value.is_empty() {
        return Ok(None);
    }
    RequestId::parse(value, max).map(Some)
}

/// The page token of a list cursor: `<created_at micros>.<id>`.
pub fn page_token(created_at: DateTime<Utc>, id: Uuid) -> String {
    format!("{}.{}", created_at.timestamp_micros(), id.simple())
}

pub fn from_page_token(token: &str) -> Result<(DateTime<Utc>, Uuid), FieldError> {
    let bad = || FieldError::new("page_token", "is not a token from a previous response");
    let (micros, id) = token.split_once('.').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let ts = DateTime::from_timestamp_micros(micros).ok_or_else(bad)?;
    let id = Uuid::parse_str(id).map_err(|_| bad())?;
    Ok((ts, id))
}

/// A state filter; `STATE_UNSPECIFIED` means none.
pub fn state_filter(value: i32) -> Result<Option<State>, FieldError> {
    use proto::reservation::State as P;
    let p = P::try_from(value).map_err(|_| FieldError::new("state", "is not a known state"))?;
    Ok(State::ALL.into_iter().find(|s| state(*s) == p))
}

pub fn branch_state(s: BranchState) -> proto::branch::State {
    use proto::branch::State as P;
    match s {
        BranchState::Pending => P::Pending,
        BranchState::Held => P::Held,
        BranchState::Rejected => P::Rejected,
        BranchState::Confirmed => P::Confirmed,
        BranchState::Cancelled => P::Cancelled,
        BranchState::HoldLost => P::HoldLost,
    }
}

/// Which reservations may carry their secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// Only the answer to Reserve, and only to the reservation's own principal.
    Include(Option<&'a HoldToken>),
    Omit,
}

pub fn reservation(r: Reservation, token: Token<'_>) -> proto::Reservation {
    let payments = r.payments().into_iter().map(payment_record).collect();
    proto::Reservation {
        id: r.id.to_string(),
        request_id: r.request_id,
        holder: r.holder,
        state: state(r.state).into(),
        hold_token: match token {
            Token::Include(Some(t)) => t.expose().to_owned(),
            Token::Include(None) | Token::Omit => String::new(),
        },
        created_at: Some(timestamp(r.created_at)),
        expires_at: Some(timestamp(r.expires_at)),
        extensions_used: r.extensions_used,
        branches: r
            .branches
            .into_iter()
            .map(|b| proto::Branch {
                participant: b.hold.participant,
                resource: b.hold.resource,
                quantity: b.hold.quantity,
                during: b.hold.during.map(|d| proto::Interval {
                    start: Some(timestamp(d.start)),
                    end: Some(timestamp(d.end)),
                }),
                state: branch_state(b.state).into(),
                attempts: b.attempts,
                last_error: b.last_error.unwrap_or_default(),
            })
            .collect(),
        rejection: r.rejection.map(|x| proto::Rejection {
            participant: x.participant,
            resource: x.resource,
            reason: x.reason,
        }),
        refund: r.refund.as_ref().map(refund),
        late_payment_honored: r.late_payment_honored,
        labels: r.labels.into_iter().collect(),
        audit: r.audit.into_iter().map(audit_entry).collect(),
        payments,
        queue: r.queue.map(queue_place),
    }
}

/// A recorded payment on the wire (SPEC 3.1 `PaymentRecord`).
fn payment_record(p: PaymentRecord) -> proto::reservation::PaymentRecord {
    use proto::reservation::payment_record::State as Wire;
    proto::reservation::PaymentRecord {
        participant: p.payment.participant,
        payment_ref: p.payment.payment_ref,
        amount_minor: p.payment.amount_minor,
        currency: p.payment.currency,
        state: match p.state {
            PaymentState::Applied => Wire::Applied,
            PaymentState::RefundPending => Wire::RefundPending,
            PaymentState::Refunded => Wire::Refunded,
            PaymentState::RefundFailed => Wire::RefundFailed,
        }
        .into(),
        refund_id: p.refund_id.map(|id| id.to_string()).unwrap_or_default(),
    }
}

/// One audit log entry on the wire.
pub fn audit_entry(e: crate::domain::admin::AuditEntry) -> proto::AuditEntry {
    proto::AuditEntry {
        reservation_id: e
            .reservation_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        principal: e.principal,
        at: Some(timestamp(e.at)),
        action: e.action.as_str().to_owned(),
        reason: e.reason,
        participant: e.participant.unwrap_or_default(),
    }
}

pub fn refund(r: &Refund) -> proto::Refund {
    proto::Refund {
        refund_id: r.refund_id.to_string(),
        state: match r.state {
            RefundState::Pending => proto::refund::State::Pending,
            RefundState::Refunded => proto::refund::State::Refunded,
            RefundState::Failed => proto::refund::State::Failed,
        }
        .into(),
        amount_minor: r.amount_minor,
        currency: r.currency.clone(),
        failure_reason: r.failure.clone().unwrap_or_default(),
    }
}

pub fn payment(p: proto::Payment) -> Payment {
    Payment {
        participant: p.participant,
        payment_ref: p.payment_ref,
        amount_minor: p.amount_minor,
        currency: p.currency,
    }
}

/// An event type on the wire (the enum values are SPEC 10's names).
pub fn event_type(t: crate::domain::EventType) -> proto::event::Type {
    proto::event::Type::from_str_name(t.as_str()).unwrap_or(proto::event::Type::Unspecified)
}

/// An event on the wire: the reservation as the change left it, never its token.
pub fn event(e: crate::domain::Event) -> proto::Event {
    proto::Event {
        sequence: e.sequence,
        event_id: e.event_id.to_string(),
        r#type: event_type(e.event_type).into(),
        occurred_at: Some(timestamp(e.occurred_at)),
        reservation: Some(reservation(e.reservation, Token::Omit)),
        owner: e.owner,
        from_queue: e.from_queue,
    }
}

/// A stream's sign of life: the latest sequence handed out.
pub fn heartbeat(latest: i64) -> proto::Event {
    proto::Event {
        sequence: latest,
        r#type: proto::event::Type::Heartbeat.into(),
        ..Default::default()
    }
}

/// An event sink's state (Admin ListSinks).
pub fn sink(report: crate::coordinator::admin::SinkReport) -> proto::Sink {
    let lag = report.lag;
    proto::Sink {
        name: report.state.name,
        delivered_through: report.state.delivered_through,
        lag: Some(prost_types::Duration {
            seconds: i64::try_from(lag.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(lag.subsec_nanos()).unwrap_or(0),
        }),
        failing_since: report.state.failing_since.map(timestamp),
        paused: report.state.paused,
        last_error: report.state.last_error.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let ts = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(from_page_token(&page_token(ts, id)).unwrap(), (ts, id));
        for bad in ["", "x", "1.2", "abc.0190f5c2-0000-7000-8000-000000000000"] {
            assert_eq!(from_page_token(bad).unwrap_err().field, "page_token");
        }
    }
}
