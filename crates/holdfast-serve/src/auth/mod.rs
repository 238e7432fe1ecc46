//! Who is calling, and may they (SPEC 7.2). Every gRPC server goes through
//! [`crate::server`], whose auth layer asks [`Authenticator::admit`] about each request before
//! any handler runs, so no handler can forget it:
//! - the method's [`rules::Rule`] says which roles may call it (health is open; reflection
//!   needs any principal; everything unlisted is admin-only);
//! - the caller proves who it is with `authorization: Bearer <key>` (the principals file holds
//!   only the key's SHA-256, compared in constant time) or a verified client certificate whose
//!   DNS SAN or CN is a principal's `tls_identity` ([`identity`]): the TLS connection's, or on an
//!   in-process request the one a listener of this process verified
//!   ([`VerifiedClientCertificates`]);
//! - an admitted request carries its [`Caller`] in its extensions; handlers that scope data by
//!   owner (the coordinator's `api`) read it there.
//!
//! Refusals are `UNAUTHENTICATED` or `PERMISSION_DENIED` with ErrorInfo reasons of the same
//! names, counted in `holdfast_auth_failures_total{reason}` and logged without the credential.
//! The principals file is re-read when it changes ([`crate::watched`]): a removed key stops
//! working within seconds, without a restart. With authentication off every request is the
//! anonymous caller, who has every role.

pub mod bearer;
pub mod identity;
pub mod keys;
pub mod principals;
pub mod rules;

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::watched::{FileError, Source, Watched};
pub use bearer::Bearer;
pub use principals::Principals;
pub use rules::Rule;

/// Requests refused by authentication or authorisation, by `reason` (SPEC 5).
pub const AUTH_FAILURES: &str = "holdfast_auth_failures_total";

/// A role (SPEC 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The Coordinator RPCs on its own reservations, `Payments/Charge`, `GetResource`.
    Client,
    /// Everything, across principals.
    Admin,
    /// What participants accept from the coordinator: `tcc.v1.Participant`, refunds.
    Coordinator,
    /// Reading `/metrics` (a Prometheus scraper), nothing else.
    Metrics,
}

impl Role {
    /// Every role, in the order they are written.
    pub const ALL: [Role; 4] = [Role::Client, Role::Admin, Role::Coordinator, Role::Metrics];

    /// The role's name in the principals file.
    pub fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Admin => "admin",
            Role::Coordinator => "coordinator",
            Role::Metrics => "metrics",
        }
    }

    /// A role by its name.
    pub fn parse(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?} (roles: client, admin, coordinator, metrics)")
            })
    }

    fn bit(self) -> u8 {
        match self {
            Role::Client => 1,
            Role::Admin => 2,
            Role::Coordinator => 4,
            Role::Metrics => 8,
        }
    }
}

/// A client certificate chain a TLS listener of this process verified, carried on a request
/// that reaches the auth layer in-process (the HTTP API's calls to the gRPC routes): the auth
/// layer identifies its caller by it as it would a gRPC caller's certificate. Request
/// extensions never come from the wire, so only code in this process can attach one.
#[derive(Clone, Debug)]
pub struct VerifiedClientCertificates(pub Arc<Vec<CertificateDer<'static>>>);

impl VerifiedClientCertificates {
    /// The chain `connection`'s handshake verified, if its listener asked for one.
    pub fn verified_by(connection: &rustls::ServerConnection) -> Option<Self> {
        connection.peer_certificates().map(|chain| {
            VerifiedClientCertificates(Arc::new(
                chain.iter().map(|c| c.clone().into_owned()).collect(),
            ))
        })
    }
}

/// The authenticated caller of one request: a principal and its roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    principal: Arc<str>,
    roles: u8,
}

impl Caller {
    pub fn new(principal: Arc<str>, roles: &[Role]) -> Caller {
        Caller {
            principal,
            roles: roles.iter().fold(0, |acc, r| acc | r.bit()),
        }
    }

    /// Authentication off: nobody in particular, with every role.
    pub fn anonymous() -> Caller {
        Caller::new(Arc::from(""), &Role::ALL)
    }

    /// The principal's name (empty for the anonymous caller).
    pub fn principal(&self) -> &str {
        &self.principal
    }

    pub fn has(&self, role: Role) -> bool {
        self.roles & role.bit() != 0
    }

    fn roles(&self) -> String {
        Role::ALL
            .into_iter()
            .filter(|r| self.has(*r))
            .map(Role::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No credential, or one nobody has.
    Unauthenticated,
    /// A known principal whose roles do not include the method.
    PermissionDenied,
}

impl Refused {
    /// The ErrorInfo reason and metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Unauthenticated => "UNAUTHENTICATED",
            Refused::PermissionDenied => "PERMISSION_DENIED",
        }
    }
}

/// The status of a refusal, with its ErrorInfo (domain `tcc.v1`).
pub fn refusal(refused: Refused, message: impl Into<String>) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let details = ErrorDetails::with_error_info(
        refused.reason(),
        "tcc.v1",
        std::collections::HashMap::<String, String>::new(),
    );
    let code = match refused {
        Refused::Unauthenticated => tonic::Code::Unauthenticated,
        Refused::PermissionDenied => tonic::Code::PermissionDenied,
    };
    tonic::Status::with_error_details(code, message, details)
}

/// A principals file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    File(#[from] FileError),
}

