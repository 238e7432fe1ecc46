//! ListReservations' participant, creation-time and label filters over gRPC: what they select,
//! and the refusals of bad filters (each naming its field).

use holdfast::proto;
use sqlx::PgPool;

use crate::common::{error_metadata, hold, reason, reserve_request, spawn_with_fakes};

#[sqlx::test(migrations = false)]
async fn filters_select_and_bad_filters_name_their_field(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    let mut at_seats = reserve_request("f-1", vec![hold("seats", "A1")]);
    at_seats.labels.insert("shop".into(), "eu".into());
    let a = app.client.reserve(at_seats).await.unwrap().into_inner();
    let b = app
        .client
        .reserve(reserve_request("f-2", vec![hold("stock", "sku-1")]))
        .await
        .unwrap()
        .into_inner();

    let list = |req: proto::ListReservationsRequest| {
        let mut client = app.client.clone();
        async move { client.list_reservations(req).await }
    };
    let seats = list(proto::ListReservationsRequest {
        participant: "seats".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(seats.reservations.len(), 1);
    assert_eq!(seats.reservations[0].id, a.id);
    let mut eu = proto::ListReservationsRequest::default();
    eu.labels.insert("shop".into(), "eu".into());
    let eu = list(eu).await.unwrap().into_inner();
    assert_eq!(eu.reservations.len(), 1);
    assert_eq!(eu.reservations[0].id, a.id);
    let since_b = list(proto::ListReservationsRequest {
        created_after: b.created_at,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(since_b.reservations.len(), 1);
    assert_eq!(since_b.reservations[0].id, b.id);
    let before_b = list(proto::ListReservationsRequest {
        created_before: b.created_at,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(before_b.reservations.len(), 1);
    assert_eq!(before_b.reservations[0].id, a.id);

    let mut five = proto::ListReservationsRequest::default();
    for i in 0..5 {
        five.labels.insert(format!("k{i}"), "v".into());
    }
    let mut empty_key = proto::ListReservationsRequest::default();
    empty_key.labels.insert(String::new(), "v".into());
    for (req, field) in [
        (five, "labels"),
        (empty_key, "labels[\"\"]"),
        (
            proto::ListReservationsRequest {
                participant: "p".repeat(129),
                ..Default::default()
            },
            "participant",
        ),
        (
            proto::ListReservationsRequest {
                created_after: b.created_at,
                created_before: a.created_at,
                ..Default::default()
            },
            "created_after",
        ),
        (
            proto::ListReservationsRequest {
                created_before: Some(prost_types::Timestamp {
                    seconds: 0,
                    nanos: -1,
                }),
                ..Default::default()
            },
            "created_before",
        ),
    ] {
        let e = list(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert_eq!(reason(&e), "INVALID_ARGUMENT");
        assert_eq!(error_metadata(&e)["field"], field, "{e:?}");
    }
}
