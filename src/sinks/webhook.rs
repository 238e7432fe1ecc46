//! Webhooks (SPEC 10): each event `POST`ed to an operator's endpoint as the JSON API's event
//! (one per request, in sequence order), signed so the receiver can tell it came from this
//! coordinator and is fresh: `Holdfast-Signature: t=<unix seconds>,v1=<hex
//! HMAC-SHA256(secret, "<t>.<body>")>`, beside `Holdfast-Event-Id` and `Holdfast-Sequence`. A
//! 2xx answer is delivery; anything else, or no answer within [`REQUEST_TIMEOUT`], is a failure
//! the delivery loop retries. An endpoint failing for its give-up period is paused.
//!
//! One HTTP/1.1 connection per endpoint, kept alive between events (TLS for `https://`,
//! verified against the system roots or `--webhook-ca`).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use ring::hmac;
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::{Delivered, Sink, SinkError};
use crate::proto;

/// The longest wait for one POST: connecting, sending, the answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`Webhook::deliver`] call starts no new POST after this long, so the delivery loop renews
/// its lease between calls.
const DELIVER_BUDGET: Duration = Duration::from_secs(5);

/// The most of an answer's body read (and dropped) to keep the connection.
const MAX_ANSWER: usize = 64 * 1024;

/// Why a webhook cannot be configured.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("--webhook {name}={url}: {why}")]
    Url {
        name: String,
        url: String,
        why: String,
    },
    #[error("--webhook-secret-file {path}: {why}")]
    Secret { path: String, why: String },
    #[error("--webhook-ca {path}: {why}")]
    Ca { path: String, why: String },
    #[error("webhook TLS: {0}")]
    Tls(String),
}

/// The HMAC key webhooks are signed with (`--webhook-secret-file`): never printed.
#[derive(Clone)]
pub struct WebhookSecret(Arc<Vec<u8>>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    /// The secret in `path`, without surrounding whitespace (a trailing newline); an empty
    /// file is refused.
    pub fn read(path: &Path) -> Result<WebhookSecret, WebhookError> {
        let refused = |why: String| WebhookError::Secret {
            path: path.display().to_string(),
            why,
        };
        let bytes = std::fs::read(path).map_err(|e| refused(e.to_string()))?;
        WebhookSecret::new(bytes.trim_ascii().to_vec()).map_err(refused)
    }

    /// `bytes` as a secret; empty is refused.
    pub fn new(bytes: Vec<u8>) -> Result<WebhookSecret, String> {
        if bytes.is_empty() {
            return Err("the secret is empty".into());
        }
        Ok(WebhookSecret(Arc::new(bytes)))
    }
}

/// One webhook, as configured.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Its name (`--webhook NAME=URL`): the metric's `endpoint`, `ResumeWebhook`'s name.
    pub name: String,
    /// `http://` or `https://`.
    pub url: String,
    /// The event types it takes (`--webhook-filter`); `None`: every one.
    pub types: Option<Vec<proto::event::Type>>,
    pub secret: WebhookSecret,
    /// Failing this long without a success pauses it (`--webhook-give-up`).
    pub give_up: Duration,
    /// The CA an `https://` endpoint's certificate must chain to (`--webhook-ca`); `None`:
    /// the system roots.
    pub ca: Option<std::path::PathBuf>,
}

/// Where the POSTs go.
#[derive(Debug)]
struct Target {
    /// The TLS config and the name verified, for `https://`.
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    /// `host:port` to connect to.
    address: String,
    /// The `Host` header.
    authority: String,
    /// The request target (path and query).
    path: String,
    /// `scheme://authority/path`, for messages.
    shown: String,
}

