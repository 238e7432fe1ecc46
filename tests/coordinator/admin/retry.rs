//! Retry: a participant that was down and is back gets its calls within the Retry itself, not
//! after the backoff (an hour here; nothing else drives the reservation during the test).

use std::sync::atomic::Ordering;

use holdfast::proto;
use holdfast::proto::reservation::State;
use holdfast::proto::retry_request::Target;
use sqlx::PgPool;

use super::{Ops, ops, state};
use crate::common::Decide;

/// A reservation CONFIRMING because stock failed its Confirm: backing off for an hour.
async fn confirming(ops: &mut Ops, request_id: &str) -> proto::Reservation {
    let r = ops.held(request_id).await;
    ops.fakes
        .get("stock")
        .behaviour
        .fail_confirms
        .store(1, Ordering::SeqCst);
    let c = ops
        .app
        .client
        .confirm(ops.as_shop(Decide::on(&r).confirm()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&c), State::Confirming);
    // The next attempt is far away: only the Retry can explain a prompt finish.
    let wait: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 \
         FROM reservations WHERE id = $1",
    )
    .bind(uuid::Uuid::parse_str(&r.id).unwrap())
    .fetch_one(&ops.app.pool)
    .await
    .unwrap();
    assert!(wait > 600.0, "backoff of {wait} s");
    c
}

#[sqlx::test(migrations = false)]
async fn retry_by_participant_drives_its_backlog_within_the_call(pool: PgPool) {
    let mut ops = ops(pool).await;
    let c = confirming(&mut ops, "rt-1").await;
    assert_eq!(ops.fakes.get("stock").held(), vec!["sku-1"]);

    // It is listed as stuck, at stock, with the branch error.
    let stuck = ops
        .admin
        .list_stuck(ops.as_admin(proto::ListStuckRequest {
            participant: "stock".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stuck.reservations.len(), 1);
    assert!(
        stuck.reservations[0]
            .branches
            .iter()
            .any(|b| !b.last_error.is_empty())
    );

    // stock is back (fail_confirms spent); the Retry drives it now.
    let answer = ops
        .admin
        .retry(ops.as_admin(proto::RetryRequest {
            target: Some(Target::Participant("stock".into())),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.driven, 1);
    assert_eq!(answer.reservations.len(), 1);
    assert_eq!(answer.reservations[0].id, c.id);
    assert_eq!(state(&answer.reservations[0]), State::Confirmed);
    assert!(ops.fakes.get("stock").held().is_empty());
    assert_eq!(ops.fakes.get("stock").effects().0, 1, "confirmed once");
    // Audited with no reservation and the participant named.
    let log = ops
        .admin
        .list_audit(ops.as_admin(proto::ListAuditRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(log.entries.len(), 1);
    let e = &log.entries[0];
    assert_eq!(
        (
            e.action.as_str(),
            e.participant.as_str(),
            e.reservation_id.as_str(),
            e.principal.as_str()
        ),
        ("retry", "stock", "", "ops")
    );
    // Given no reason, the entry says what was retried.
    assert_eq!(
        e.reason,
        "retry requested: backoff cleared, every reservation with unfinished work at stock driven now (no reason given)"
    );
}

#[sqlx::test(migrations = false)]
async fn retry_of_one_reservation_drives_it_within_the_call(pool: PgPool) {
    let mut ops = ops(pool).await;
    let c = confirming(&mut ops, "rt-2").await;
    let answer = ops
        .admin
        .retry(ops.as_admin(proto::RetryRequest {
            target: Some(Target::ReservationId(c.id.clone())),
            reason: "stock is back after its restart".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.driven, 1);
    let r = &answer.reservations[0];
    assert_eq!(state(r), State::Confirmed);
    assert_eq!(r.audit.len(), 1);
    assert_eq!(r.audit[0].action, "retry");
    assert_eq!(r.audit[0].reason, "stock is back after its restart");

    // Nothing left to do: answered as it is, nothing driven, still audited.
    let again = ops
        .admin
        .retry(ops.as_admin(proto::RetryRequest {
            target: Some(Target::ReservationId(c.id.clone())),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.driven, 0);
    assert_eq!(state(&again.reservations[0]), State::Confirmed);
    assert_eq!(
        ops.fakes.log.count("stock", "Confirm"),
        2,
        "no call for settled work"
    );
}
