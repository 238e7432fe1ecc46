//! Every JSON endpoint against a real coordinator with authentication off (loopback): the
//! answers have the gRPC semantics and the CLI's JSON shape, the hold token only in Reserve's.

use serde_json::json;
use sqlx::PgPool;

use super::{get, post, reserve_body, spawn_http};
use crate::common::{closed_url, settings, spawn_fakes};

/// Reserve, Get, Confirm, List (filters and paging), Extend, Cancel, and the refusals that
/// follow a decision, over JSON.
#[sqlx::test]
async fn the_coordinator_rpcs_over_json(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(pool, settings(&[("seats", &fakes.get("seats").url)])).await;

    let held = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-1", "alice", "A1"),
    )
    .await
    .ok();
    assert_eq!(held["state"], "HELD", "{held}");
    assert_eq!(held["branches"][0]["participant"], "seats");
    let id = held["id"].as_str().unwrap().to_owned();
    let token = held["hold_token"].as_str().unwrap().to_owned();
    assert!(!token.is_empty());
    // The repeat answers the same reservation and token (idempotent Reserve).
    let again = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-1", "alice", "A1"),
    )
    .await
    .ok();
    assert_eq!(
        (&again["id"], &again["hold_token"]),
        (&held["id"], &held["hold_token"])
    );

    let read = get(&app, &format!("/v1/reservations/{id}"), None).await;
    assert!(
        !read.text.contains(&token),
        "Get answered the token: {}",
        read.text
    );
    let read = read.ok();
    assert_eq!(read["state"], "HELD");
    assert!(read.get("hold_token").is_none(), "{read}");

    let confirmed = post(
        &app,
        &format!("/v1/reservations/{id}:confirm"),
        None,
        &json!({"hold_token": token}),
    )
    .await
    .ok();
    assert_eq!(confirmed["state"], "CONFIRMED", "{confirmed}");
    assert!(confirmed.get("hold_token").is_none());
    // Cancel after Confirm: the gRPC refusal, as JSON with its HTTP status.
    let refused = post(
        &app,
        &format!("/v1/reservations/{id}:cancel"),
        None,
        &json!({"hold_token": token, "reason": "changed my mind"}),
    )
    .await;
    refused.assert_error(400, "FAILED_PRECONDITION", "RESERVATION_CLOSED");
    assert_eq!(refused.json["metadata"]["reservation_id"], id.as_str());

    // A second and a third, to list and page.
    let b = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-2", "bob", "B1"),
    )
    .await
    .ok();
    let c = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-3", "bob", "B2"),
    )
    .await
    .ok();
    let extended = post(
        &app,
        &format!("/v1/reservations/{}:extend", c["id"].as_str().unwrap()),
        None,
        &json!({"hold_token": c["hold_token"], "ttl": "30s"}),
    )
    .await
    .ok();
    assert_eq!(extended["extensions_used"], 1, "{extended}");
    assert!(extended["expires_at"].as_str() > c["expires_at"].as_str());
    let cancelled = post(
        &app,
        &format!("/v1/reservations/{}:cancel", b["id"].as_str().unwrap()),
        None,
        &json!({"hold_token": b["hold_token"], "reason": "changed my mind"}),
    )
    .await
    .ok();
    assert_eq!(cancelled["state"], "CANCELLED");

    let bobs = get(&app, "/v1/reservations?holder=bob", None).await.ok();
    let ids: Vec<&str> = bobs["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [c["id"].as_str().unwrap(), b["id"].as_str().unwrap()]);
    let confirmed_only = get(&app, "/v1/reservations?state=confirmed", None)
        .await
        .ok();
    assert_eq!(confirmed_only["reservations"].as_array().unwrap().len(), 1);
    assert_eq!(confirmed_only["reservations"][0]["id"], id.as_str());
    // Paging: one at a time, newest first, until no token.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = get(
            &app,
            &format!("/v1/reservations?page_size=1&page_token={token}"),
            None,
        )
        .await
        .ok();
        seen.extend(
            page["reservations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_owned()),
        );
        token = page["next_page_token"].as_str().unwrap().to_owned();
        if token.is_empty() || seen.len() > 5 {
            break;
        }
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    let listed = get(&app, "/v1/reservations", None).await;
    assert!(
        !listed.text.contains(c["hold_token"].as_str().unwrap()),
        "List answered a token"
    );
}

