//! ForceCancel, Resolve, ListStuck and ListAudit: what each changes (at the participants too),
//! what it records, and how the audit shows on the reservation.

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tokio_stream::StreamExt;

use super::{ops, state};
use crate::common::reserve_request;

#[sqlx::test(migrations = false)]
async fn force_cancel_releases_every_branch_and_is_audited(pool: PgPool) {
    let mut ops = ops(pool).await;
    let r = ops.held("fc-1").await;
    assert_eq!(ops.fakes.get("seats").held(), vec!["A1"]);
    assert_eq!(ops.fakes.get("stock").held(), vec!["sku-1"]);

    let req = ops.as_admin(proto::ForceCancelRequest {
        reservation_id: r.id.clone(),
        reason: "customer called support".into(),
    });
    let c = ops.admin.force_cancel(req).await.unwrap().into_inner();

    assert_eq!(state(&c), State::Cancelled);
    // Each participant told once per branch, as a Cancel would; nothing held anywhere.
    ops.fakes.log.assert_once_per_branch("seats", "Cancel", 1);
    ops.fakes.log.assert_once_per_branch("stock", "Cancel", 1);
    assert!(ops.fakes.get("seats").held().is_empty());
    assert!(ops.fakes.get("stock").held().is_empty());
    // Audited: the admin's name, the reason, the database's time; shown on the answer and on
    // every later read.
    assert_eq!(c.audit.len(), 1, "{c:?}");
    let e = &c.audit[0];
    assert_eq!(
        (e.principal.as_str(), e.action.as_str(), e.reason.as_str()),
        ("ops", "force_cancel", "customer called support")
    );
    assert_eq!(e.reservation_id, r.id);
    assert!(e.at.is_some());
    assert_eq!(ops.get(&r.id).await.audit, c.audit);

    // A second ForceCancel finds it closed: FAILED_PRECONDITION with the state, no new entry.
    let again = ops
        .admin
        .force_cancel(ops.as_admin(proto::ForceCancelRequest {
            reservation_id: r.id.clone(),
            reason: "again".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert_eq!(crate::common::reason(&again), "RESERVATION_CLOSED");
    assert_eq!(crate::common::error_metadata(&again)["state"], "CANCELLED");
    assert_eq!(ops.audit_len().await, 1);
}

#[sqlx::test(migrations = false)]
async fn force_cancel_of_a_placement_in_flight_releases_what_it_placed(pool: PgPool) {
    // The stalled Try's answer is waited for long enough that ForceCancel surely comes first.
    let mut ops = super::ops_with(pool, std::time::Duration::from_secs(10)).await;
    // seats holds; stock's Try lands and its answer never comes back in time.
    ops.fakes
        .get("stock")
        .behaviour
        .stall_after_try
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut client = ops.app.client.clone();
    let reserve = ops.as_shop(reserve_request(
        "fc-trying",
        vec![
            crate::common::hold("seats", "A1"),
            crate::common::hold("stock", "sku-1"),
        ],
    ));
    let placing = tokio::spawn(async move { client.reserve(reserve).await });
    // Wait for the Try at stock (the second participant), then find the TRYING reservation.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while ops.fakes.log.count("stock", "Try") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "stock never tried");
        tokio::task::yield_now().await;
    }
    let id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM reservations WHERE state = 'TRYING'")
        .fetch_one(&ops.app.pool)
        .await
        .unwrap();

    let c = ops
        .admin
        .force_cancel(ops.as_admin(proto::ForceCancelRequest {
            reservation_id: id.to_string(),
            reason: "stuck checkout".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&c), State::Cancelled, "{c:?}");
    // Both branches released: the one held and the one whose Try is still unanswered.
    assert!(ops.fakes.get("seats").held().is_empty());
    assert!(ops.fakes.get("stock").held().is_empty());
    assert!(ops.fakes.log.count("stock", "Cancel") >= 1);
    // The placement, when it gives up, finds the reservation released and leaves it so.
    let answer = placing.await.unwrap();
    assert!(answer.is_err(), "{answer:?}");
    let after = ops.get(&id.to_string()).await;
    assert_eq!(state(&after), State::Cancelled);
    assert_eq!(after.audit.len(), 1);
}

#[sqlx::test(migrations = false)]
async fn resolve_settles_a_failed_reservation_once(pool: PgPool) {
    let mut ops = ops(pool).await;
    let lost = ops.failed("res-1").await;
    let other = ops.failed("res-2").await;

    let c = ops
        .admin
        .resolve(ops.as_admin(proto::ResolveRequest {
            reservation_id: lost.id.clone(),
            outcome: State::Confirmed.into(),
            reason: "seats confirmed by hand at the box office".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&c), State::Confirmed);
    assert_eq!(c.audit.len(), 1);
    assert_eq!(c.audit[0].action, "resolve_confirmed");
    assert_eq!(c.audit[0].principal, "ops");
    assert!(c.refund.is_none(), "no payment, no refund");

    let d = ops
        .admin
        .resolve(ops.as_admin(proto::ResolveRequest {
            reservation_id: other.id.clone(),
            outcome: State::Cancelled.into(),
            reason: "released by hand".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&d), State::Cancelled);
    assert_eq!(d.audit[0].action, "resolve_cancelled");

    // Terminal now: a second Resolve is refused with the state, and changes nothing.
    let again = ops
        .admin
        .resolve(ops.as_admin(proto::ResolveRequest {
            reservation_id: lost.id.clone(),
            outcome: State::Cancelled.into(),
            reason: "changed my mind".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert_eq!(crate::common::reason(&again), "RESERVATION_NOT_FAILED");
    assert_eq!(crate::common::error_metadata(&again)["state"], "CONFIRMED");
    assert_eq!(state(&ops.get(&lost.id).await), State::Confirmed);
    assert_eq!(ops.audit_len().await, 2);
}

#[sqlx::test(migrations = false)]
async fn list_stuck_and_list_audit_page_newest_first(pool: PgPool) {
    let mut ops = ops(pool).await;
    let fine = ops.held("ok-1").await;
    let f1 = ops.failed("stuck-1").await;
    let f2 = ops.failed("stuck-2").await;

    let page = |token: &str, size: i32| proto::ListStuckRequest {
        page_size: size,
        page_token: token.to_owned(),
        ..Default::default()
    };
    let first = ops
        .admin
        .list_stuck(ops.as_admin(page("", 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.reservations.len(), 1);
    assert_eq!(first.reservations[0].id, f2.id, "newest first");
    let second = ops
        .admin
        .list_stuck(ops.as_admin(page(&first.next_page_token, 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.reservations[0].id, f1.id);
    // The live HELD one is not stuck: no further page.
    assert_eq!(second.next_page_token, "", "{second:?}");
    assert_ne!(second.reservations[0].id, fine.id);

    // Filters: a state that matches none, a participant none of them uses, an age none has.
    let none = ops
        .admin
        .list_stuck(ops.as_admin(proto::ListStuckRequest {
            states: vec![State::Confirming.into()],
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(none.reservations.is_empty());
    let seats_only = ops
        .admin
        .list_stuck(ops.as_admin(proto::ListStuckRequest {
            states: vec![State::Failed.into()],
            participant: "seats".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seats_only.reservations.len(), 2);
    let old = ops
        .admin
        .list_stuck(ops.as_admin(proto::ListStuckRequest {
            older_than: Some(crate::common::proto_duration(
                std::time::Duration::from_secs(3600),
            )),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(old.reservations.is_empty());

    // Two actions, then the log newest first, one page at a time, and by reservation.
    for (r, why) in [(&f1, "first"), (&f2, "second")] {
        ops.admin
            .resolve(ops.as_admin(proto::ResolveRequest {
                reservation_id: r.id.clone(),
                outcome: State::Cancelled.into(),
                reason: why.into(),
            }))
            .await
            .unwrap();
    }
    let a1 = ops
        .admin
        .list_audit(ops.as_admin(proto::ListAuditRequest {
            page_size: 1,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a1.entries.len(), 1);
    assert_eq!(a1.entries[0].reason, "second");
    let a2 = ops
        .admin
        .list_audit(ops.as_admin(proto::ListAuditRequest {
            page_size: 1,
            page_token: a1.next_page_token.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a2.entries[0].reason, "first");
    assert!(
        a2.next_page_token.is_empty() || {
            let a3 = ops
                .admin
                .list_audit(ops.as_admin(proto::ListAuditRequest {
                    page_size: 1,
                    page_token: a2.next_page_token.clone(),
                    ..Default::default()
                }))
                .await
                .unwrap()
                .into_inner();
            a3.entries.is_empty()
        }
    );
    let mine = ops
        .admin
        .list_audit(ops.as_admin(proto::ListAuditRequest {
            reservation_id: f1.id.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.entries.len(), 1);
    assert_eq!(mine.entries[0].reservation_id, f1.id);

    // The audit shows on List and Watch answers too (oldest first), also to the owner.
    let listed = ops
        .app
        .client
        .list_reservations(ops.as_shop(proto::ListReservationsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let l1 = listed.reservations.iter().find(|r| r.id == f1.id).unwrap();
    assert_eq!(l1.audit.len(), 1);
    assert_eq!(l1.audit[0].reason, "first");
    let mut watch = ops
        .app
        .client
        .watch_reservation(ops.as_shop(proto::WatchReservationRequest {
            reservation_id: f2.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    let w = watch.next().await.unwrap().unwrap();
    assert_eq!(w.audit.len(), 1);
    assert_eq!(w.audit[0].reason, "second");

    // Deleting a finished reservation (retention) takes its entries with it.
    sqlx::query("DELETE FROM reservations WHERE id = $1")
        .bind(uuid::Uuid::parse_str(&f1.id).unwrap())
        .execute(&ops.app.pool)
        .await
        .unwrap();
    assert_eq!(ops.audit_len().await, 1);
}
