//! How the bench's gRPC hops speak: plaintext (the default), or TLS on every hop with
//! `--tls-cert`/`--tls-key`/`--tls-ca` (and mTLS with `--tls-client-auth`). One [`Transport`]
//! per run decides the in-process servers' listeners and the URLs they are reached at, the
//! coordinator's transport towards its participants, and the bench's own client channels, so
//! a TLS run differs from a plaintext one in nothing but the transport.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

use super::BenchArgs;
use super::credentials::{BenchChannel, Credentials};
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::tls::{
    ClientTls, ClientTlsFiles, Listener, ParticipantTransport, ServerTls, ServerTlsFiles, TlsError,
    endpoint_url, is_https,
};

/// How one bench run's hops speak. Cheap to clone; the default is plaintext.
#[derive(Clone, Debug, Default)]
pub struct Transport {
    /// What every in-process server serves (in-process TLS runs only).
    server: Option<ServerTls>,
    /// How `https://` URLs are reached: by the bench's clients, and by the in-process
    /// coordinator towards its participants.
    client: Option<ClientTls>,
    /// Servers require, and clients present, a certificate (`--tls-client-auth`).
    client_auth: bool,
    /// Whether the coordinator is reached over TLS.
    tls: bool,
    /// The keys calls present, and servers check (`--auth`, `--api-key`).
    pub(crate) credentials: Credentials,
}

impl Transport {
    /// The transport `args` ask for; an error names the flag. In-process, any TLS flag needs
    /// `--tls-cert`, `--tls-key` and `--tls-ca`; with `--target`, each URL's scheme decides,
    /// and `https://` ones are verified against `--tls-ca` (else the system roots). Loads the
    /// files (re-read when they change, like every holdfast server's), so call it inside the
    /// Tokio runtime. In-process, one TLS handshake on loopback checks the certificate first.
    pub(crate) async fn from_args(args: &BenchArgs) -> Result<Transport, String> {
        let credentials = Credentials::from_args(args)?;
        let transport = match &args.target {
            None => Transport::in_process(args).await,
            Some(target) => Transport::remote(args, target),
        }?;
        Ok(Transport {
            credentials,
            ..transport
        })
    }

