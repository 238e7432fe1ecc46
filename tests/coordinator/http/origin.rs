//! What a web page can do to the JSON API (SPEC 7.4): nothing. A foreign `Origin`, a
//! `Sec-Fetch-Site: cross-site` request without an allowed origin, a state change that is not
//! `application/json` (what a page can send without the browser asking the server first), and
//! a `Host` that is not this listener's (DNS rebinding) are refused, and what they asked for
//! does not happen. The console's own origin, named origins and hosts, and services that send
//! no `Origin` keep working.

use serde_json::json;
use sqlx::PgPool;

use super::{Answer, HttpApp, reserve_body, send, spawn_http, spawn_http_allowing};
use crate::common::{settings, spawn_fakes};

/// `method` on `app` + `path` with exactly `headers`, and `body` (JSON text) if given.
async fn request(
    app: &HttpApp,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&serde_json::Value>,
) -> Answer {
    let body = body.map(|b| b.to_string());
    send(
        method,
        &format!("{}{path}", app.base),
        headers,
        body.as_deref(),
    )
    .await
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// A HELD reservation made the way a service makes one (no `Origin`): its id and token.
async fn held(app: &HttpApp, request_id: &str) -> (String, String) {
    let body = reserve_body(request_id, "alice", request_id);
    let held = request(app, "POST", "/v1/reservations", &[JSON], Some(&body))
        .await
        .ok();
    assert_eq!(held["state"], "HELD", "{held}");
    let id = held["id"].as_str().unwrap_or_default().to_owned();
    let token = held["hold_token"].as_str().unwrap_or_default().to_owned();
    (id, token)
}

async fn state(app: &HttpApp, id: &str) -> String {
    let read = request(app, "GET", &format!("/v1/reservations/{id}"), &[], None)
        .await
        .ok();
    read["state"].as_str().unwrap_or_default().to_owned()
}

/// How many reservations `holder` has.
async fn count(app: &HttpApp, holder: &str) -> usize {
    let path = format!("/v1/reservations?holder={holder}&page_size=100");
    let listed = request(app, "GET", &path, &[], None).await.ok();
    listed["reservations"].as_array().map_or(0, Vec::len)
}

#[sqlx::test]
async fn a_foreign_page_changes_nothing(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(pool, settings(&[("seats", &fakes.get("seats").url)])).await;
    let (id, token) = held(&app, "r-1").await;
    let own_origin = app.base.clone();

    // A cross-origin text/plain Reserve (no preflight in a browser): 415, nothing recorded,
    // also from the console's own origin.
    let reserve = reserve_body("r-2", "mallory", "B1");
    for headers in [
        &[("content-type", "text/plain")][..],
        &[("content-type", "text/plain"), ("origin", &own_origin)][..],
        &[("content-type", "application/x-www-form-urlencoded")][..],
        &[][..],
    ] {
        request(&app, "POST", "/v1/reservations", headers, Some(&reserve))
            .await
            .assert_error(415, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    }
    assert_eq!(
        count(&app, "mallory").await,
        0,
        "a refused Reserve was recorded"
    );

    // A foreign page's cancel and force-cancel (the browser attaching the admin's credentials):
    // 403, the reservation still HELD. With and without a JSON type, as `no-cors` can't but a
    // preflighted request could.
    let cancel = json!({"hold_token": token, "reason": "csrf"});
    let force = json!({"reason": "csrf"});
    let foreign: [&[(&str, &str)]; 4] = [
        &[JSON, ("origin", "http://evil.example")],
        &[JSON, ("origin", "null")],
        &[JSON, ("sec-fetch-site", "cross-site")],
        &[
            JSON,
            ("origin", "http://localhost:1"),
            ("sec-fetch-site", "same-site"),
        ],
    ];
    for headers in foreign {
        for (path, body) in [
            (format!("/v1/reservations/{id}:cancel"), &cancel),
            (format!("/v1/admin/reservations/{id}:force-cancel"), &force),
        ] {
            request(&app, "POST", &path, headers, Some(body))
                .await
                .assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
        }
        // Reads from a foreign origin are refused too.
        request(
            &app,
            "GET",
            &format!("/v1/reservations/{id}"),
            headers,
            None,
        )
        .await
        .assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
    }
    assert_eq!(state(&app, &id).await, "HELD");

    // The console's own origin (a browser sends Origin on a same-origin POST) cancels.
    let origin = [
        JSON,
        ("origin", own_origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let path = format!("/v1/reservations/{id}:cancel");
    let cancelled = request(&app, "POST", &path, &origin, Some(&cancel))
        .await
        .ok();
    assert_eq!(cancelled["state"], "CANCELLED", "{cancelled}");
    // A link from another site still opens the console (a top-level navigation).
    let opened = request(
        &app,
        "GET",
        "/",
        &[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
        ],
        None,
    )
    .await;
    assert_eq!(opened.status, 200, "{opened:?}");
}

#[sqlx::test]
async fn a_named_origin_may_call_from_a_browser(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let allowed = holdfast::http::AllowedCallers::parse(&[], &["https://shop.example".into()])
        .expect("an origin");
    let s = settings(&[("seats", &fakes.get("seats").url)]);
    let app = spawn_http_allowing(pool, s, allowed).await;
    let body = reserve_body("r-1", "alice", "A1");
    let shop = [
        JSON,
        ("origin", "https://shop.example:443"),
        ("sec-fetch-site", "cross-site"),
    ];
    let made = request(&app, "POST", "/v1/reservations", &shop, Some(&body)).await;
    assert_eq!(made.ok()["state"], "HELD");
    let other = [JSON, ("origin", "https://shop.example:8443")];
    let body = reserve_body("r-2", "alice", "A2");
    request(&app, "POST", "/v1/reservations", &other, Some(&body))
        .await
        .assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
}

#[sqlx::test]
async fn a_rebound_name_reads_and_reserves_nothing(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let allowed =
        holdfast::http::AllowedCallers::parse(&["holdfast.internal".into()], &[]).expect("a host");
    let s = settings(&[("seats", &fakes.get("seats").url)]);
    let app = spawn_http_allowing(pool, s, allowed).await;
    let (id, _) = held(&app, "r-1").await;
    let port = app.base.rsplit(':').next().unwrap_or_default().to_owned();

    // The page at evil.example, its name rebound to 127.0.0.1: its requests carry its Host.
    let evil = format!("evil.example:{port}");
    for (method, path, body) in [
        ("GET", "/v1/reservations?holder=alice".to_owned(), None),
        ("GET", format!("/v1/reservations/{id}"), None),
        ("GET", "/".to_owned(), None),
        (
            "POST",
            "/v1/reservations".to_owned(),
            Some(reserve_body("r-1", "alice", "r-1")),
        ),
    ] {
        let answer = request(&app, method, &path, &[("host", &evil), JSON], body.as_ref()).await;
        assert_eq!(answer.status, 421, "{method} {path}: {answer:?}");
        assert_eq!(answer.reason(), "PERMISSION_DENIED", "{answer:?}");
        assert!(!answer.text.contains(&id), "{answer:?}");
    }
    assert_eq!(count(&app, "alice").await, 1);
    // localhost, the listener's address and a named host are answered.
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("HoldFast.Internal:{port}"),
    ] {
        let answer = request(
            &app,
            "GET",
            &format!("/v1/reservations/{id}"),
            &[("host", &host)],
            None,
        )
        .await;
        assert_eq!(answer.ok()["id"], id.as_str());
    }
}
