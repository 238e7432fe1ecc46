//! A hold the participant finds malformed (a seat of quantity 2, a room without a slot) is the
//! caller's mistake, not a sold-out resource: Reserve answers `INVALID_ARGUMENT` naming the
//! caller's field, and nothing stays recorded - no reservation to read or list, the
//! request_id free for the corrected request, nothing held at any participant.

use std::time::{SystemTime, UNIX_EPOCH};

use holdfast::participants::Kind::{Rooms, Seats};
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::{Code, Status};

use crate::common::{error_metadata, reason, state_of};
use crate::real::*;

/// A room hold covering now (so the room's counts show it).
fn room(resource: &str) -> proto::Hold {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    proto::Hold {
        during: Some(proto::Interval {
            start: Some(prost_types::Timestamp {
                seconds: now - 3600,
                nanos: 0,
            }),
            end: Some(prost_types::Timestamp {
                seconds: now + 3600,
                nanos: 0,
            }),
        }),
        ..hold(Rooms, resource, 1)
    }
}

/// The field a `google.rpc.BadRequest` of `err` names.
fn bad_field(err: &Status) -> String {
    use tonic_types::StatusExt;
    let details = err.get_error_details();
    let violations = details
        .bad_request()
        .map(|b| b.field_violations.clone())
        .unwrap_or_default();
    assert_eq!(violations.len(), 1, "one field violation: {err:?}");
    violations[0].field.clone()
}

/// Reserve answers INVALID_ARGUMENT naming `field`, with no reservation id.
fn assert_invalid(err: &Status, field: &str) {
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(reason(err), "INVALID_ARGUMENT", "{err:?}");
    assert_eq!(bad_field(err), field, "{err:?}");
    assert!(err.message().starts_with(field), "{}", err.message());
    assert!(
        !error_metadata(err).contains_key("reservation_id"),
        "nothing recorded, so no id: {err:?}"
    );
}

async fn listed(stack: &Stack, holder: &str) -> Vec<proto::Reservation> {
    stack
        .client()
        .list_reservations(proto::ListReservationsRequest {
            holder: holder.to_owned(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .reservations
}

#[sqlx::test(migrations = false)]
async fn holds_a_participant_finds_invalid_are_invalid_argument_and_record_nothing(pool: PgPool) {
    let stack = spawn_stack(pool).await;
    stack.put(Seats, &[("A1", 1), ("A2", 1)]).await;
    stack.put(Rooms, &[("blue", 1), ("green", 1)]).await;
    let mut client = stack.client();

    // A seat holds exactly one.
    let err = client
        .reserve(reserve(
            "r-seat",
            "holder-seat",
            None,
            vec![hold(Seats, "A1", 2)],
        ))
        .await
        .expect_err("a seat of quantity 2 is refused");
    assert_invalid(&err, "holds[0].quantity");
    assert!(listed(&stack, "holder-seat").await.is_empty());
    assert_eq!(stack.counts(Seats, "A1").await, (1, 0, 0));
    // The corrected request under the same request_id: nothing was recorded, so it is new.
    let r = client
        .reserve(reserve(
            "r-seat",
            "holder-seat",
            None,
            vec![hold(Seats, "A1", 1)],
        ))
        .await
        .expect("the corrected request holds")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(listed(&stack, "holder-seat").await.len(), 1);

    // A room needs a slot.
    let err = client
        .reserve(reserve(
            "r-room",
            "holder-room",
            None,
            vec![hold(Rooms, "blue", 1)],
        ))
        .await
        .expect_err("a room without during is refused");
    assert_invalid(&err, "holds[0].during");
    assert!(listed(&stack, "holder-room").await.is_empty());
    let r = client
        .reserve(reserve("r-room", "holder-room", None, vec![room("blue")]))
        .await
        .expect("the corrected request holds")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");

    // Two participants: rooms comes first in canonical order and holds, then seats refuses the
    // hold the caller listed first. The room is released and nothing stays recorded.
    let err = client
        .reserve(reserve(
            "r-both",
            "holder-both",
            None,
            vec![hold(Seats, "A2", 2), room("green")],
        ))
        .await
        .expect_err("the seat of quantity 2 is refused");
    assert_invalid(&err, "holds[0].quantity");
    assert!(listed(&stack, "holder-both").await.is_empty());
    assert_eq!(
        stack.counts(Rooms, "green").await,
        (1, 0, 0),
        "room released"
    );
    assert_eq!(stack.counts(Seats, "A2").await, (1, 0, 0));
    let r = client
        .reserve(reserve(
            "r-both",
            "holder-both",
            None,
            vec![hold(Seats, "A2", 1), room("green")],
        ))
        .await
        .expect("the corrected request holds")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(stack.counts(Rooms, "green").await, (0, 1, 0));
    assert_eq!(stack.counts(Seats, "A2").await, (0, 1, 0));
    stack.stop().await;
}
