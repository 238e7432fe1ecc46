//! Waitlists over JSON (SPEC 11, 8.4) against a real coordinator and a real `seats`
//! participant (one place per seat), authentication on: Reserve's body takes
//! `"queue": {"wait_up_to": "60s"}` and answers QUEUED with `queue` in its proto place; a
//! reservation's page says where it waits; `GET /v1/admin/queue` lists a resource's queue in
//! offer order page by page, for admins only; bad input is refused naming the field.

use std::time::Duration;

use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_stream::StreamExt;

use super::{HttpApp, get, post, reserve_body, spawn_http};
use crate::auth::{Cast, keyed, secured_settings};
use crate::common::{put_resources_request, spawn_participant_with};

/// A coordinator with its HTTP listener and a seats participant (A1, A2: one place each),
/// both requiring the cast's keys.
pub(super) async fn queue_shop(pool: &PgPool, cast: &Cast) -> HttpApp {
    let settings = ParticipantSettings {
        auth: cast.file.authenticator(),
        ..ParticipantSettings::new(Kind::Seats)
    };
    let seats = spawn_participant_with(settings, pool).await;
    crate::common::admin(&seats)
        .await
        .put_resources(keyed(
            put_resources_request(&[("A1", 1), ("A2", 1)]),
            &cast.admin.key,
        ))
        .await
        .unwrap();
    spawn_http(pool.clone(), secured_settings(cast, &[("seats", &seats)])).await
}

/// A Reserve body for seat `seat` that waits up to `wait` when it is sold out.
pub(super) fn queued_body(request_id: &str, holder: &str, seat: &str, wait: &str) -> Value {
    let mut body = reserve_body(request_id, holder, seat);
    body["queue"] = json!({"wait_up_to": wait});
    body
}

/// The keys of a JSON object, in the order written.
fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

fn seconds(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_default())
        .map(|t| t.timestamp())
        .unwrap_or_else(|e| panic!("{v}: {e}"))
}

#[sqlx::test(migrations = false)]
async fn a_reserve_waits_in_the_queue_and_an_admin_lists_it(pool: PgPool) {
    let cast = Cast::new();
    let app = queue_shop(&pool, &cast).await;
    let (admin, shop) = (Some(cast.admin.key.as_str()), Some(cast.shop.key.as_str()));
    let alice = post(
        &app,
        "/v1/reservations",
        shop,
        &queued_body("w-1", "alice", "A1", "60s"),
    )
    .await
    .ok();
    assert_eq!(alice["state"], "HELD", "a free seat is held: {alice}");
    assert_eq!(alice["queue"], Value::Null);
    let bob = post(
        &app,
        "/v1/reservations",
        shop,
        &queued_body("w-2", "bob", "A1", "60s"),
    )
    .await
    .ok();
    assert_eq!(bob["state"], "QUEUED", "{bob}");
    assert!(
        bob["hold_token"].as_str().is_some_and(|t| !t.is_empty()),
        "{bob}"
    );
    assert_eq!(
        keys(&bob).last(),
        Some(&"queue"),
        "queue in its proto place: {bob}"
    );
    let place = &bob["queue"];
    assert_eq!(
        keys(place),
        [
            "position",
            "participant",
            "resource",
            "during",
            "since",
            "until"
        ]
    );
    assert_eq!(
        (
            place["position"].as_i64(),
            place["participant"].as_str(),
            place["resource"].as_str()
        ),
        (Some(1), Some("seats"), Some("A1")),
        "{bob}"
    );
    assert_eq!(place["during"], Value::Null);
    assert_eq!(
        seconds(&place["until"]) - seconds(&place["since"]),
        60,
        "{bob}"
    );
    let carol = post(
        &app,
        "/v1/reservations",
        shop,
        &queued_body("w-3", "carol", "A1", "1.5s"),
    )
    .await
    .ok();
    assert_eq!(carol["queue"]["position"], 2, "{carol}");
    let bob_id = bob["id"].as_str().unwrap();
    let page = get(&app, &format!("/v1/reservations/{bob_id}"), shop)
        .await
        .ok();
    assert_eq!(
        (page["state"].as_str(), page["queue"]["position"].as_i64()),
        (Some("QUEUED"), Some(1)),
        "{page}"
    );
    assert!(page.get("hold_token").is_none(), "{page}");
    let listed = get(&app, "/v1/reservations?state=queued", shop).await.ok();
    assert_eq!(
        listed["reservations"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    // The queue, head first: all of it, then page by page.
    let whole = get(&app, "/v1/admin/queue?participant=seats&resource=A1", admin)
        .await
        .ok();
    assert_eq!(keys(&whole), ["entries", "next_page_token", "length"]);
    assert_eq!(
        (whole["length"].as_i64(), whole["next_page_token"].as_str()),
        (Some(2), Some("")),
        "{whole}"
    );
    let head = &whole["entries"][0];
    assert_eq!(
        keys(head),
        [
            "position",
            "reservation_id",
            "holder",
            "quantity",
            "since",
            "until"
        ]
    );
    assert_eq!(
        (
            head["position"].as_i64(),
            head["reservation_id"].as_str(),
            head["holder"].as_str(),
            head["quantity"].as_i64()
        ),
        (Some(1), Some(bob_id), Some("bob"), Some(1)),
        "{whole}"
    );
    assert_eq!(head["until"], place["until"], "{whole}");
    let first = get(
        &app,
        "/v1/admin/queue?participant=seats&resource=A1&page_size=1",
        admin,
    )
    .await
    .ok();
    let token = first["next_page_token"].as_str().unwrap_or_default();
    assert!(
        !token.is_empty(),
        "a full page says where to go on: {first}"
    );
    let second = get(
        &app,
        &format!("/v1/admin/queue?participant=seats&resource=A1&page_size=1&page_token={token}"),
        admin,
    )
    .await
    .ok();
    assert_eq!(
        second["entries"][0]["reservation_id"], carol["id"],
        "{second}"
    );
    assert_eq!(second["entries"][0]["position"], 2, "{second}");
    let empty = get(&app, "/v1/admin/queue?participant=seats&resource=A2", admin)
        .await
        .ok();
    assert_eq!(
        (empty["entries"].clone(), empty["length"].as_i64()),
        (json!([]), Some(0))
    );

    // Alice cancels: bob is offered the seat (awaited on Watch), carol moves up.
    let mut watch = app
        .grpc
        .clone()
        .watch_reservation(keyed(
            proto::WatchReservationRequest {
                reservation_id: bob_id.to_owned(),
            },
            &cast.shop.key,
        ))
        .await
        .unwrap()
        .into_inner();
    let alice_id = alice["id"].as_str().unwrap();
    post(
        &app,
        &format!("/v1/reservations/{alice_id}:cancel"),
        shop,
        &json!({"hold_token": alice["hold_token"]}),
    )
    .await
    .ok();
    let held = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(r)) = watch.next().await {
            if r.state() == proto::reservation::State::Held {
                return true;
            }
        }
        false
    });
    assert_eq!(
        held.await,
        Ok(true),
        "bob was not offered the seat within 5 s"
    );
    let now = get(&app, &format!("/v1/reservations/{bob_id}"), shop)
        .await
        .ok();
    assert_eq!(
        (now["state"].as_str(), &now["queue"]),
        (Some("HELD"), &Value::Null),
        "{now}"
    );
    let after = get(&app, "/v1/admin/queue?participant=seats&resource=A1", admin)
        .await
        .ok();
    assert_eq!(
        (
            after["length"].as_i64(),
            after["entries"][0]["reservation_id"].as_str()
        ),
        (Some(1), carol["id"].as_str()),
        "{after}"
    );
}