/// The operator's endpoints: ForceCancel with a reason (and its audit entry, on the
/// reservation and in the audit list), stuck work, Retry, Resolve's refusal of a reservation
/// that is not FAILED, and each participant's health.
#[sqlx::test]
async fn the_admin_endpoints_over_json(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let down = closed_url().await;
    let app = spawn_http(
        pool,
        settings(&[("seats", &fakes.get("seats").url), ("gone", &down)]),
    )
    .await;
    let held = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-1", "alice", "A1"),
    )
    .await
    .ok();
    let id = held["id"].as_str().unwrap();

    let missing_reason = post(
        &app,
        &format!("/v1/admin/reservations/{id}:force-cancel"),
        None,
        &json!({}),
    )
    .await;
    missing_reason.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    assert!(
        missing_reason.json["message"]
            .as_str()
            .unwrap()
            .contains("reason")
    );

    let cancelled = post(
        &app,
        &format!("/v1/admin/reservations/{id}:force-cancel"),
        None,
        &json!({"reason": "customer called support"}),
    )
    .await
    .ok();
    assert!(
        ["CANCELLING", "CANCELLED"].contains(&cancelled["state"].as_str().unwrap()),
        "{cancelled}"
    );
    assert_eq!(
        cancelled["audit"][0]["reason"], "customer called support",
        "{cancelled}"
    );
    let audit = get(&app, &format!("/v1/admin/audit?reservation_id={id}"), None)
        .await
        .ok();
    assert_eq!(audit["entries"].as_array().unwrap().len(), 1, "{audit}");
    assert_eq!(audit["entries"][0]["reservation_id"], id);

    let stuck = get(&app, "/v1/admin/stuck?state=HELD&older_than=0s", None)
        .await
        .ok();
    assert!(stuck["reservations"].is_array(), "{stuck}");
    let retried = post(
        &app,
        "/v1/admin/retry",
        None,
        &json!({"participant": "seats", "reason": "seats is back"}),
    )
    .await
    .ok();
    assert!(retried["driven"].is_number(), "{retried}");
    let audit = get(&app, "/v1/admin/audit", None).await.ok();
    let retry = audit["entries"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["action"] == "retry"))
        .unwrap_or_else(|| panic!("no retry audited: {audit}"));
    assert_eq!(retry["reason"], "seats is back", "{audit}");
    let both = post(
        &app,
        "/v1/admin/retry",
        None,
        &json!({"participant": "seats", "reservation_id": id}),
    )
    .await;
    both.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");

    let not_failed = post(
        &app,
        &format!("/v1/admin/reservations/{id}:resolve"),
        None,
        &json!({"outcome": "CONFIRMED", "reason": "checked"}),
    )
    .await;
    assert_eq!(not_failed.status, 400, "{not_failed:?}");
    assert_eq!(
        not_failed.json["code"], "FAILED_PRECONDITION",
        "{not_failed:?}"
    );

    // Each participant: where, whether it serves, how fast, and the last error a call met.
    let health = get(&app, "/v1/admin/participants", None).await.ok();
    let seen: Vec<_> = health["participants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                &p["name"],
                &p["url"],
                &p["serving"],
                p["last_error"].is_string(),
            )
        })
        .collect();
    let seats_url = json!(fakes.get("seats").url);
    assert_eq!(
        seen,
        [
            (&json!("gone"), &json!(down), &json!(false), true),
            (&json!("seats"), &seats_url, &json!(true), false),
        ],
        "{health}"
    );
    let gone = &health["participants"][0];
    assert!(
        gone["last_error_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{gone}"
    );
    assert!(
        gone["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{gone}"
    );
}

/// List's filters over JSON: labels (`label=KEY=VALUE`, repeatable), participant, and the
/// creation window; a malformed time names its parameter.
#[sqlx::test]
async fn list_filters_over_json(pool: PgPool) {
    let fakes = spawn_fakes(&["seats", "stock"]).await;
    let app = spawn_http(
        pool,
        settings(&[
            ("seats", &fakes.get("seats").url),
            ("stock", &fakes.get("stock").url),
        ]),
    )
    .await;
    let mut blue = reserve_body("r-1", "alice", "A1");
    blue["labels"] = json!({"team": "blue", "shop": "north"});
    let blue = post(&app, "/v1/reservations", None, &blue).await.ok();
    let stock = post(
        &app,
        "/v1/reservations",
        None,
        &json!({"request_id": "r-2", "holder": "alice",
                "holds": [{"participant": "stock", "resource": "sku-1", "quantity": 2}]}),
    )
    .await
    .ok();
    let ids = |page: &serde_json::Value| -> Vec<String> {
        page["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let by_label = get(
        &app,
        "/v1/reservations?label=team=blue&label=shop=north",
        None,
    )
    .await
    .ok();
    assert_eq!(ids(&by_label), [blue["id"].as_str().unwrap()]);
    let by_participant = get(&app, "/v1/reservations?participant=stock", None)
        .await
        .ok();
    assert_eq!(ids(&by_participant), [stock["id"].as_str().unwrap()]);
    let future = get(
        &app,
        "/v1/reservations?created_after=2999-01-01T00:00:00Z",
        None,
    )
    .await
    .ok();
    assert_eq!(ids(&future), Vec::<String>::new());
    let window = get(
        &app,
        "/v1/reservations?created_after=2000-01-01T00:00:00Z&created_before=2999-01-01T00:00:00Z",
        None,
    )
    .await
    .ok();
    assert_eq!(ids(&window).len(), 2);
    let bad = get(&app, "/v1/reservations?created_after=yesterday", None).await;
    bad.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    assert_eq!(bad.json["metadata"]["field"], "created_after");
    let bad = get(&app, "/v1/reservations?label=team", None).await;
    assert_eq!(bad.json["metadata"]["field"], "label", "{bad:?}");
}
