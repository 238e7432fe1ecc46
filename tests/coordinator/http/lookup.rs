//! Finding reservations over JSON (the console's search box): `?id_prefix=` and
//! `?request_id=` lookups, scoped to what the caller may read, refused naming the field when
//! malformed or mixed with filters; the counts by state the overview reads
//! (`/v1/admin/counts`, admins only); fields in the proto's order.

use sqlx::PgPool;

use super::{HttpApp, get, post, reserve_body, spawn_http};
use crate::auth::{Cast, secured_settings};
use crate::common::spawn_fakes;

async fn reserve(app: &HttpApp, key: &str, request_id: &str, seat: &str) -> String {
    let r = post(
        app,
        "/v1/reservations",
        Some(key),
        &reserve_body(request_id, "alice", seat),
    )
    .await;
    // Fields in the proto's order, the token in its place (after the state).
    assert!(r.text.starts_with(r#"{"id":""#), "{}", r.text);
    let at = |field: &str| r.text.find(&format!("\"{field}\":")).unwrap_or(usize::MAX);
    assert!(
        at("state") < at("hold_token") && at("hold_token") < at("created_at"),
        "{}",
        r.text
    );
    r.ok()["id"].as_str().unwrap().to_owned()
}

#[sqlx::test]
async fn reservations_are_found_by_id_prefix_and_request_id(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let shop = Some(cast.shop.key.as_str());
    let a = reserve(&app, &cast.shop.key, "order-1", "A1").await;
    let b = reserve(&app, &cast.shop.key, "order-2", "A2").await;

    let found = |v: serde_json::Value| -> Vec<String> {
        v["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let prefix = &b[..24];
    let page = get(&app, &format!("/v1/reservations?id_prefix={prefix}"), shop)
        .await
        .ok();
    assert_eq!(found(page), [b.as_str()]);
    let both = get(
        &app,
        &format!("/v1/reservations?id_prefix={}", &a[..4]),
        shop,
    )
    .await
    .ok();
    let mut sorted = vec![a.clone(), b.clone()];
    sorted.sort();
    assert_eq!(found(both), sorted, "in id order");
    let page = get(&app, "/v1/reservations?request_id=order-1", shop)
        .await
        .ok();
    assert_eq!(found(page), [a.as_str()]);
    // The admin sees them too; another client none of them.
    let admin = Some(cast.admin.key.as_str());
    let page = get(&app, "/v1/reservations?request_id=order-2", admin)
        .await
        .ok();
    assert_eq!(found(page), [b.as_str()]);
    let stranger = Some(cast.stranger.key.as_str());
    let page = get(
        &app,
        &format!("/v1/reservations?id_prefix={prefix}"),
        stranger,
    )
    .await
    .ok();
    assert!(found(page).is_empty());

    // A wildcard is no hex digit; a lookup takes no filter beside it.
    for query in [
        "id_prefix=01a2%25",
        "id_prefix=01a2_",
        "id_prefix=01a",
        "id_prefix=01a2&holder=alice",
    ] {
        let refused = get(&app, &format!("/v1/reservations?{query}"), shop).await;
        refused.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
        assert_eq!(
            refused.json["metadata"]["field"], "id_prefix",
            "{query}: {refused:?}"
        );
    }
    let refused = get(&app, "/v1/reservations?request_id=x&state=HELD", shop).await;
    assert_eq!(
        refused.json["metadata"]["field"], "request_id",
        "{refused:?}"
    );
    // Before any of it, the caller must be one: no key, no answer.
    get(&app, "/v1/reservations?id_prefix=01a2%25", None)
        .await
        .assert_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED");
}

#[sqlx::test]
async fn the_counts_by_state_are_the_databases_and_for_admins(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let admin = Some(cast.admin.key.as_str());
    let empty = get(&app, "/v1/admin/counts", admin).await.ok();
    assert_eq!(
        (&empty["live"], &empty["last_hour"]),
        (&serde_json::json!({}), &serde_json::json!([])),
        "{empty}"
    );
    reserve(&app, &cast.shop.key, "c-1", "A1").await;
    reserve(&app, &cast.shop.key, "c-2", "A2").await;
    let counts = get(&app, "/v1/admin/counts", admin).await.ok();
    assert_eq!(counts["live"], serde_json::json!({"HELD": 2}), "{counts}");
    let in_hour: i64 = counts["last_hour"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["counts"]["HELD"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(in_hour, 2, "{counts}");
    assert!(
        counts["at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{counts}"
    );
    get(&app, "/v1/admin/counts", Some(cast.shop.key.as_str()))
        .await
        .assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
}

/// Stuck work over JSON carries where each one's work stands: when it is driven next and how
/// many times the sweep drove it (the console's "next retry").
#[sqlx::test]
async fn stuck_work_says_when_it_is_retried_next(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let settings = secured_settings(&cast, &[("seats", &fakes.get("seats").url)]);
    let app = spawn_http(pool, settings).await;
    let shop = Some(cast.shop.key.as_str());
    let held = post(
        &app,
        "/v1/reservations",
        shop,
        &reserve_body("s-1", "alice", "A1"),
    )
    .await
    .ok();
    // The seats participant fails every call from now on: the release cannot finish.
    fakes
        .get("seats")
        .script(&holdfast_testkit::fake::Script::new().fail_next(10_000));
    let id = held["id"].as_str().unwrap();
    let body = serde_json::json!({"hold_token": held["hold_token"]});
    let cancelling = post(&app, &format!("/v1/reservations/{id}:cancel"), shop, &body)
        .await
        .ok();
    assert_eq!(cancelling["state"], "CANCELLING", "{cancelling}");
    let admin = Some(cast.admin.key.as_str());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    let work = loop {
        let stuck = get(&app, "/v1/admin/stuck", admin).await.ok();
        let work = stuck["work"].as_array().cloned().unwrap_or_default();
        if work.iter().any(|w| w["attempts"].as_i64() >= Some(1)) {
            break work;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never retried: {stuck}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(work.len(), 1, "{work:?}");
    assert_eq!(work[0]["reservation_id"], id);
    assert!(
        work[0]["next_attempt_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "a retry is scheduled: {work:?}"
    );
}
