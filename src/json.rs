//! The one JSON shape of `tcc.v1` messages, printed by the CLI (`--json`) and answered by the
//! HTTP JSON API (`crate::http`): the messages with the proto's field names,
//! enum values by name, timestamps in RFC 3339 (UTC) and every field present (null when
//! absent), so scripts can rely on the shape; and errors ([`error`]). Fields come in the proto's
//! declaration order (`id` first; serde_json's `preserve_order`), map keys (labels) sorted.
//! Hold tokens are never in it (the coordinator sends one only in Reserve's answer; the JSON
//! API's Reserve answers it in its proto place through [`reservation_with_token`]).

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use tonic_types::StatusExt;

use crate::proto;

mod shapes;

/// A reservation, without its hold token.
pub fn reservation(r: &proto::Reservation) -> Value {
    shaped(r, None)
}

/// Reserve's answer: the reservation with its hold token, in the token's proto place.
pub(crate) fn reservation_with_token(r: &proto::Reservation) -> Value {
    shaped(r, Some(&r.hold_token))
}

fn shaped(r: &proto::Reservation, hold_token: Option<&str>) -> Value {
    value(shapes::Reservation::of(r, hold_token))
}

/// An event (SPEC 10): what `/v1/events` answers and the CLI prints. The sequence is a JSON
/// number (it stays below 2^53 for any realistic log).
pub fn event(e: &proto::Event) -> Value {
    value(shapes::Event::of(e))
}

/// [`event`] as compact JSON text: what NATS and webhooks carry, written without building a
/// [`Value`] first (the same shape).
pub(crate) fn event_bytes(e: &proto::Event) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&shapes::Event::of(e))
}

/// One of [`shapes`] as a [`Value`].
fn value(shape: impl serde::Serialize) -> Value {
    // Strings, numbers, bools and maps keyed by strings: nothing in a shape can fail to
    // serialize, and `Value` holds all of it.
    serde_json::to_value(shape).unwrap_or(Value::Null)
}

/// An event sink's delivery state (Admin `ListSinks`); `lag_seconds` is the age of the oldest
/// event it has not delivered (0 when caught up).
pub fn sink(s: &proto::Sink) -> Value {
    let lag = s
        .lag
        .as_ref()
        .map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
    json!({
        "name": s.name,
        "delivered_through": s.delivered_through,
        "lag_seconds": lag,
        "failing_since": time(s.failing_since.as_ref()),
        "paused": s.paused,
        "last_error": (!s.last_error.is_empty()).then_some(&s.last_error),
    })
}

/// Reservations by state (Admin `CountReservations`): `live` and each minute's `counts` as
/// objects of state name -> count.
pub fn state_counts(c: &proto::CountReservationsResponse) -> Value {
    let by_state = |counts: &[proto::StateCount]| {
        counts
            .iter()
            .map(|n| (n.state().as_str_name().to_owned(), json!(n.count)))
            .collect::<serde_json::Map<_, _>>()
    };
    json!({
        "live": by_state(&c.live),
        "last_hour": c.last_hour.iter().map(|m| json!({
            "start": time(m.start.as_ref()),
            "counts": by_state(&m.counts),
        })).collect::<Vec<_>>(),
        "at": time(c.at.as_ref()),
    })
}

/// Where a stuck reservation's work stands: its next attempt (null: none scheduled) and how
/// many times the sweep drove it.
pub fn stuck_work(w: &proto::StuckWork) -> Value {
    json!({
        "reservation_id": w.reservation_id,
        "next_attempt_at": time(w.next_attempt_at.as_ref()),
        "attempts": w.attempts,
    })
}

/// One line of the inventory: a resource's stock levels, or why they could not be read
/// (`error`, null when they were).
pub fn inventory_line(l: &proto::InventoryLine) -> Value {
    json!({
        "participant": l.participant,
        "resource": l.resource,
        "capacity": l.capacity,
        "available": l.available,
        "held": l.held,
        "confirmed": l.confirmed,
        "error": (!l.error.is_empty()).then_some(&l.error),
    })
}

/// One reservation waiting in a queue (Admin `ListQueue`), in offer order.
pub(crate) fn queued_reservation(e: &proto::QueuedReservation) -> Value {
    json!({
        "position": e.position,
        "reservation_id": e.reservation_id,
        "holder": e.holder,
        "quantity": e.quantity,
        "since": time(e.since.as_ref()),
        "until": time(e.until.as_ref()),
    })
}

/// An operator action.
pub fn audit_entry(a: &proto::AuditEntry) -> Value {
    value(shapes::AuditEntry::of(a))
}

