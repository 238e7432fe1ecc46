//! The server as a tool sees it: reflection (v1 and v1alpha) so grpcurl needs no proto files,
//! the health service, and reads (Get, List) that never reveal hold tokens.

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tokio_stream::StreamExt;
use tonic_reflection::pb::v1 as refl;
use tonic_reflection::pb::v1alpha as refl_alpha;

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn reflection_lists_and_describes_the_services(pool: PgPool) {
    let (app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let url = format!("http://{}", app.addr);

    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = refl::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let requests = tokio_stream::iter(vec![
        refl::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                refl::server_reflection_request::MessageRequest::ListServices(String::new()),
            ),
        },
        refl::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                refl::server_reflection_request::MessageRequest::FileContainingSymbol(
                    "tcc.v1.Coordinator".into(),
                ),
            ),
        },
    ]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(list)) = responses.next().await else {
        panic!("no ListServices answer")
    };
    let Some(refl::server_reflection_response::MessageResponse::ListServicesResponse(services)) =
        list.message_response
    else {
        panic!("unexpected answer")
    };
    let names: Vec<String> = services.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "tcc.v1.Coordinator",
        "tcc.v1.Admin",
        "tcc.v1.Events",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    // Only what this port serves: the participants' services live on their own ports.
    for elsewhere in [
        "tcc.v1.Participant",
        "tcc.v1.Payments",
        "tcc.v1.ResourceAdmin",
    ] {
        assert!(
            !names.iter().any(|n| n == elsewhere),
            "{elsewhere} not in {names:?}"
        );
    }
    let Some(Ok(file)) = responses.next().await else {
        panic!("no FileContainingSymbol answer")
    };
    assert!(matches!(
        file.message_response,
        Some(refl::server_reflection_response::MessageResponse::FileDescriptorResponse(ref f))
            if !f.file_descriptor_proto.is_empty()
    ));

    // Older clients (grpcurl, Python grpcio) speak only v1alpha.
    let mut alpha =
        refl_alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let mut responses = alpha
        .server_reflection_info(tokio_stream::iter(vec![
            refl_alpha::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(
                    refl_alpha::server_reflection_request::MessageRequest::ListServices(
                        String::new(),
                    ),
                ),
            },
        ]))
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(list)) = responses.next().await else {
        panic!("no v1alpha answer")
    };
    let Some(refl_alpha::server_reflection_response::MessageResponse::ListServicesResponse(s)) =
        list.message_response
    else {
        panic!("unexpected answer")
    };
    assert!(s.service.iter().any(|x| x.name == "tcc.v1.Coordinator"));

    // Health reports the coordinator SERVING.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let st = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "tcc.v1.Coordinator".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        st.status,
        i32::from(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );
}

#[sqlx::test(migrations = false)]
async fn list_pages_filters_and_never_returns_tokens(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let mut req = reserve_request(&format!("r{i}"), vec![hold("seats", &format!("A{i}"))]);
        req.holder = if i < 3 { "alice".into() } else { "bob".into() };
        let r = app.client.reserve(req).await.unwrap().into_inner();
        ids.push((r.id, r.hold_token));
    }
    // Cancel one of alice's.
    app.client
        .cancel(Decide::with_token(&ids[0].0, &ids[0].1).cancel())
        .await
        .unwrap();

    let mut seen = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = app
            .client
            .list_reservations(proto::ListReservationsRequest {
                holder: "alice".into(),
                page_size: 2,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.reservations.len() <= 2);
        for r in &page.reservations {
            assert!(r.hold_token.is_empty(), "List never returns tokens");
            assert_eq!(r.holder, "alice");
            seen.push(r.id.clone());
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let expected: Vec<String> = ids[..3].iter().rev().map(|(id, _)| id.clone()).collect();
    assert_eq!(seen, expected, "newest first, each once");

    let held = app
        .client
        .list_reservations(proto::ListReservationsRequest {
            state: State::Held.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.reservations.len(), 4);
    let cancelled = app
        .client
        .list_reservations(proto::ListReservationsRequest {
            holder: "alice".into(),
            state: State::Cancelled.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.reservations.len(), 1);
    assert_eq!(cancelled.reservations[0].id, ids[0].0);

    let got = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: ids[1].0.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.hold_token.is_empty(), "Get never returns the token");
    assert_eq!(state_of(&got), State::Held);
}
