//! Authentication over HTTP is the gRPC port's: the same header, the same principals, the same
//! rules (the JSON API goes through the auth layer in-process). No key or an unknown one is
//! 401 `UNAUTHENTICATED`; a client on an admin endpoint 403 `PERMISSION_DENIED`; another
//! principal's reservation does not exist; the console and the probes need no key; the
//! metrics need one with the `metrics` (or `admin`) role, on the HTTP port and on
//! `--metrics-listen` alike.

use serde_json::json;
use sqlx::PgPool;

use super::{get, post, reserve_body, spawn_http};
use crate::auth::{Cast, secured_settings};
use crate::common::spawn_fakes;

#[sqlx::test]
async fn the_json_api_admits_callers_by_the_grpc_rules(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let shop = Some(cast.shop.key.as_str());
    let admin = Some(cast.admin.key.as_str());

    // No key, a key nobody has, a header that is not Bearer: 401, nothing recorded.
    let none = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("r-1", "h", "A1"),
    )
    .await;
    none.assert_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED");
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    let unknown = get(&app, "/v1/reservations", Some("not-a-key")).await;
    unknown.assert_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED");
    assert!(
        !unknown.text.contains("not-a-key"),
        "the credential echoed: {}",
        unknown.text
    );

    let held = post(
        &app,
        "/v1/reservations",
        shop,
        &reserve_body("r-1", "h", "A1"),
    )
    .await
    .ok();
    let id = held["id"].as_str().unwrap();
    assert_eq!(fakes.log.count("seats", "Try"), 1);

    // A client on the operator's endpoints: 403, nothing changed.
    for (method, path) in [
        ("GET", "/v1/admin/stuck".to_owned()),
        ("GET", "/v1/admin/audit".to_owned()),
        ("GET", "/v1/admin/participants".to_owned()),
        ("POST", format!("/v1/admin/reservations/{id}:force-cancel")),
        ("POST", "/v1/admin/retry".to_owned()),
    ] {
        let answer = if method == "GET" {
            get(&app, &path, shop).await
        } else {
            post(&app, &path, shop, &json!({"reason": "because"})).await
        };
        answer.assert_error(403, "PERMISSION_DENIED", "PERMISSION_DENIED");
    }
    let still = get(&app, &format!("/v1/reservations/{id}"), shop)
        .await
        .ok();
    assert_eq!(still["state"], "HELD");
    let participants = get(&app, "/v1/admin/participants", None).await;
    participants.assert_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED");

    // Another client does not see it; the admin sees it and everyone's list.
    let stranger = get(
        &app,
        &format!("/v1/reservations/{id}"),
        Some(&cast.stranger.key),
    )
    .await;
    stranger.assert_error(404, "NOT_FOUND", "RESERVATION_NOT_FOUND");
    let theirs = get(&app, "/v1/reservations", Some(&cast.stranger.key))
        .await
        .ok();
    assert_eq!(theirs["reservations"], json!([]));
    let all = get(&app, "/v1/reservations", admin).await.ok();
    assert_eq!(all["reservations"][0]["id"], id);
    let health = get(&app, "/v1/admin/participants", admin).await.ok();
    assert_eq!(health["participants"][0]["name"], "seats");
    let cancelled = post(
        &app,
        &format!("/v1/admin/reservations/{id}:force-cancel"),
        admin,
        &json!({"reason": "fraud check"}),
    )
    .await
    .ok();
    assert_eq!(cancelled["audit"][0]["principal"], "ops", "{cancelled}");

    // The console's files and the probes are open (the page asks for a key itself).
    for path in [
        "/",
        "/console.js",
        "/oncall.js",
        "/console.css",
        "/healthz",
        "/readyz",
    ] {
        let answer = get(&app, path, None).await;
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
    }
}

/// Without `--auth-keys` the HTTP listener, like the gRPC port, listens on loopback only: a
/// non-loopback `--http-listen` is refused at start, naming the way out.
#[test]
fn a_non_loopback_http_listen_without_keys_refuses_to_start() {
    let db = ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    for args in [
        &[
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "0.0.0.0:0",
        ][..],
        &["--listen", "127.0.0.1:0", "--http-listen", "0.0.0.0:0"][..],
    ] {
        let out = crate::process::run_holdfast(args, &[db]);
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("0.0.0.0:0 without authentication") && err.contains("--auth-keys"),
            "{args:?}: {err}"
        );
    }
}

/// The shipped Kubernetes probes (`deploy/kubernetes/coordinator-deployment.yaml`) carry no
/// credentials: each path they ask, on the port the ConfigMap gives the HTTP listener, must
/// answer 200 to a caller without a key while authentication is on.
#[sqlx::test]
async fn the_shipped_probes_are_answered_without_a_key(pool: PgPool) {
    let root = env!("CARGO_MANIFEST_DIR");
    let deployment = std::fs::read_to_string(format!(
        "{root}/deploy/kubernetes/coordinator-deployment.yaml"
    ))
    .unwrap();
    let configmap =
        std::fs::read_to_string(format!("{root}/deploy/kubernetes/configmap.yaml")).unwrap();
    let probe_paths: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("path: "))
        .collect();
    assert!(
        probe_paths.contains(&"/readyz") && probe_paths.contains(&"/healthz"),
        "{probe_paths:?}"
    );
    // The probes name the port `http`; it must be the port the listener is told to use.
    assert!(
        deployment.contains("port: http"),
        "the probes use another port"
    );
    let http_port = deployment
        .split("- name: http\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .and_then(|l| l.trim().strip_prefix("containerPort: "))
        .expect("a containerPort named http");
    assert!(
        configmap.contains(&format!("HOLDFAST_HTTP_LISTEN: \"0.0.0.0:{http_port}\"")),
        "the ConfigMap's HOLDFAST_HTTP_LISTEN is not on containerPort {http_port}"
    );

    let cast = Cast::new();
    let app = spawn_http(pool, secured_settings(&cast, &[])).await;
    for path in probe_paths {
        let answer = get(&app, path, None).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text);
    }
}

/// With `--auth-keys`, `/metrics` on the HTTP port and on the metrics listener answers only a
/// key with the `metrics` or `admin` role: none or an unknown one 401, a client's 403.
#[sqlx::test]
async fn metrics_need_a_key_with_the_metrics_role(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_listen = listener.local_addr().unwrap();
    tokio::spawn(holdfast::telemetry::serve_metrics(
        holdfast::tls::Listener::new(listener, None),
        cast.file.authenticator(),
        std::future::pending(),
    ));
    for (key, status) in [
        (None, 401),
        (Some("not-a-key"), 401),
        (Some(cast.shop.key.as_str()), 403),
        (Some(cast.scraper.key.as_str()), 200),
        (Some(cast.admin.key.as_str()), 200),
    ] {
        let answer = get(&app, "/metrics", key).await;
        assert_eq!(answer.status, status, "HTTP port, {key:?}: {answer:?}");
        assert_eq!(
            answer.text.contains("# TYPE"),
            status == 200,
            "{key:?}: {answer:?}"
        );
        let (listener_status, page) = scrape(metrics_listen, key).await;
        assert_eq!(listener_status, status, "--metrics-listen, {key:?}: {page}");
        assert_eq!(page.contains("# TYPE"), status == 200, "{key:?}: {page}");
    }
}

/// `GET /metrics` on a bare connection to the metrics listener: the status and the body.
async fn scrape(addr: std::net::SocketAddr, key: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}