#[sqlx::test(migrations = false)]
async fn bad_queue_input_is_refused_naming_the_field(pool: PgPool) {
    let cast = Cast::new();
    let app = queue_shop(&pool, &cast).await;
    let (admin, shop) = (Some(cast.admin.key.as_str()), Some(cast.shop.key.as_str()));
    let field = |a: &super::Answer| {
        a.json["metadata"]["field"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };

    for (queue, named) in [
        (json!({"wait_up_to": "soon"}), "queue.wait_up_to"),
        (json!({"wait_up_to": "0s"}), "queue.wait_up_to"),
        (json!({"waitUpTo": "60s"}), "queue.waitUpTo"),
        (json!("60s"), "queue"),
    ] {
        let mut body = reserve_body("w-bad", "alice", "A1");
        body["queue"] = queue.clone();
        let refused = post(&app, "/v1/reservations", shop, &body).await;
        refused.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
        assert_eq!(field(&refused), named, "{queue}: {refused:?}");
    }

    get(&app, "/v1/admin/queue?participant=seats&resource=A1", shop)
        .await
        .assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
    get(&app, "/v1/admin/queue?participant=seats&resource=A1", None)
        .await
        .assert_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED");
    for (query, named) in [
        ("participant=seats", "resource"),
        ("participant=seats&resource=A1&seat=1", "seat"),
        ("participant=seats&resource=A1&page_size=501", "page_size"),
        ("participant=seats&resource=A1&page_size=x", "page_size"),
        (
            "participant=seats&resource=A1&page_token=nope",
            "page_token",
        ),
        ("participant=seats&resource=A1&during=today", "during"),
        (
            "participant=seats&resource=A1&during=2026-12-01T10:00:00Z/noon",
            "during",
        ),
    ] {
        let refused = get(&app, &format!("/v1/admin/queue?{query}"), admin).await;
        refused.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
        assert_eq!(field(&refused), named, "{query}: {refused:?}");
    }
}