    async fn in_process(args: &BenchArgs) -> Result<Transport, String> {
        let any = args.tls_cert.is_some()
            || args.tls_key.is_some()
            || args.tls_ca.is_some()
            || args.tls_client_auth;
        if !any {
            return Ok(Transport::default());
        }
        let need = |file: &Option<PathBuf>, flag: &str| {
            file.clone().ok_or_else(|| {
                format!(
                    "TLS on every hop needs --tls-cert, --tls-key and --tls-ca: {flag} is missing"
                )
            })
        };
        let (cert, key, ca) = (
            need(&args.tls_cert, "--tls-cert")?,
            need(&args.tls_key, "--tls-key")?,
            need(&args.tls_ca, "--tls-ca")?,
        );
        let server = ServerTls::load(&ServerTlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.tls_client_auth.then(|| ca.clone()),
        })
        .map_err(in_bench_terms)?;
        let client = ClientTls::load(&ClientTlsFiles {
            ca: Some(ca),
            cert: args.tls_client_auth.then_some(cert),
            key: args.tls_client_auth.then_some(key),
        })
        .map_err(in_bench_terms)?;
        check_loopback_handshake(&server, &client, args.tls_client_auth).await?;
        Ok(Transport {
            server: Some(server),
            client: Some(client),
            client_auth: args.tls_client_auth,
            tls: true,
            credentials: Credentials::default(),
        })
    }

    fn remote(args: &BenchArgs, target: &str) -> Result<Transport, String> {
        let urls = [target, &args.seats_admin, &args.stock_admin];
        let any_https = urls.iter().any(|u| is_https(u));
        if !any_https && (args.tls_ca.is_some() || args.tls_client_auth) {
            return Err(
                "--tls-ca and --tls-client-auth are for https:// URLs: with --target, use https:// for --target, --seats-admin or --stock-admin".into(),
            );
        }
        let identity = match (args.tls_client_auth, &args.tls_cert, &args.tls_key) {
            (_, None, None) if !args.tls_client_auth => None,
            (true, Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (true, _, _) => {
                return Err(
                    "--tls-client-auth needs --tls-cert and --tls-key (the client certificate presented)".into(),
                );
            }
            (false, _, _) => {
                return Err(
                    "with --target, --tls-cert and --tls-key are a client certificate: add --tls-client-auth to present them".into(),
                );
            }
        };
        if !any_https {
            return Ok(Transport::default());
        }
        let (cert, key) = identity.unzip();
        let client = ClientTls::load(&ClientTlsFiles {
            ca: args.tls_ca.clone(),
            cert,
            key,
        })
        .map_err(in_bench_terms)?;
        Ok(Transport {
            server: None,
            client: Some(client),
            client_auth: args.tls_client_auth,
            tls: is_https(target),
            credentials: Credentials::default(),
        })
    }

    /// Whether the coordinator is reached over TLS (in-process: every hop is).
    pub(crate) fn is_tls(&self) -> bool {
        self.tls
    }

    /// Whether client certificates are presented (and, in-process, required).
    pub(crate) fn client_auth(&self) -> bool {
        self.client_auth
    }

    /// Whether calls carry API keys (and, in-process, servers check them).
    pub fn auth(&self) -> bool {
        self.credentials.is_on()
    }

    /// The authentication line of the summary, for runs with keys only.
    pub(crate) fn describe_auth(&self) -> Option<String> {
        self.auth()
            .then(|| "authentication on (API keys on every call)".to_owned())
    }

    /// The transport line of the summary, for TLS runs only (plaintext runs print as before).
    pub fn describe(&self) -> Option<String> {
        let auth = if self.client_auth {
            ", client certificates required"
        } else {
            ""
        };
        match (&self.server, self.tls) {
            (Some(_), _) => Some(format!("transport TLS (every gRPC hop{auth})")),
            (None, true) => Some(format!("transport TLS (to the target{auth})")),
            (None, false) => None,
        }
    }

    /// A loopback port for an in-process server, serving TLS when this transport does, and
    /// the URL it is reached at (`https://` then).
    pub(crate) async fn bind(&self) -> Result<(Listener, String), String> {
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("binding a loopback port: {e}"))?;
        let addr = tcp
            .local_addr()
            .map_err(|e| format!("reading a bound address: {e}"))?;
        let scheme = if self.server.is_some() {
            "https"
        } else {
            "http"
        };
        Ok((
            Listener::new(tcp, self.server.clone()),
            format!("{scheme}://{addr}"),
        ))
    }

    /// How the in-process coordinator reaches its participants: over TLS trusting `--tls-ca`
    /// (presenting `--tls-cert` with `--tls-client-auth`) when this transport is TLS.
    pub(crate) fn participant_transport(&self) -> ParticipantTransport {
        ParticipantTransport {
            tls: self.client.clone(),
            allow_plaintext: false,
        }
    }

    /// A lazily connected channel to the coordinator at `url`, presenting the client key.
    pub fn channel(&self, url: &str) -> Result<BenchChannel, String> {
        Ok(BenchChannel::new(
            self.raw_channel(url)?,
            self.credentials.client(),
        ))
    }

    /// A lazily connected channel to `url`: TLS for `https://`, else plaintext.
    fn raw_channel(&self, url: &str) -> Result<Channel, String> {
        if !is_https(url) {
            return Ok(channel(url)?.connect_lazy());
        }
        let tls = self
            .client
            .as_ref()
            .ok_or_else(|| format!("{url}: https:// needs the bench's TLS flags"))?;
        tls.connect_lazy(channel(&endpoint_url(url))?, url)
            .map_err(|e| e.to_string())
    }

    /// `n` lazily connected channels to the coordinator at `urls` (clients spread over them
    /// round robin): one URL, or replicas' URLs separated by commas, channel `i` to the
    /// `i % replicas`th.
    pub fn channels(&self, urls: &str, n: usize) -> Result<Vec<BenchChannel>, String> {
        let replicas: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        if replicas.is_empty() {
            return Err(format!("no coordinator URL in {urls:?}"));
        }
        (0..n.max(1))
            .map(|i| {
                let url = replicas[i % replicas.len()];
                if is_https(url) {
                    self.channel(url)
                } else {
                    Ok(BenchChannel::new(
                        channel(url)?.connect_lazy(),
                        self.credentials.client(),
                    ))
                }
            })
            .collect()
    }

    /// `n` lazily connected channels straight to a participant at `url`, presenting what the
    /// coordinator presents.
    pub(crate) fn participant_channels(
        &self,
        url: &str,
        n: usize,
    ) -> Result<Vec<BenchChannel>, String> {
        (0..n.max(1))
            .map(|_| {
                Ok(BenchChannel::new(
                    self.raw_channel(url)?,
                    self.credentials.participant(),
                ))
            })
            .collect()
    }

    /// A channel to `url` for a readiness probe, presenting the admin key when `admin`, else
    /// the client key: plaintext ones connect at once (an error there is a refused port), TLS
    /// ones on the probe's call.
    pub(crate) async fn probe_channel(
        &self,
        url: &str,
        admin: bool,
    ) -> Result<BenchChannel, String> {
        let raw = if is_https(url) {
            self.raw_channel(url)?
        } else {
            channel(url)?.connect().await.map_err(|e| e.to_string())?
        };
        let bearer = if admin {
            self.credentials.admin()
        } else {
            self.credentials.client()
        };
        Ok(BenchChannel::new(raw, bearer))
    }

    /// A ResourceAdmin client for `url`, presenting the admin key.
    pub fn admin_client(&self, url: &str) -> Result<ResourceAdminClient<BenchChannel>, String> {
        Ok(ResourceAdminClient::new(BenchChannel::new(
            self.raw_channel(url)?,
            self.credentials.admin(),
        )))
    }
}

