//! Transport security (SPEC 7.1), in one place: the certificates a server serves and the
//! client certificates it requires ([`ServerTls`]), how the coordinator reaches `https://`
//! participants ([`ClientTls`]), and the one rustls crypto provider of the process (ring).
//!
//! Both sides re-read their certificate files when they change ([`reload`]), so certificates
//! can be renewed without a restart. Servers accept TLS connections through `crate::conn`
//! (handshakes, [`incoming`], run concurrently within the listener's header timeout); clients
//! connect through [`connector`]: an `https://` URL is only ever reached over verified TLS,
//! never plaintext. With TLS off, none of this runs: the servers take `crate::conn`'s plain path.

mod connector;
// The trust of a PostgreSQL server's certificate (`db/pg_tls.rs`), built with that driver only.
#[cfg(feature = "postgres")]
mod database;
pub(crate) mod incoming;
mod listener;
mod material;
mod pin;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::CertificateDer;

use crate::watched::{Source, Watched};
use material::Trust;

pub(crate) use crate::watched::CHECK_EVERY;
#[cfg(feature = "postgres")]
pub(crate) use database::{DatabaseRoots, DatabaseTrust};
pub use listener::Listener;

/// Counts certificate files that changed but were refused (expired, not yet valid, a key that
/// does not match, unreadable): the previous certificates stay in use.
pub const TLS_RELOAD_FAILURES: &str = "holdfast_tls_reload_failures_total";

/// Why TLS settings could not be used. Each message names the setting (flag) and file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    File(#[from] crate::watched::FileError),
    #[error("{0}")]
    Config(String),
}

/// The process's one rustls crypto provider (ring), also installed as the process default so
/// every library building its own TLS config (sqlx, redis) uses the same one.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            // Fails only if a default is already installed; then that one is used everywhere.
            let _ = rustls::crypto::ring::default_provider().install_default();
            CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
        })
        .clone()
}

/// The files of a TLS server (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The certificate chain, end-entity certificate first (`--tls-cert`).
    pub cert: PathBuf,
    /// Its private key (`--tls-key`).
    pub key: PathBuf,
    /// When set, clients must present a certificate chaining to this CA (`--tls-client-ca`).
    pub client_ca: Option<PathBuf>,
}

/// What a TLS server presents right now, built from its files.
struct Served {
    /// For gRPC ports (ALPN `h2`).
    grpc: Arc<ServerConfig>,
    /// For HTTP/1.1 listeners (metrics).
    http1: Arc<ServerConfig>,
    /// The end-entity certificate, for the all-in-one's pin on its own participants.
    certificate: CertificateDer<'static>,
}

/// A server's TLS: the current certificate (re-read when its files change) and, with a client
/// CA, the requirement that clients present a certificate it signed. Cheap to clone; every
/// clone serves the same, current certificate.
#[derive(Clone)]
pub struct ServerTls {
    served: Arc<Watched<Served>>,
    files: ServerTlsFiles,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish()
    }
}

impl ServerTls {
    /// Loads the files (an error names the flag and file), re-reading them every
    /// [`CHECK_EVERY`]. Call inside a Tokio runtime, which runs the re-reading.
    pub fn load(files: &ServerTlsFiles) -> Result<ServerTls, TlsError> {
        ServerTls::load_checking_every(files, CHECK_EVERY)
    }

    /// The changes of the certificate files applied and refused so far.
    pub fn file_changes(&self) -> crate::watched::Changes {
        self.served.changes()
    }

    /// [`ServerTls::load`], checking the files for changes every `every`.
    pub fn load_checking_every(
        files: &ServerTlsFiles,
        every: Duration,
    ) -> Result<ServerTls, TlsError> {
        let mut sources = vec![
            Source::new("--tls-cert", &files.cert),
            Source::new("--tls-key", &files.key),
        ];
        if let Some(ca) = &files.client_ca {
            sources.push(Source::new("--tls-client-ca", ca));
        }
        let named = sources.clone();
        let served = Watched::load_counting(
            "certificate files",
            Some(TLS_RELOAD_FAILURES),
            sources,
            every,
            move |bytes: &[Vec<u8>]| -> Result<_, TlsError> {
                let key = material::certified_key((&named[0], &bytes[0]), (&named[1], &bytes[1]))?;
                let client_roots = match (named.get(2), bytes.get(2)) {
                    (Some(source), Some(pem)) => Some((source, material::roots(source, pem)?)),
                    _ => None,
                };
                let client_roots = client_roots
                    .as_ref()
                    .map(|(source, roots)| (*source, roots));
                Ok(Served {
                    grpc: material::server_config(key.clone(), client_roots, material::ALPN_H2)?,
                    http1: material::server_config(
                        key.clone(),
                        client_roots,
                        material::ALPN_HTTP1,
                    )?,
                    certificate: key.cert[0].clone(),
                })
            },
        )?;
        Ok(ServerTls {
            served,
            files: files.clone(),
        })
    }

