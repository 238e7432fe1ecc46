//! Proving who calls (SPEC 7.2): no key or an unknown one is UNAUTHENTICATED, a known one
//! without the method's role is PERMISSION_DENIED, nothing changes either way and every refusal
//! is counted; health stays open; a key removed from the file stops working without a restart.

use std::time::{Duration, Instant};

use holdfast::auth::Role;
use holdfast::proto;
use sqlx::PgPool;
use tonic::{Code, Request};

use super::{Cast, Principal, keyed, refusal, reserve_seat, secured_settings, secured_shop};
use crate::common::spawn_app;

/// The count of `holdfast_auth_failures_total{reason}` in this process's metrics.
fn auth_failures(reason: &str) -> u64 {
    let text = holdfast::telemetry::metrics_handle().render();
    let wanted = format!("holdfast_auth_failures_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[sqlx::test(migrations = false)]
async fn calls_without_a_valid_credential_or_role_are_refused_counted_and_change_nothing(
    pool: PgPool,
) {
    let cast = Cast::new();
    let (app, _seats) = secured_shop(pool, &cast).await;
    let mut c = app.client.clone();
    let (unauthenticated, denied) = (
        auth_failures("UNAUTHENTICATED"),
        auth_failures("PERMISSION_DENIED"),
    );

    let none = c
        .reserve(Request::new(reserve_seat("o-1", "alice", "A1")))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&none),
        (Code::Unauthenticated, "UNAUTHENTICATED".to_owned())
    );
    assert!(none.message().contains("Bearer"), "{}", none.message());
    let unknown = c
        .reserve(keyed(reserve_seat("o-1", "alice", "A1"), "not-a-key"))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&unknown),
        (Code::Unauthenticated, "UNAUTHENTICATED".to_owned())
    );
    assert!(
        !unknown.message().contains("not-a-key"),
        "the key is never echoed"
    );
    let mut malformed = Request::new(reserve_seat("o-1", "alice", "A1"));
    malformed
        .metadata_mut()
        .insert("authorization", "Basic dXNlcjpwYXNz".parse().unwrap());
    let malformed = c.reserve(malformed).await.unwrap_err();
    assert_eq!(malformed.code(), Code::Unauthenticated);
    // The coordinator principal is no client of the coordinator.
    let wrong_role = c
        .reserve(keyed(
            reserve_seat("o-1", "alice", "A1"),
            &cast.coordinator.key,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&wrong_role),
        (Code::PermissionDenied, "PERMISSION_DENIED".to_owned())
    );

    // Nothing was recorded.
    let all = c
        .list_reservations(keyed(
            proto::ListReservationsRequest::default(),
            &cast.admin.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(all.reservations.is_empty(), "{all:?}");
    // Counted (other tests in this process may add to the counters, never subtract).
    assert!(auth_failures("UNAUTHENTICATED") >= unauthenticated + 3);
    assert!(auth_failures("PERMISSION_DENIED") > denied);

    // Health is open: probes carry no key.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    // Reflection describes the API to any principal, to nobody else.
    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(channel);
    let list = || tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let refused = reflection
        .server_reflection_info(tokio_stream::iter([list()]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    reflection
        .server_reflection_info(keyed(tokio_stream::iter([list()]), &cast.shop.key))
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn a_key_removed_from_the_file_stops_working_without_a_restart(pool: PgPool) {
    let cast = Cast::new();
    // The coordinator's own authenticator (a clone shares its file watch), to see its checks.
    let auth = cast.file.authenticator();
    let mut s = secured_settings(&cast, &[]);
    s.access.auth = auth.clone();
    let app = spawn_app(pool, s).await;
    let mut c = app.client.clone();
    let list = || keyed(proto::ListReservationsRequest::default(), &cast.shop.key);
    c.list_reservations(list()).await.unwrap();
    // A new key for the shop replaces the old one (a rotation); the old one must stop.
    let rotated = Principal::new("shop", &[Role::Client]);
    cast.file.write(
        &[&rotated, &cast.stranger, &cast.admin, &cast.coordinator],
        "",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.list_reservations(list()).await {
            Err(status) => {
                assert_eq!(status.code(), Code::Unauthenticated);
                break;
            }
            Ok(_) if Instant::now() < deadline => {
                // The file is re-read every few seconds; ask again shortly.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(_) => panic!("the removed key still works 20 s after the file changed"),
        }
    }
    c.list_reservations(keyed(
        proto::ListReservationsRequest::default(),
        &rotated.key,
    ))
    .await
    .unwrap();
    // A broken file keeps the last good principals (logged), rather than locking everyone out:
    // once the coordinator has seen and refused it, the rotated key still works.
    assert_eq!(auth.file_changes().refused, 0);
    cast.file.write(&[&rotated], "[[principal]]\nname = 42\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    while auth.file_changes().refused == 0 {
        assert!(
            Instant::now() < deadline,
            "the broken file was not seen within 20 s: {:?}",
            auth.file_changes()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.list_reservations(keyed(
        proto::ListReservationsRequest::default(),
        &rotated.key,
    ))
    .await
    .unwrap();
}