/// One TLS handshake on loopback between `server` and `client`, as every in-process hop will
/// do it: a certificate that does not name 127.0.0.1, is not signed by `--tls-ca` or (with
/// `--tls-client-auth`) is not usable by a client fails the run at once, rather than every
/// scenario's start-up after its readiness wait.
async fn check_loopback_handshake(
    server: &ServerTls,
    client: &ClientTls,
    client_auth: bool,
) -> Result<(), String> {
    let tcp = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("binding a loopback port: {e}"))?;
    let addr = tcp
        .local_addr()
        .map_err(|e| format!("reading a bound address: {e}"))?;
    let accept = async {
        let (stream, _) = tcp.accept().await?;
        tokio_rustls::TlsAcceptor::from(server.grpc_config())
            .accept(stream)
            .await
            .map(drop)
    };
    let connect = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        tokio_rustls::TlsConnector::from(client.config())
            .connect(name, stream)
            .await
            .map(drop)
    };
    let both = async { tokio::join!(accept, connect) };
    let (accepted, connected) = tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .map_err(|_| "the TLS check on 127.0.0.1 took over 10s".to_owned())?;
    connected.map_err(|e| {
        format!(
            "--tls-cert is refused on 127.0.0.1 (it must name 127.0.0.1 as an IP SAN and be signed by --tls-ca): {e}"
        )
    })?;
    accepted.map_err(|e| {
        let why = if client_auth {
            "--tls-cert is refused as a client certificate (--tls-client-auth: it must be signed by --tls-ca and allow client use)"
        } else {
            "the TLS check on 127.0.0.1 failed"
        };
        format!("{why}: {e}")
    })
}

/// A TLS error worded with the bench's flags: the files are loaded by the same code as the
/// roles', whose messages name the roles' flags.
fn in_bench_terms(e: TlsError) -> String {
    e.to_string()
        .replace("--participant-client-cert", "--tls-cert")
        .replace("--participant-client-key", "--tls-key")
        .replace("--participant-ca", "--tls-ca")
        .replace("--tls-client-ca", "--tls-ca")
}

/// An endpoint for `url` with sane client settings.
pub fn channel(url: &str) -> Result<Endpoint, String> {
    Ok(Endpoint::from_shared(url.to_owned())
        .map_err(|e| format!("bad URL {url:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .tcp_nodelay(true))
}