    /// The files it serves.
    pub fn files(&self) -> &ServerTlsFiles {
        &self.files
    }

    /// Whether clients must present a certificate (`--tls-client-ca` given).
    pub fn requires_client_certificate(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The end-entity certificate served now.
    pub(crate) fn certificate(&self) -> CertificateDer<'static> {
        self.served.current().certificate.clone()
    }

    pub fn grpc_config(&self) -> Arc<ServerConfig> {
        self.served.current().grpc.clone()
    }

    pub fn http1_config(&self) -> Arc<ServerConfig> {
        self.served.current().http1.clone()
    }
}

/// The files of a TLS client (PEM): whom to trust, and what certificate to present.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// Servers must present a certificate chaining to this CA (`--participant-ca`); without
    /// it, the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate chain to present (`--participant-client-cert`).
    pub cert: Option<PathBuf>,
    /// Its private key (`--participant-client-key`).
    pub key: Option<PathBuf>,
}

/// How the coordinator speaks TLS to `https://` participants: whom it trusts and which client
/// certificate it presents, re-read when their files change. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<Watched<ClientConfig>>,
    described: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("trust", &self.described)
            .finish()
    }
}

impl ClientTls {
    /// Loads the files (errors name the flag and file): servers are verified against
    /// `files.ca`, else the system roots; `files.cert`/`files.key` are presented when given.
    /// Re-read every [`CHECK_EVERY`]; call inside a Tokio runtime.
    pub fn load(files: &ClientTlsFiles) -> Result<ClientTls, TlsError> {
        ClientTls::load_checking_every(files, CHECK_EVERY)
    }

    /// [`ClientTls::load`], checking the files for changes every `every`.
    pub fn load_checking_every(
        files: &ClientTlsFiles,
        every: Duration,
    ) -> Result<ClientTls, TlsError> {
        let identity = identity_sources(files)?;
        let ca = files
            .ca
            .as_deref()
            .map(|p| Source::new("--participant-ca", p));
        let mut sources: Vec<Source> = identity.iter().flatten().cloned().collect();
        sources.extend(ca.clone());
        let described = match &files.ca {
            Some(ca) => format!("CA {}", ca.display()),
            None => "the system roots".to_owned(),
        };
        let config = Watched::load_counting(
            "certificate files",
            Some(TLS_RELOAD_FAILURES),
            sources,
            every,
            move |bytes: &[Vec<u8>]| -> Result<_, TlsError> {
                let (identity, rest) = match &identity {
                    Some([cert, key]) => (
                        Some(material::certified_key(
                            (cert, &bytes[0]),
                            (key, &bytes[1]),
                        )?),
                        &bytes[2..],
                    ),
                    None => (None, bytes),
                };
                let roots = match (&ca, rest.first()) {
                    (Some(source), Some(pem)) => material::roots(source, pem)?,
                    _ => material::system_roots("--participant-ca")?,
                };
                material::client_config(Trust::Roots(roots), identity)
            },
        )?;
        Ok(ClientTls { config, described })
    }

    /// TLS to this process's own servers (the all-in-one's participants on loopback): the
    /// server must present exactly the certificate `server` serves at that moment, whatever
    /// its names and issuer, so no CA is needed; `files.cert`/`files.key` are presented when
    /// given (needed when `server` requires client certificates). `files.ca` is not used.
    pub fn pinned_to(server: &ServerTls, files: &ClientTlsFiles) -> Result<ClientTls, TlsError> {
        let identity = identity_sources(files)?;
        let sources: Vec<Source> = identity.iter().flatten().cloned().collect();
        let pin = Arc::new(pin::SameAsServed::new(server.clone()));
        let config = Watched::load_counting(
            "certificate files",
            Some(TLS_RELOAD_FAILURES),
            sources,
            CHECK_EVERY,
            move |bytes: &[Vec<u8>]| -> Result<_, TlsError> {
                let identity = match &identity {
                    Some([cert, key]) => Some(material::certified_key(
                        (cert, &bytes[0]),
                        (key, &bytes[1]),
                    )?),
                    None => None,
                };
                material::client_config(Trust::Verifier(pin.clone()), identity)
            },
        )?;
        Ok(ClientTls {
            config,
            described: "this process's own certificate".to_owned(),
        })
    }

