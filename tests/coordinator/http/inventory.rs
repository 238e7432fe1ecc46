//! The inventory over JSON (`GET /v1/admin/inventory`, the console's view of a sale as it
//! sells): each resource's stock levels read from its participant now, a line that cannot be
//! read saying why, admins only, bad input refused naming the field.

use holdfast::participants::{Kind, ParticipantSettings};
use serde_json::json;
use sqlx::PgPool;

use super::{get, post, reserve_body, spawn_http};
use crate::auth::{Cast, keyed, secured_settings};
use crate::common::{put_resources_request, spawn_participant_with};

#[sqlx::test(migrations = false)]
async fn the_inventory_shows_each_resource_as_its_participant_counts_it(pool: PgPool) {
    // A participant requiring credentials: the coordinator reads its stock levels with its own
    // key (the `coordinator` role).
    let cast = Cast::new();
    let settings = ParticipantSettings {
        auth: cast.file.authenticator(),
        ..ParticipantSettings::new(Kind::Seats)
    };
    let seats = spawn_participant_with(settings, &pool).await;
    crate::common::admin(&seats)
        .await
        .put_resources(keyed(
            put_resources_request(&[("A1", 1), ("A2", 1)]),
            &cast.admin.key,
        ))
        .await
        .unwrap();
    let app = spawn_http(pool, secured_settings(&cast, &[("seats", &seats)])).await;
    let admin = Some(cast.admin.key.as_str());
    let shop = Some(cast.shop.key.as_str());
    let query = "/v1/admin/inventory?resource=seats/A1&resource=seats/A2&resource=seats/nope&resource=gone/A1";

    let before = get(&app, query, admin).await.ok();
    assert_eq!(
        before["lines"][0],
        json!({"participant": "seats", "resource": "A1", "capacity": 1, "available": 1,
               "held": 0, "confirmed": 0, "error": null})
    );
    // A sale sells: one held, one confirmed.
    let held = post(
        &app,
        "/v1/reservations",
        shop,
        &reserve_body("i-1", "alice", "A1"),
    )
    .await
    .ok();
    assert_eq!(held["state"], "HELD", "{held}");
    let sold = post(
        &app,
        "/v1/reservations",
        shop,
        &reserve_body("i-2", "bob", "A2"),
    )
    .await
    .ok();
    let token = sold["hold_token"].as_str().unwrap();
    let id = sold["id"].as_str().unwrap();
    post(
        &app,
        &format!("/v1/reservations/{id}:confirm"),
        shop,
        &json!({"hold_token": token}),
    )
    .await
    .ok();
    let after = get(&app, query, admin).await.ok();
    let levels = |i: usize| {
        let l = &after["lines"][i];
        (
            l["available"].as_i64(),
            l["held"].as_i64(),
            l["confirmed"].as_i64(),
        )
    };
    assert_eq!(levels(0), (Some(0), Some(1), Some(0)), "{after}");
    assert_eq!(levels(1), (Some(0), Some(0), Some(1)), "{after}");
    // The lines that cannot be read say why; the others still answer.
    assert!(
        after["lines"][2]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{after}"
    );
    assert!(
        after["lines"][3]["error"]
            .as_str()
            .is_some_and(|e| e.contains("not registered")),
        "{after}"
    );

    get(&app, query, shop)
        .await
        .assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
    let refused = get(&app, "/v1/admin/inventory?resource=A1", admin).await;
    refused.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    assert_eq!(refused.json["metadata"]["field"], "resource", "{refused:?}");
    let refused = get(&app, "/v1/admin/inventory", admin).await;
    assert_eq!(
        refused.json["metadata"]["field"], "resources",
        "{refused:?}"
    );
}