/// A webhook sink ([`Sink`]): signed POSTs, one event each, in order.
pub struct Webhook {
    /// `webhook:<name>`: its cursor's name.
    sink_name: String,
    /// Its name (`--webhook NAME=URL`), the metric's `endpoint`.
    endpoint: String,
    target: Target,
    types: Option<Vec<proto::event::Type>>,
    key: hmac::Key,
    give_up: Duration,
    connection: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl Webhook {
    /// The webhook `settings` describe, its URL and CA checked.
    pub fn new(settings: WebhookSettings) -> Result<Webhook, WebhookError> {
        let target = target(&settings)?;
        crate::telemetry::ops::webhook_started(&settings.name);
        Ok(Webhook {
            sink_name: crate::coordinator::admin::webhook_sink_name(&settings.name),
            endpoint: settings.name,
            target,
            types: settings.types,
            key: hmac::Key::new(hmac::HMAC_SHA256, &settings.secret.0),
            give_up: settings.give_up,
            connection: tokio::sync::Mutex::new(None),
        })
    }

    /// POSTs one event; `Err` says why it is not delivered.
    async fn post(&self, event: &proto::Event) -> Result<(), String> {
        let body =
            crate::json::event_bytes(event).map_err(|e| format!("the event as JSON: {e}"))?;
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let signature = format!("t={t},v1={}", sign(&self.key, t, &body));
        let request = Request::post(self.target.path.as_str())
            .header(header::HOST, self.target.authority.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::USER_AGENT,
                concat!("holdfast/", env!("CARGO_PKG_VERSION")),
            )
            .header("holdfast-event-id", event.event_id.as_str())
            .header("holdfast-sequence", event.sequence.to_string())
            .header("holdfast-signature", signature)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("the request: {e}"))?;
        let mut connection = self.connection.lock().await;
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let reusable = match connection.as_mut() {
                Some(sender) => sender.ready().await.is_ok(),
                None => false,
            };
            let sender = match connection.as_mut() {
                Some(sender) if reusable => sender,
                _ => connection.insert(connect(&self.target).await?),
            };
            let answer = sender
                .send_request(request)
                .await
                .map_err(|e| format!("POST {}: {e}", self.target.shown))?;
            let status = answer.status();
            // Read what little it says, so the connection can carry the next event.
            let read = Limited::new(answer.into_body(), MAX_ANSWER).collect().await;
            Ok::<_, String>((status, read.is_ok()))
        })
        .await;
        let outcome = match sent {
            Ok(Ok((status, read_whole))) => {
                if !read_whole || !status.is_success() {
                    *connection = None;
                }
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("POST {} answered {status}", self.target.shown))
                }
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!(
                "POST {}: no answer within {}s",
                self.target.shown,
                REQUEST_TIMEOUT.as_secs()
            )),
        };
        if outcome.is_err() {
            *connection = None;
        }
        outcome
    }
}

impl Sink for Webhook {
    fn name(&self) -> &str {
        self.sink_name.as_str()
    }

    fn wants(&self, event: &proto::Event) -> bool {
        self.types
            .as_ref()
            .is_none_or(|types| types.contains(&event.r#type()))
    }

    fn give_up(&self) -> Option<Duration> {
        Some(self.give_up)
    }

    fn deliver<'a>(
        &'a self,
        events: &'a [proto::Event],
    ) -> Pin<Box<dyn Future<Output = Delivered> + Send + 'a>> {
        Box::pin(async move {
            let started = Instant::now();
            let mut delivered = 0;
            for event in events {
                if started.elapsed() >= DELIVER_BUDGET {
                    break;
                }
                if let Err(e) = self.post(event).await {
                    crate::telemetry::ops::webhook_failed(&self.endpoint);
                    return Delivered {
                        delivered,
                        error: Some(SinkError(e)),
                    };
                }
                delivered += 1;
            }
            Delivered {
                delivered,
                error: None,
            }
        })
    }
}