    /// A lazily connecting channel to the `https://` URL `url`, over `endpoint` (built by the
    /// caller from [`endpoint_url`]`(url)` with its timeouts and keepalives): each connection
    /// is TCP (no Nagle delay) and a TLS handshake verifying the URL's host, or an error that
    /// says the TLS handshake failed. Never plaintext.
    pub fn connect_lazy(
        &self,
        endpoint: tonic::transport::Endpoint,
        url: &str,
    ) -> Result<tonic::transport::Channel, TlsError> {
        connector::connect_lazy(self.clone(), endpoint, url)
    }

    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.current()
    }

    /// The changes of the certificate files applied and refused so far.
    pub fn file_changes(&self) -> crate::watched::Changes {
        self.config.changes()
    }
}

/// The client certificate and key files, both or neither.
fn identity_sources(files: &ClientTlsFiles) -> Result<Option<[Source; 2]>, TlsError> {
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Ok(Some([
            Source::new("--participant-client-cert", cert),
            Source::new("--participant-client-key", key),
        ])),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::Config(
            "--participant-client-cert needs --participant-client-key".into(),
        )),
        (None, Some(_)) => Err(TlsError::Config(
            "--participant-client-key needs --participant-client-cert".into(),
        )),
    }
}

/// Whether `url` promises TLS.
pub fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

/// The URL a channel's [`tonic::transport::Endpoint`] is built from: `url` itself for
/// `http://`; for `https://`, its `http://` twin, because the TLS is done by
/// [`ClientTls::connect_lazy`]'s connector (tonic's own would be a second layer), while the
/// requests still carry the `https` scheme.
pub fn endpoint_url(url: &str) -> String {
    if is_https(url) {
        format!("http://{}", &url[8..])
    } else {
        url.to_owned()
    }
}

/// How the coordinator reaches its participants.
#[derive(Clone, Debug, Default)]
pub struct ParticipantTransport {
    /// TLS for `https://` participants; without it, an `https://` participant is refused at
    /// start (never called in plaintext).
    pub tls: Option<ClientTls>,
    /// A coordinator that serves TLS may still call `http://` participants
    /// (`--allow-plaintext-participants`); otherwise it refuses to start with one.
    pub allow_plaintext: bool,
}

impl ParticipantTransport {
    /// Refuses `http://` participants for a coordinator serving TLS, unless allowed: a
    /// deployment that encrypts its front door should not silently call participants in the
    /// clear.
    pub fn check<'a>(
        &self,
        serving_tls: bool,
        participants: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), String> {
        if !serving_tls || self.allow_plaintext {
            return Ok(());
        }
        let plaintext: Vec<String> = participants
            .into_iter()
            .filter(|(_, url)| !is_https(url))
            .map(|(name, url)| format!("{name}={url}"))
            .collect();
        if plaintext.is_empty() {
            return Ok(());
        }
        Err(format!(
            "this coordinator serves TLS but would call {} in plaintext: use https:// URLs, or pass --allow-plaintext-participants to accept this",
            plaintext.join(", ")
        ))
    }
}

/// A lazily connecting channel to `url` for a command-line client (the CLI, participant-check):
/// for `https://`, TLS verified with `files` (the client's `--tls-ca`/`--tls-cert`/`--tls-key`);
/// for `http://`, plaintext, and TLS files are refused rather than ignored. `peer` names what
/// `url` is ("coordinators", "participants") in that refusal; errors are the flags' messages.
pub fn lazy_client_channel(
    url: &str,
    endpoint: tonic::transport::Endpoint,
    files: &ClientTlsFiles,
    peer: &str,
) -> Result<tonic::transport::Channel, String> {
    if is_https(url) {
        let tls = ClientTls::load(files).map_err(|e| e.to_string())?;
        tls.connect_lazy(endpoint, url).map_err(|e| e.to_string())
    } else if files.ca.is_some() || files.cert.is_some() {
        Err(format!(
            "--tls-ca and --tls-cert are for https:// {peer}, not {url:?}"
        ))
    } else {
        Ok(endpoint.connect_lazy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_urls_are_told_apart_and_get_an_http_endpoint() {
        assert!(is_https("https://a:1"));
        assert!(is_https("HTTPS://a:1"));
        assert!(!is_https("http://a:1"));
        assert!(!is_https("http"));
        assert_eq!(endpoint_url("https://a:1"), "http://a:1");
        assert_eq!(endpoint_url("http://a:1"), "http://a:1");
    }

    #[test]
    fn a_tls_coordinator_refuses_plaintext_participants_unless_allowed() {
        let participants = [("seats", "http://s:1"), ("stock", "https://t:1")];
        let strict = ParticipantTransport::default();
        let err = strict.check(true, participants).unwrap_err();
        assert!(err.contains("seats=http://s:1"), "{err}");
        assert!(err.contains("--allow-plaintext-participants"), "{err}");
        assert!(!err.contains("stock"), "{err}");
        assert!(strict.check(false, participants).is_ok());
        let lenient = ParticipantTransport {
            allow_plaintext: true,
            ..ParticipantTransport::default()
        };
        assert!(lenient.check(true, participants).is_ok());
    }
}
