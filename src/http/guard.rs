//! What a web page may ask of the HTTP listener (SPEC 7.4): nothing, unless it is the console
//! itself or an origin the operator named. Checked before routing, for every request:
//!
//! 1. `Host` must be an address of this listener, `localhost`, or a name given by
//!    `--http-allowed-host`; else 421. A page whose name was rebound to 127.0.0.1 (DNS
//!    rebinding) sends its own name, so it reads nothing.
//! 2. An `Origin` must be this listener's own (`scheme://` + the `Host` just admitted) or one
//!    given by `--http-allowed-origin`; a request marked `Sec-Fetch-Site: cross-site` must carry
//!    such an `Origin` (a top-level navigation to the console excepted); else 403
//!    `PERMISSION_DENIED`.
//! 3. A state-changing method (`POST`, `PUT`, `PATCH`, `DELETE`) must send `Content-Type:
//!    application/json`; else 415 `INVALID_ARGUMENT`. A foreign page can send `text/plain` or a
//!    form without asking the browser's permission, never `application/json`.
//!
//! Services calling the JSON API send no `Origin` and are unaffected. A refused request is
//! answered here: no handler runs, so nothing it asked for happens.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::error::{invalid, respond};

/// The names and origins the operator allows beyond the listener's own (`--http-allowed-host`,
/// `--http-allowed-origin`), checked when parsed.
#[derive(Clone, Debug, Default)]
pub struct AllowedCallers {
    /// Host names (lowercase, without port); `*` allows any host.
    hosts: Vec<String>,
    /// Origins as `scheme://host[:port]`, normalised ([`Origin`]).
    origins: Vec<Origin>,
}

impl AllowedCallers {
    /// Parses the flags' values, naming the flag and the value that is not a host or origin.
    pub fn parse(hosts: &[String], origins: &[String]) -> Result<AllowedCallers, String> {
        let hosts = hosts
            .iter()
            .map(|h| {
                let name = h.trim().trim_end_matches('.').to_ascii_lowercase();
                let valid = name == "*"
                    || (!name.is_empty()
                        && name.bytes().all(|b| {
                            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'[' | b']')
                        }));
                if valid {
                    Ok(name)
                } else {
                    Err(format!("--http-allowed-host {h:?}: not a host name (such as holdfast.internal, or *)"))
                }
            })
            .collect::<Result<_, _>>()?;
        let origins = origins
            .iter()
            .map(|o| {
                Origin::parse(o).ok_or_else(|| {
                    format!("--http-allowed-origin {o:?}: not an origin such as https://shop.example:8443 (scheme, host and port only)")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(AllowedCallers { hosts, origins })
    }
}

/// The rules of one listener: its address, whether it serves TLS, and what the operator allows.
#[derive(Clone, Debug)]
pub(super) struct CallerRules {
    listen: SocketAddr,
    scheme: &'static str,
    allowed: AllowedCallers,
}

impl CallerRules {
    pub(super) fn new(listen: SocketAddr, tls: bool, allowed: AllowedCallers) -> CallerRules {
        CallerRules {
            listen,
            scheme: if tls { "https" } else { "http" },
            allowed,
        }
    }

    /// Whether `host` (a `Host` header's value) names this listener.
    fn host_is_ours(&self, host: &str) -> bool {
        let Ok(authority) = host.parse::<axum::http::uri::Authority>() else {
            return false;
        };
        let name = authority.host().trim_end_matches('.').to_ascii_lowercase();
        let literal = name.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            // An address cannot be rebound: any of this listener's addresses is its own.
            return self.listen.ip().is_unspecified() || ip == self.listen.ip();
        }
        name == "localhost"
            || self
                .allowed
                .hosts
                .iter()
                .any(|allowed| allowed == "*" || *allowed == name)
    }

    /// Whether `origin` is this listener's own (reached as `host`) or an allowed one.
    fn origin_is_allowed(&self, origin: &str, host: &str) -> bool {
        let Some(origin) = Origin::parse(origin) else {
            return false;
        };
        let own = Origin::parse(&format!("{}://{host}", self.scheme));
        own.as_ref() == Some(&origin) || self.allowed.origins.contains(&origin)
    }

    /// The refusal of a request with these `method` and `headers`, if any.
    fn judge(&self, method: &Method, headers: &HeaderMap) -> Option<Response> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !self.host_is_ours(host) {
            return Some(refusal(
                StatusCode::MISDIRECTED_REQUEST,
                permission_denied(format!(
                    "Host {host:?} is not served here: use this listener's address or localhost, or allow the name with --http-allowed-host"
                )),
            ));
        }
        let origin = headers
            .get(header::ORIGIN)
            .map(|o| o.to_str().unwrap_or(""));
        let cross_site = headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        let navigation = matches!(*method, Method::GET | Method::HEAD)
            && headers
                .get("sec-fetch-mode")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"navigate"));
        let foreign = match origin {
            Some(origin) => !self.origin_is_allowed(origin, host),
            None => cross_site && !navigation,
        };
        if foreign {
            return Some(refusal(
                StatusCode::FORBIDDEN,
                permission_denied(format!(
                    "a request from another site (Origin {}) is refused: allow its origin with --http-allowed-origin",
                    origin.map_or_else(
                        || "absent, Sec-Fetch-Site: cross-site".to_owned(),
                        |o| format!("{o:?}")
                    )
                )),
            ));
        }
        let changes_state = matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        if changes_state && !is_json(headers) {
            return Some(refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                invalid(
                    "Content-Type",
                    "must be application/json for a request that changes anything",
                ),
            ));
        }
        None
    }
}