/// `hex(HMAC-SHA256(key, "<t>.<body>"))`.
fn sign(key: &hmac::Key, t: u64, body: &[u8]) -> String {
    let mut signed = hmac::Context::with_key(key);
    signed.update(t.to_string().as_bytes());
    signed.update(b".");
    signed.update(body);
    signed
        .sign()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A connection's stream: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A new HTTP/1.1 connection to `target`, its driver running in the background.
async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, String> {
    let failed = |e: &dyn std::fmt::Display| format!("connecting to {}: {e}", target.shown);
    let tcp = TcpStream::connect(&target.address)
        .await
        .map_err(|e| failed(&e))?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Stream> = match &target.tls {
        Some((config, name)) => Box::new(
            tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), tcp)
                .await
                .map_err(|e| failed(&format!("TLS: {e}")))?,
        ),
        None => Box::new(tcp),
    };
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(&e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "webhook connection closed");
        }
    });
    Ok(sender)
}

/// The URL of `settings`, checked, and its TLS config for `https://`.
fn target(settings: &WebhookSettings) -> Result<Target, WebhookError> {
    let refused = |why: &str| WebhookError::Url {
        name: settings.name.clone(),
        url: settings.url.clone(),
        why: why.to_owned(),
    };
    let uri: Uri = settings
        .url
        .parse()
        .map_err(|e: http::uri::InvalidUri| refused(&e.to_string()))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(refused("the URL must start with http:// or https://")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| refused("the URL has no host"))?;
    if authority.as_str().contains('@') {
        return Err(refused(
            "credentials in the URL are not sent (the signature authenticates the coordinator)",
        ));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let tls = if https {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| refused(&format!("not a host name TLS can verify: {e}")))?;
        Some((client_config(settings.ca.as_deref())?, name))
    } else {
        None
    };
    Ok(Target {
        tls,
        address: if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        },
        authority: authority.as_str().to_owned(),
        shown: format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or("http"),
            authority,
            uri.path()
        ),
        path,
    })
}

/// A TLS client config trusting `ca` alone, or the system roots; HTTP/1.1 only.
fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, WebhookError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let refused = |why: String| WebhookError::Ca {
                path: path.display().to_string(),
                why,
            };
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| refused(e.to_string()))? {
                let cert = cert.map_err(|e| refused(e.to_string()))?;
                roots.add(cert).map_err(|e| refused(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(refused("no certificate in the file".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(WebhookError::Tls(
                    "no system CA certificates to verify https:// webhooks with: give --webhook-ca FILE".into(),
                ));
            }
        }
    }
    let mut config = ClientConfig::builder_with_provider(crate::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> WebhookSettings {
        WebhookSettings {
            name: "orders".into(),
            url: url.into(),
            types: None,
            secret: WebhookSecret::new(b"s3cret".to_vec()).unwrap(),
            give_up: Duration::from_secs(60),
            ca: None,
        }
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_time_dot_body_in_hex() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"key");
        // HMAC-SHA256("key", "1700000000.{}"), computed independently (Python's hmac).
        assert_eq!(
            sign(&key, 1_700_000_000, b"{}"),
            "9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        );
        assert_eq!(sign(&key, 1, b"x").len(), 64);
    }

    #[test]
    fn urls_are_checked() {
        let target = target(&settings("http://127.0.0.1:8080/hooks/holdfast?x=1")).unwrap();
        assert_eq!(target.address, "127.0.0.1:8080");
        assert_eq!(target.path, "/hooks/holdfast?x=1");
        assert_eq!(target.authority, "127.0.0.1:8080");
        assert!(target.tls.is_none());
        let v6 = super::target(&settings("http://[::1]/")).unwrap();
        assert_eq!(v6.address, "[::1]:80");
        for bad in ["ftp://x/", "http://user:pw@x/", "not a url", "/relative"] {
            assert!(super::target(&settings(bad)).is_err(), "{bad}");
        }
        assert!(WebhookSecret::new(Vec::new()).is_err());
        assert_eq!(
            format!("{:?}", settings("http://x/").secret),
            "WebhookSecret(..)"
        );
    }
}
