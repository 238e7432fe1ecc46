//! Every input limit of SPEC 3.2 is refused with INVALID_ARGUMENT naming the field, before
//! anything is written or any participant is called.

use holdfast::proto;
use sqlx::PgPool;
use tonic::Code;
use tonic_types::StatusExt;

use crate::common::*;

/// A change that makes a request invalid.
type Mutation<'a> = Box<dyn Fn(&mut proto::ReserveRequest) + 'a>;

fn base() -> proto::ReserveRequest {
    reserve_request("r1", vec![hold("seats", "A1")])
}

#[sqlx::test(migrations = false)]
async fn every_reserve_limit_names_its_field(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let long = "x".repeat(129);
    let ts = |s: i64| prost_types::Timestamp {
        seconds: s,
        nanos: 0,
    };
    let cases: Vec<(&str, Mutation)> = vec![
        ("request_id", Box::new(|r| r.request_id.clear())),
        ("request_id", Box::new(|r| r.request_id = long.clone())),
        ("holder", Box::new(|r| r.holder.clear())),
        ("holder", Box::new(|r| r.holder = long.clone())),
        ("holds", Box::new(|r| r.holds.clear())),
        (
            "holds",
            Box::new(|r| r.holds = (0..65).map(|i| hold("seats", &i.to_string())).collect()),
        ),
        (
            "holds[0].resource",
            Box::new(|r| r.holds[0].resource = long.clone()),
        ),
        (
            "holds[0].resource",
            Box::new(|r| r.holds[0].resource.clear()),
        ),
        (
            "holds[1].quantity",
            Box::new(|r| {
                r.holds.push(hold("seats", "A2"));
                r.holds[1].quantity = 0;
            }),
        ),
        (
            "holds[0].participant",
            Box::new(|r| r.holds[0].participant.clear()),
        ),
        (
            "holds[0].during",
            Box::new(|r| {
                r.holds[0].during = Some(proto::Interval {
                    start: Some(ts(200)),
                    end: Some(ts(100)),
                })
            }),
        ),
        (
            "holds[0].during.end",
            Box::new(|r| {
                r.holds[0].during = Some(proto::Interval {
                    start: Some(ts(100)),
                    end: None,
                })
            }),
        ),
        ("holds[1]", Box::new(|r| r.holds.push(hold("seats", "A1")))),
        (
            "ttl",
            Box::new(|r| {
                r.ttl = Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 500_000_000,
                })
            }),
        ),
        (
            "ttl",
            Box::new(|r| {
                r.ttl = Some(prost_types::Duration {
                    seconds: 3601,
                    nanos: 0,
                })
            }),
        ),
        (
            "ttl",
            Box::new(|r| {
                r.ttl = Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                })
            }),
        ),
        (
            "labels",
            Box::new(|r| r.labels = (0..17).map(|i| (i.to_string(), "v".into())).collect()),
        ),
        (
            "labels[\"k\"]",
            Box::new(|r| {
                r.labels.insert("k".into(), "v".repeat(257));
            }),
        ),
    ];
    for (field, mutate) in &cases {
        let mut req = base();
        mutate(&mut req);
        let err = app.client.reserve(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert_eq!(reason(&err), "INVALID_ARGUMENT");
        assert_eq!(error_metadata(&err)["field"], *field, "{err:?}");
        assert!(
            err.message().starts_with(field),
            "message names the field: {}",
            err.message()
        );
        let bad = err.get_details_bad_request().expect("BadRequest detail");
        assert_eq!(bad.field_violations[0].field, *field);
    }

    // Unknown participant is NOT_FOUND, naming the hold as listed.
    let mut req = base();
    req.holds.push(hold("nobody", "x"));
    let err = app.client.reserve(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(reason(&err), "UNKNOWN_PARTICIPANT");
    assert_eq!(error_metadata(&err)["field"], "holds[1].participant");

    // Nothing was written, nobody was called.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    assert!(fakes.log.calls().is_empty());
}

#[sqlx::test(migrations = false)]
async fn other_methods_name_their_fields(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats", "payments"]).await;
    let err = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: "not-a-uuid".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(error_metadata(&err)["field"], "reservation_id");

    let missing = uuid::Uuid::new_v4().to_string();
    let err = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: missing.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(reason(&err), "RESERVATION_NOT_FOUND");

    let err = app
        .client
        .confirm(Decide::with_token(&missing, "").confirm())
        .await
        .unwrap_err();
    assert_eq!(error_metadata(&err)["field"], "hold_token");

    let err = app
        .client
        .confirm(
            Decide::with_token(&missing, "t").confirm_with(&proto::Payment {
                participant: "payments".into(),
                payment_ref: "p1".into(),
                amount_minor: 100,
                currency: "euro".into(),
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(error_metadata(&err)["field"], "payment.currency");

    let err = app
        .client
        .cancel(Decide::with_token(&missing, "t").cancel_because(&"r".repeat(257)))
        .await
        .unwrap_err();
    assert_eq!(error_metadata(&err)["field"], "reason");

    let err = app
        .client
        .list_reservations(proto::ListReservationsRequest {
            page_token: "garbage".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error_metadata(&err)["field"], "page_token");

    let err = app
        .client
        .list_reservations(proto::ListReservationsRequest {
            state: 42,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error_metadata(&err)["field"], "state");
}

#[sqlx::test(migrations = false)]
async fn oversized_requests_are_refused(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let mut req = base();
    req.request_id = "x".repeat(2 * 1024 * 1024);
    let err = app.client.reserve(req).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
}
