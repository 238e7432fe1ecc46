//! The JSON shapes of a reservation and of an event as `Serialize` types borrowing the proto
//! message: written straight to bytes where an event is delivered (NATS, webhooks, thousands a
//! second under load), and turned into a `serde_json::Value` by the functions of
//! [`super`] everywhere else, so the shape is written once. Fields in the proto's declaration
//! order, enum values by name, timestamps in RFC 3339 (UTC, milliseconds) or null, every field
//! present, labels sorted by key.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use super::utc_text;
use crate::proto;

/// A timestamp as UTC text, or null (absent or not a valid instant).
struct Time<'a>(Option<&'a prost_types::Timestamp>);

impl Serialize for Time<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match utc_text(self.0) {
            Some(text) => s.serialize_str(&text),
            None => s.serialize_none(),
        }
    }
}

/// An event (SPEC 10).
#[derive(Serialize)]
pub(super) struct Event<'a> {
    sequence: i64,
    event_id: &'a str,
    r#type: &'static str,
    occurred_at: Time<'a>,
    reservation: Option<Reservation<'a>>,
    owner: &'a str,
    from_queue: bool,
}

impl<'a> Event<'a> {
    pub(super) fn of(e: &'a proto::Event) -> Event<'a> {
        Event {
            sequence: e.sequence,
            event_id: &e.event_id,
            r#type: e.r#type().as_str_name(),
            occurred_at: Time(e.occurred_at.as_ref()),
            reservation: e.reservation.as_ref().map(|r| Reservation::of(r, None)),
            owner: &e.owner,
            from_queue: e.from_queue,
        }
    }
}

/// A reservation; its hold token only in Reserve's answer (`hold_token` given).
#[derive(Serialize)]
pub(super) struct Reservation<'a> {
    id: &'a str,
    request_id: &'a str,
    holder: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_token: Option<&'a str>,
    created_at: Time<'a>,
    expires_at: Time<'a>,
    extensions_used: i32,
    branches: Vec<Branch<'a>>,
    rejection: Option<Rejection<'a>>,
    refund: Option<Refund<'a>>,
    late_payment_honored: bool,
    labels: BTreeMap<&'a str, &'a str>,
    audit: Vec<AuditEntry<'a>>,
    payments: Vec<PaymentRecord<'a>>,
    queue: Option<QueuePlace<'a>>,
}

impl<'a> Reservation<'a> {
    pub(super) fn of(r: &'a proto::Reservation, hold_token: Option<&'a str>) -> Reservation<'a> {
        Reservation {
            id: &r.id,
            request_id: &r.request_id,
            holder: &r.holder,
            state: r.state().as_str_name(),
            hold_token,
            created_at: Time(r.created_at.as_ref()),
            expires_at: Time(r.expires_at.as_ref()),
            extensions_used: r.extensions_used,
            branches: r.branches.iter().map(Branch::of).collect(),
            rejection: r.rejection.as_ref().map(|x| Rejection {
                participant: &x.participant,
                resource: &x.resource,
                reason: &x.reason,
            }),
            refund: r.refund.as_ref().map(|x| Refund {
                refund_id: &x.refund_id,
                state: x.state().as_str_name(),
                amount_minor: x.amount_minor,
                currency: &x.currency,
                failure_reason: &x.failure_reason,
            }),
            late_payment_honored: r.late_payment_honored,
            labels: r
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            audit: r.audit.iter().map(AuditEntry::of).collect(),
            payments: r.payments.iter().map(PaymentRecord::of).collect(),
            queue: r.queue.as_ref().map(QueuePlace::of),
        }
    }
}

#[derive(Serialize)]
struct Branch<'a> {
    participant: &'a str,
    resource: &'a str,
    quantity: i64,
    during: Option<Interval<'a>>,
    state: &'static str,
    attempts: i32,
    last_error: &'a str,
}

impl<'a> Branch<'a> {
    fn of(b: &'a proto::Branch) -> Branch<'a> {
        Branch {
            participant: &b.participant,
            resource: &b.resource,
            quantity: b.quantity,
            during: b.during.as_ref().map(Interval::of),
            state: b.state().as_str_name(),
            attempts: b.attempts,
            last_error: &b.last_error,
        }
    }
}

/// A slot: `{"start","end"}`.
#[derive(Serialize)]
struct Interval<'a> {
    start: Time<'a>,
    end: Time<'a>,
}

impl<'a> Interval<'a> {
    fn of(d: &'a proto::Interval) -> Interval<'a> {
        Interval {
            start: Time(d.start.as_ref()),
            end: Time(d.end.as_ref()),
        }
    }
}

#[derive(Serialize)]
struct Rejection<'a> {
    participant: &'a str,
    resource: &'a str,
    reason: &'a str,
}

#[derive(Serialize)]
struct Refund<'a> {
    refund_id: &'a str,
    state: &'static str,
    amount_minor: i64,
    currency: &'a str,
    failure_reason: &'a str,
}

/// An operator action.
#[derive(Serialize)]
pub(super) struct AuditEntry<'a> {
    reservation_id: &'a str,
    principal: &'a str,
    at: Time<'a>,
    action: &'a str,
    reason: &'a str,
    participant: &'a str,
}

impl<'a> AuditEntry<'a> {
    pub(super) fn of(a: &'a proto::AuditEntry) -> AuditEntry<'a> {
        AuditEntry {
            reservation_id: &a.reservation_id,
            principal: &a.principal,
            at: Time(a.at.as_ref()),
            action: &a.action,
            reason: &a.reason,
            participant: &a.participant,
        }
    }
}

/// A payment recorded for a reservation.
#[derive(Serialize)]
struct PaymentRecord<'a> {
    participant: &'a str,
    payment_ref: &'a str,
    amount_minor: i64,
    currency: &'a str,
    state: &'static str,
    refund_id: &'a str,
}

impl<'a> PaymentRecord<'a> {
    fn of(p: &'a proto::reservation::PaymentRecord) -> PaymentRecord<'a> {
        PaymentRecord {
            participant: &p.participant,
            payment_ref: &p.payment_ref,
            amount_minor: p.amount_minor,
            currency: &p.currency,
            state: p.state().as_str_name(),
            refund_id: &p.refund_id,
        }
    }
}

/// Where a QUEUED reservation waits (SPEC 11).
#[derive(Serialize)]
struct QueuePlace<'a> {
    position: i64,
    participant: &'a str,
    resource: &'a str,
    during: Option<Interval<'a>>,
    since: Time<'a>,
    until: Time<'a>,
}

impl<'a> QueuePlace<'a> {
    fn of(q: &'a proto::QueuePlace) -> QueuePlace<'a> {
        QueuePlace {
            position: q.position,
            participant: &q.participant,
            resource: &q.resource,
            during: q.during.as_ref().map(Interval::of),
            since: Time(q.since.as_ref()),
            until: Time(q.until.as_ref()),
        }
    }
}