/// A page of reservations.
pub fn reservations(list: &[proto::Reservation], next_page_token: &str) -> Value {
    json!({
        "reservations": list.iter().map(reservation).collect::<Vec<_>>(),
        "next_page_token": next_page_token,
    })
}

/// The gRPC code's name, as in the proto (`INVALID_ARGUMENT`).
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// An error answer as JSON: `{"code","reason","message","metadata"}` (SPEC 8.4) - the HTTP
/// API's error bodies (and a Watch stream's `error` event) and the CLI's `--json` errors.
/// `reason` and `metadata` come from the `google.rpc.ErrorInfo` (`reason` null without one),
/// plus the field a `google.rpc.BadRequest` names and a `google.rpc.RetryInfo`'s delay as
/// `retry_after_seconds` (whole seconds, rounded up).
pub fn error(status: &tonic::Status) -> serde_json::Value {
    let details = status.get_error_details();
    let info = details.error_info();
    let mut metadata: BTreeMap<String, String> = info
        .map(|i| {
            i.metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    if let Some(violation) = details
        .bad_request()
        .and_then(|b| b.field_violations.first())
    {
        metadata
            .entry("field".to_owned())
            .or_insert_with(|| violation.field.clone());
    }
    // google.rpc.RetryInfo (UNAVAILABLE, RESOURCE_EXHAUSTED): when to try again, in whole
    // seconds rounded up (also sent as Retry-After by `respond`).
    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
        let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        metadata.insert("retry_after_seconds".to_owned(), seconds.to_string());
    }
    serde_json::json!({
        "code": code_name(status.code()),
        "reason": info.map(|i| i.reason.clone()),
        "message": status.message(),
        "metadata": metadata,
    })
}

/// A timestamp as UTC, or null.
pub fn time(t: Option<&prost_types::Timestamp>) -> Value {
    utc_text(t).map_or(Value::Null, Value::String)
}

/// A timestamp as RFC 3339 text in UTC with milliseconds, if it is a valid instant: the one
/// way every shape writes time ([`time`], [`shapes`]).
fn utc_text(t: Option<&prost_types::Timestamp>) -> Option<String> {
    t.and_then(utc)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// A protobuf timestamp as a chrono one, if it is a valid instant.
pub(crate) fn utc(t: &prost_types::Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(t.nanos).ok()?;
    DateTime::from_timestamp(t.seconds, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_present_by_its_proto_name_and_enums_by_name() {
        let r = proto::Reservation {
            id: "r1".into(),
            state: proto::reservation::State::Held as i32,
            hold_token: "secret".into(),
            created_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000_000,
            }),
            branches: vec![proto::Branch {
                participant: "seats".into(),
                state: proto::branch::State::Held as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = reservation(&r);
        assert_eq!(v["state"], "HELD");
        assert_eq!(v["created_at"], "2023-11-14T22:13:20.005Z");
        assert_eq!(v["expires_at"], Value::Null);
        assert_eq!(v["branches"][0]["state"], "HELD");
        assert_eq!(v["refund"], Value::Null);
        assert!(!v.to_string().contains("secret"), "no hold token: {v}");
        assert!(v.as_object().unwrap().contains_key("audit"));
        assert_eq!(v["payments"], json!([]));
        assert_eq!(v["queue"], Value::Null, "not queued: null");
    }

    #[test]
    fn a_queue_entry_comes_in_declaration_order() {
        let e = proto::QueuedReservation {
            position: 2,
            reservation_id: "r2".into(),
            holder: "bob".into(),
            quantity: 1,
            since: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            until: None,
        };
        assert_eq!(
            queued_reservation(&e).to_string(),
            r#"{"position":2,"reservation_id":"r2","holder":"bob","quantity":1,"since":"2023-11-14T22:13:20.000Z","until":null}"#
        );
    }

    /// The keys of a JSON object, in the order they are written.
    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn fields_come_in_the_protos_declaration_order() {
        let r = proto::Reservation {
            id: "r1".into(),
            hold_token: "secret".into(),
            branches: vec![proto::Branch::default()],
            refund: Some(proto::Refund::default()),
            payments: vec![proto::reservation::PaymentRecord::default()],
            audit: vec![proto::AuditEntry::default()],
            queue: Some(proto::QueuePlace {
                during: Some(proto::Interval::default()),
                ..Default::default()
            }),
            labels: [
                ("z".to_owned(), "1".to_owned()),
                ("a".to_owned(), "2".to_owned()),
            ]
            .into(),
            ..Default::default()
        };
        let v = reservation(&r);
        let fields = [
            "id",
            "request_id",
            "holder",
            "state",
            "created_at",
            "expires_at",
            "extensions_used",
            "branches",
            "rejection",
            "refund",
            "late_payment_honored",
            "labels",
            "audit",
            "payments",
            "queue",
        ];
        assert_eq!(keys(&v), fields);
        assert_eq!(
            keys(&v["queue"]),
            [
                "position",
                "participant",
                "resource",
                "during",
                "since",
                "until"
            ]
        );
        assert_eq!(keys(&v["queue"]["during"]), ["start", "end"]);
        assert!(
            v.to_string().starts_with(r#"{"id":"r1","request_id":"#),
            "{v}"
        );
        assert_eq!(keys(&v["labels"]), ["a", "z"], "map keys sorted");
        assert_eq!(
            keys(&v["branches"][0]),
            [
                "participant",
                "resource",
                "quantity",
                "during",
                "state",
                "attempts",
                "last_error"
            ]
        );
        assert_eq!(
            keys(&v["refund"]),
            [
                "refund_id",
                "state",
                "amount_minor",
                "currency",
                "failure_reason"
            ]
        );
        assert_eq!(
            keys(&v["payments"][0]),
            [
                "participant",
                "payment_ref",
                "amount_minor",
                "currency",
                "state",
                "refund_id"
            ]
        );
        assert_eq!(
            keys(&v["audit"][0]),
            [
                "reservation_id",
                "principal",
                "at",
                "action",
                "reason",
                "participant"
            ]
        );
        // Reserve's answer: the token in its place, after the state.
        let with = reservation_with_token(&r);
        assert_eq!(
            keys(&with)[..5],
            ["id", "request_id", "holder", "state", "hold_token"]
        );
        assert_eq!(with["hold_token"], "secret");
    }

    #[test]
    fn an_event_as_bytes_is_the_text_of_its_value() {
        let at = |seconds| {
            Some(prost_types::Timestamp {
                seconds,
                nanos: 7_000_000,
            })
        };
        let during = Some(proto::Interval {
            start: at(1_700_000_000),
            end: at(1_700_003_600),
        });
        let e = proto::Event {
            sequence: 42,
            event_id: "e\"1".into(),
            r#type: proto::event::Type::ReservationHeld as i32,
            occurred_at: at(1_700_000_001),
            reservation: Some(proto::Reservation {
                id: "r1".into(),
                hold_token: "secret".into(),
                state: proto::reservation::State::Held as i32,
                expires_at: at(1_700_000_600),
                branches: vec![proto::Branch {
                    participant: "rooms".into(),
                    quantity: 2,
                    during,
                    ..Default::default()
                }],
                rejection: Some(proto::Rejection::default()),
                refund: Some(proto::Refund::default()),
                labels: [
                    ("b".to_owned(), "ü".to_owned()),
                    ("a".to_owned(), "".to_owned()),
                ]
                .into(),
                audit: vec![proto::AuditEntry::default()],
                payments: vec![proto::reservation::PaymentRecord::default()],
                queue: Some(proto::QueuePlace {
                    during,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            owner: "shop".into(),
            from_queue: true,
        };
        let bytes = event_bytes(&e).unwrap();
        assert_eq!(String::from_utf8(bytes).unwrap(), event(&e).to_string());
        assert_eq!(
            keys(&event(&e)),
            [
                "sequence",
                "event_id",
                "type",
                "occurred_at",
                "reservation",
                "owner",
                "from_queue"
            ]
        );
        assert!(
            !event(&e).to_string().contains("secret"),
            "no hold token in an event"
        );
    }

    #[test]
    fn payments_show_every_field_and_their_state_by_name() {
        use proto::reservation::PaymentRecord;
        use proto::reservation::payment_record::State;
        let r = proto::Reservation {
            payments: vec![
                PaymentRecord {
                    participant: "payments".into(),
                    payment_ref: "pay-1".into(),
                    amount_minor: 4_200,
                    currency: "EUR".into(),
                    state: State::Applied as i32,
                    refund_id: String::new(),
                },
                PaymentRecord {
                    participant: "payments".into(),
                    payment_ref: "pay-2".into(),
                    amount_minor: 1_500,
                    currency: "EUR".into(),
                    state: State::Refunded as i32,
                    refund_id: "f0".into(),
                },
            ],
            ..Default::default()
        };
        let v = reservation(&r);
        assert_eq!(
            v["payments"],
            json!([
                {"participant": "payments", "payment_ref": "pay-1", "amount_minor": 4200,
                 "currency": "EUR", "state": "APPLIED", "refund_id": ""},
                {"participant": "payments", "payment_ref": "pay-2", "amount_minor": 1500,
                 "currency": "EUR", "state": "REFUNDED", "refund_id": "f0"},
            ])
        );
    }
}