/// The middleware: a refused request is answered here; any other goes on to its route.
pub(super) async fn check(
    State(rules): State<Arc<CallerRules>>,
    request: Request,
    next: Next,
) -> Response {
    match rules.judge(request.method(), request.headers()) {
        Some(refused) => {
            tracing::info!(method = %request.method(), path = request.uri().path(), status = refused.status().as_u16(), "HTTP request refused by the origin rules");
            refused
        }
        None => next.run(request).await,
    }
}

/// Whether the body is declared JSON: `application/json`, parameters (a charset) allowed.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

fn permission_denied(message: String) -> tonic::Status {
    let details = tonic_types::ErrorDetails::with_error_info(
        "PERMISSION_DENIED",
        "tcc.v1",
        std::collections::HashMap::new(),
    );
    <tonic::Status as tonic_types::StatusExt>::with_error_details(
        tonic::Code::PermissionDenied,
        message,
        details,
    )
}

/// `status` as JSON (the one rendering), answered with `http` rather than its mapped status.
fn refusal(http: StatusCode, status: tonic::Status) -> Response {
    let mut response = respond(&status);
    *response.status_mut() = http;
    response
}

/// An origin as browsers send it: scheme, lowercase host, and the port (the scheme's default
/// filled in), so `http://LocalHost` and `http://localhost:80` are one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    fn parse(text: &str) -> Option<Origin> {
        let uri = text.trim().parse::<axum::http::Uri>().ok()?;
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        // An origin is scheme, host and port only: no path, query or user.
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/")
            || text.trim().ends_with('/')
            || uri.authority()?.as_str().contains('@')
        {
            return None;
        }
        let authority = uri.authority()?;
        Some(Origin {
            scheme,
            host: authority.host().trim_end_matches('.').to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(default_port),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(listen: &str, hosts: &[&str], origins: &[&str]) -> CallerRules {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let allowed = AllowedCallers::parse(&owned(hosts), &owned(origins)).unwrap();
        CallerRules::new(listen.parse().unwrap(), false, allowed)
    }

    #[test]
    fn hosts_are_the_listeners_addresses_localhost_or_named() {
        let r = rules("127.0.0.1:8080", &["holdfast.internal"], &[]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "holdfast.internal:8080",
            "localhost.",
        ] {
            assert!(r.host_is_ours(ok), "{ok}");
        }
        for refused in [
            "evil.example:8080",
            "10.0.0.1:8080",
            "",
            "127.0.0.1.evil.example",
            "[::1]:8080",
        ] {
            assert!(!r.host_is_ours(refused), "{refused}");
        }
        let any_address = rules("0.0.0.0:8080", &[], &[]);
        assert!(any_address.host_is_ours("10.0.0.1:8080"));
        assert!(!any_address.host_is_ours("evil.example"));
        assert!(rules("127.0.0.1:8080", &["*"], &[]).host_is_ours("evil.example"));
    }

    #[test]
    fn origins_are_the_listeners_own_or_named() {
        let r = rules("127.0.0.1:8080", &[], &["https://shop.example"]);
        assert!(r.origin_is_allowed("http://localhost:8080", "localhost:8080"));
        assert!(r.origin_is_allowed("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(r.origin_is_allowed("https://shop.example:443", "127.0.0.1:8080"));
        for refused in [
            "http://evil.example",
            "null",
            "http://localhost:3000",
            "https://localhost:8080",
        ] {
            assert!(!r.origin_is_allowed(refused, "localhost:8080"), "{refused}");
        }
    }

    #[test]
    fn bad_flag_values_are_refused_naming_the_flag() {
        let err = AllowedCallers::parse(&[], &["https://shop.example/path".into()]).unwrap_err();
        assert!(err.starts_with("--http-allowed-origin"), "{err}");
        let err = AllowedCallers::parse(&["a b".into()], &[]).unwrap_err();
        assert!(err.starts_with("--http-allowed-host"), "{err}");
    }
}
