//! The web console (SPEC 8.4): one HTML page, its stylesheet and its scripts (`console.js`,
//! the helpers, reservations and operator actions; `oncall.js`, the overview, search,
//! inventory and stuck work; `waitlist.js`, a resource's queue and where a reservation
//! waits), compiled into the
//! binary (`include_str!`; no build step, nothing fetched from elsewhere at run time). The
//! page is a client of the JSON API like any other: with authentication on it asks for an API
//! key, keeps it in `sessionStorage` and sends it as `authorization: Bearer` (never in a URL).
//! No inline script or style, so the policy can be `default-src 'self'`.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::Shared;

const INDEX: &str = include_str!("console/index.html");
const STYLE: &str = include_str!("console/console.css");
const SCRIPT: &str = include_str!("console/console.js");
const ONCALL: &str = include_str!("console/oncall.js");
const WAITLIST: &str = include_str!("console/waitlist.js");

pub fn routes() -> Router<Shared> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/oncall.js",
            get(|| async { asset("text/javascript; charset=utf-8", ONCALL) }),
        )
        .route(
            "/waitlist.js",
            get(|| async { asset("text/javascript; charset=utf-8", WAITLIST) }),
        )
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        text,
    )
        .into_response()
}