/// How a server authenticates its callers.
#[derive(Clone, Default)]
pub enum Authenticator {
    /// Authentication off: every caller is [`Caller::anonymous`] (loopback-only by default).
    #[default]
    Off,
    /// Authentication off on purpose on any address (`--insecure-no-auth`): every caller is
    /// [`Caller::anonymous`], wherever it comes from.
    InsecureNoAuth,
    /// The principals of `--auth-keys`, as last read.
    Keys(Arc<Watched<Principals>>),
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Authenticator::Off => f.write_str("Authenticator::Off"),
            Authenticator::InsecureNoAuth => f.write_str("Authenticator::InsecureNoAuth"),
            Authenticator::Keys(p) => {
                write!(f, "Authenticator::Keys({} principals)", p.current().len())
            }
        }
    }
}

impl Authenticator {
    /// Reads the principals file (`flag` names it in errors), watching it for changes.
    pub fn from_file(flag: &'static str, path: &Path) -> Result<Authenticator, AuthError> {
        let source = Source::new(flag, path);
        let named = source.clone();
        let watched = Watched::load(
            "principals file",
            vec![source],
            crate::watched::CHECK_EVERY,
            move |bytes: &[Vec<u8>]| -> Result<Principals, AuthError> {
                let text = bytes
                    .first()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                Principals::parse(&text).map_err(|e| named.invalid(e).into())
            },
        )?;
        let principals = watched.current();
        if principals.is_empty() {
            tracing::warn!(file = %path.display(), "the principals file names nobody: every call will be refused");
        }
        Ok(Authenticator::Keys(watched))
    }

    /// The changes of the principals file applied and refused so far (none when off).
    pub fn file_changes(&self) -> crate::watched::Changes {
        match self {
            Authenticator::Off | Authenticator::InsecureNoAuth => {
                crate::watched::Changes::default()
            }
            Authenticator::Keys(watched) => watched.changes(),
        }
    }

    /// Whether callers must prove who they are.
    pub fn is_on(&self) -> bool {
        matches!(self, Authenticator::Keys(_))
    }

    /// Whether a server admitting callers this way may listen on `addr`: without keys only on
    /// loopback, unless [`Authenticator::InsecureNoAuth`] says otherwise (SPEC 7.2, 7.4).
    pub(crate) fn may_listen_on(&self, addr: std::net::SocketAddr) -> Result<(), String> {
        match self {
            Authenticator::Off if !addr.ip().is_loopback() => Err(format!(
                "refusing to listen on {addr} without authentication: give an authenticator with keys (Authenticator::from_file), listen on a loopback address, or use Authenticator::InsecureNoAuth to let anyone who reaches the port do anything"
            )),
            _ => Ok(()),
        }
    }

    /// Decides whether `request` may reach its method: its caller (`None` for an open method
    /// reached without credentials), or the refusal to answer with (already counted and
    /// logged).
    pub fn admit<B>(&self, request: &http::Request<B>) -> Result<Option<Caller>, tonic::Status> {
        let Authenticator::Keys(principals) = self else {
            return Ok(Some(Caller::anonymous()));
        };
        let path = request.uri().path();
        let rule = rules::of(path);
        let principals = principals.current();
        let caller = match identify(&principals, request) {
            Ok(caller) => caller,
            Err(_) if rule == Rule::Open => return Ok(None),
            Err(problem) => return Err(refuse(Refused::Unauthenticated, path, None, problem)),
        };
        let allowed = match rule {
            Rule::Open | Rule::Authenticated => true,
            Rule::Roles(roles) => roles.iter().any(|r| caller.has(*r)),
        };
        if !allowed {
            let message = format!(
                "principal {:?} (roles: {}) may not call {path}",
                caller.principal(),
                caller.roles()
            );
            return Err(refuse(
                Refused::PermissionDenied,
                path,
                Some(caller.principal()),
                message,
            ));
        }
        Ok(Some(caller))
    }
}

/// The caller a request's credential proves: its bearer key if it sends one (a wrong key is
/// not rescued by a certificate), else its verified client certificate.
fn identify<B>(principals: &Principals, request: &http::Request<B>) -> Result<Caller, String> {
    if let Some(header) = request.headers().get(http::header::AUTHORIZATION) {
        let key = header
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, key) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
            })
            .filter(|k| !k.is_empty())
            .ok_or("the authorization header is not `Bearer <key>`")?;
        return principals
            .by_key(key)
            .cloned()
            .ok_or_else(|| "unknown API key".to_owned());
    }
    let extensions = request.extensions();
    let certs = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
        .or_else(|| {
            extensions
                .get::<VerifiedClientCertificates>()
                .map(|v| v.0.clone())
        });
    match certs {
        Some(chain) => {
            let ids = identity::of_chain(&chain);
            principals
                .by_identity(ids.iter().map(String::as_str))
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "the client certificate ({}) is no principal's tls_identity",
                        ids.join(", ")
                    )
                })
        }
        None => {
            Err("no credential: send `authorization: Bearer <key>` or a client certificate".into())
        }
    }
}

/// Counts and logs a refusal (never the credential) and builds its status.
fn refuse(refused: Refused, path: &str, principal: Option<&str>, message: String) -> tonic::Status {
    metrics::counter!(AUTH_FAILURES, "reason" => refused.reason()).increment(1);
    tracing::warn!(
        reason = refused.reason(),
        method = path,
        principal = principal.unwrap_or("-"),
        "{message}"
    );
    refusal(refused, message)
}
