//! Bad input over HTTP: each refusal is the error JSON with the right HTTP status and reason,
//! names the field, and changes nothing (nothing listed, no participant called).

use serde_json::json;
use sqlx::PgPool;

use super::{HttpApp, call, get, post, reserve_body, spawn_http};
use crate::common::{settings, spawn_fakes};

/// Sends `body` (raw text) to Reserve.
async fn reserve_raw(app: &HttpApp, body: &str) -> super::Answer {
    call(
        "POST",
        &format!("{}/v1/reservations", app.base),
        None,
        Some(body),
    )
    .await
}

#[sqlx::test]
async fn bad_input_names_the_field_and_changes_nothing(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(pool, settings(&[("seats", &fakes.get("seats").url)])).await;

    // (body, field named, in the message too)
    let cases: Vec<(String, &str)> = vec![
        // The gRPC service's own rules: the same message it gives over gRPC.
        (
            json!({"request_id": "r", "holds": [{"participant": "seats", "resource": "A1", "quantity": 1}]})
                .to_string(),
            "holder",
        ),
        (
            json!({"request_id": "r", "holder": "h", "holds": [{"participant": "seats", "resource": "A1", "quantity": 0}]})
                .to_string(),
            "holds[0].quantity",
        ),
        // This side's: the JSON's shape.
        (
            json!({"request_id": "r", "holder": "h", "holds": [{"participant": "seats", "resource": "A1", "quantity": "one"}]})
                .to_string(),
            "holds[0].quantity",
        ),
        (
            json!({"request_id": "r", "holder": "h", "colour": "red", "holds": []}).to_string(),
            "colour",
        ),
        (
            json!({"request_id": "r", "holder": "h", "holds": [{"participant": "seats", "resource": "A1", "quantity": 1, "seat": 3}]})
                .to_string(),
            "holds[0].seat",
        ),
        (
            json!({"request_id": "r", "holder": "h", "ttl": "10m", "holds": [{"participant": "seats", "resource": "A1", "quantity": 1}]})
                .to_string(),
            "ttl",
        ),
        (
            json!({"request_id": "r", "holder": "h", "holds": [{"participant": "seats", "resource": "A1", "quantity": 1, "during": {"start": "noon"}}]})
                .to_string(),
            "holds[0].during.start",
        ),
    ];
    for (body, field) in &cases {
        let answer = reserve_raw(&app, body).await;
        answer.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
        let message = answer.json["message"].as_str().unwrap_or("");
        assert!(message.contains(field), "{field} not named by {answer:?}");
        if answer.json["metadata"]["field"].is_string() {
            assert_eq!(answer.json["metadata"]["field"], *field, "{answer:?}");
        }
    }
    // Not JSON at all, trailing garbage, the wrong type at the top.
    for body in ["{\"holder\":", "{} {}", "[1,2]"] {
        let answer = reserve_raw(&app, body).await;
        answer.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    }
    // Over the size limit (1 MiB): 413, the limit in the metadata.
    let huge = format!(
        "{{\"request_id\":\"r\",\"holder\":\"{}\",\"holds\":[]}}",
        "x".repeat(1024 * 1024 + 1)
    );
    let answer = reserve_raw(&app, &huge).await;
    answer.assert_error(413, "INVALID_ARGUMENT", "BODY_TOO_LARGE");
    assert_eq!(answer.json["metadata"]["limit_bytes"], "1048576");

    // Query strings: an unknown parameter, a state that is none, a page size that is no number.
    for (query, field) in [
        ("colour=red", "colour"),
        ("state=SOLD", "state"),
        ("page_size=ten", "page_size"),
        ("holder=a&holder=b", "holder"),
    ] {
        let answer = get(&app, &format!("/v1/reservations?{query}"), None).await;
        answer.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
        assert_eq!(answer.json["metadata"]["field"], field, "{answer:?}");
    }

    // Nothing was recorded by any of them, and no participant was asked.
    let listed = get(&app, "/v1/reservations", None).await.ok();
    assert_eq!(listed["reservations"], json!([]), "{listed}");
    assert_eq!(fakes.log.calls().len(), 0, "{:?}", fakes.log.summary());
}

#[sqlx::test]
async fn domain_errors_keep_their_status_and_reason(pool: PgPool) {
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
    let id = held["id"].as_str().unwrap();

    let unknown = get(
        &app,
        "/v1/reservations/0193a5b2-7c1e-7000-8000-000000000000",
        None,
    )
    .await;
    unknown.assert_error(404, "NOT_FOUND", "RESERVATION_NOT_FOUND");
    let malformed = get(&app, "/v1/reservations/not-a-uuid", None).await;
    malformed.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    assert_eq!(malformed.json["metadata"]["field"], "reservation_id");

    let wrong_token = post(
        &app,
        &format!("/v1/reservations/{id}:confirm"),
        None,
        &json!({"hold_token": "not-the-token"}),
    )
    .await;
    wrong_token.assert_error(403, "PERMISSION_DENIED", "HOLD_TOKEN_MISMATCH");
    let reused = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-1", "alice", "A2"),
    )
    .await;
    reused.assert_error(409, "ALREADY_EXISTS", "REQUEST_ID_REUSED");
    let unknown_participant = post(
        &app,
        "/v1/reservations",
        None,
        &json!({"request_id": "r-9", "holder": "h", "holds": [{"participant": "nobody", "resource": "A1", "quantity": 1}]}),
    )
    .await;
    unknown_participant.assert_error(404, "NOT_FOUND", "UNKNOWN_PARTICIPANT");

    // Paths that name nothing.
    let verb = post(
        &app,
        &format!("/v1/reservations/{id}:explode"),
        None,
        &json!({}),
    )
    .await;
    assert_eq!(
        (verb.status, verb.json["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{verb:?}"
    );
    let nowhere = get(&app, "/v2/anything", None).await;
    assert_eq!(nowhere.status, 404, "{nowhere:?}");
    assert_eq!(nowhere.json["code"], "NOT_FOUND");

    // Still held, unchanged by the refusals.
    let read = get(&app, &format!("/v1/reservations/{id}"), None)
        .await
        .ok();
    assert_eq!(read["state"], "HELD");
}
