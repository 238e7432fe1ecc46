//! The relay behind verified PostgreSQL TLS ([`super::pg_tls`]): a Unix socket in a private
//! directory (mode 0700, removed when the relay ends with its runtime) that sqlx connects to in
//! plaintext. For each connection the relay dials the server, asks for TLS (PostgreSQL's
//! `SSLRequest`), verifies the server with holdfast's rules and then copies bytes both ways.
//! A server that is refused is answered to sqlx as PostgreSQL answers a failed start-up (an
//! `ErrorResponse`), so the pool's error names the setting that refused it; a server that
//! cannot be reached is answered "cannot connect now", which sqlx retries as it retries a
//! refused TCP connection.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio_rustls::client::TlsStream;

use crate::tls::DatabaseTrust;

/// PostgreSQL's `SSLRequest`: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
/// How long dialling, asking for TLS and the handshake may take together.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long sqlx gets to send its start-up message when the relay has a refusal to answer.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest start-up message read before a refusal (PostgreSQL's own limit is 10 000).
const MAX_STARTUP: usize = 10_000;
/// SQLSTATE `connection_failure`: the server was reached and refused (not retried).
const CONNECTION_FAILURE: &str = "08006";
/// SQLSTATE `cannot_connect_now`: the server could not be reached (sqlx retries it).
const CANNOT_CONNECT_NOW: &str = "57P03";

/// Where a relay dials, and how it verifies what answers.
struct Upstream {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    trust: DatabaseTrust,
}

/// Why a connection was not relayed, as told to sqlx.
struct Refusal {
    code: &'static str,
    message: String,
}

/// Starts a relay to `host:port` on the current Tokio runtime; returns the directory of its
/// socket (`.s.PGSQL.<port>`, for [`sqlx::postgres::PgConnectOptions::socket`]).
pub(super) fn start(trust: DatabaseTrust, host: &str, port: u16) -> Result<PathBuf, sqlx::Error> {
    let config = |problem: String| sqlx::Error::Configuration(problem.into());
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        config(format!(
            "{}: needs a Tokio runtime to verify the server",
            trust.mode
        ))
    })?;
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let server_name = ServerName::try_from(bare.clone()).map_err(|_| {
        config(format!(
            "host {host:?} is not a valid DNS name or IP address"
        ))
    })?;
    let dir = private_dir().map_err(sqlx::Error::Io)?;
    let _entered = runtime.enter();
    let listener = std::os::unix::net::UnixListener::bind(dir.join(format!(".s.PGSQL.{port}")))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(UnixListener::from_std)
        .map_err(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            sqlx::Error::Io(e)
        })?;
    let upstream = Arc::new(Upstream {
        host: bare,
        port,
        server_name,
        trust,
    });
    runtime.spawn(relay(listener, upstream, RemovedOnDrop(dir.clone())));
    Ok(dir)
}

/// A new directory only this user can enter.
fn private_dir() -> std::io::Result<PathBuf> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| std::io::Error::other(e.to_string()))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("holdfast-pg-{}-{suffix}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Removes the relay's directory when the relay ends.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn relay(listener: UnixListener, upstream: Arc<Upstream>, _dir: RemovedOnDrop) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(serve(client, upstream.clone()));
            }
            Err(e) => {
                // Out of descriptors, typically: wait rather than spin.
                tracing::warn!(error = %e, "PostgreSQL TLS relay cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve(mut client: UnixStream, upstream: Arc<Upstream>) {
    let target = format!("{}:{}", upstream.host, upstream.port);
    let opened = tokio::time::timeout(OPEN_TIMEOUT, open(&upstream, &target))
        .await
        .unwrap_or_else(|_| {
            Err(Refusal {
                code: CANNOT_CONNECT_NOW,
                message: format!("{target} did not complete TLS within {OPEN_TIMEOUT:?}"),
            })
        });
    match opened {
        Ok(mut server) => {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        Err(refusal) => {
            if refusal.code == CONNECTION_FAILURE {
                tracing::error!(error = %refusal.message, "PostgreSQL server refused");
            }
            refuse(client, &refusal).await;
        }
    }
}

/// TCP to the server, `SSLRequest`, and a verified handshake.
async fn open(upstream: &Upstream, target: &str) -> Result<TlsStream<TcpStream>, Refusal> {
    let failure = |message: String| Refusal {
        code: CONNECTION_FAILURE,
        message,
    };
    let mut tcp = TcpStream::connect((upstream.host.as_str(), upstream.port))
        .await
        .map_err(|e| Refusal {
            code: CANNOT_CONNECT_NOW,
            message: format!("cannot reach {target}: {e}"),
        })?;
    let _ = tcp.set_nodelay(true);
    let mut answer = [0u8; 1];
    let asked = match tcp.write_all(&SSL_REQUEST).await {
        Ok(()) => tcp.read_exact(&mut answer).await.map(|_| ()),
        Err(e) => Err(e),
    };
    asked.map_err(|e| failure(format!("{target} closed the connection asked for TLS: {e}")))?;
    if answer[0] != b'S' {
        return Err(failure(format!(
            "{}: {target} does not accept TLS connections",
            upstream.trust.mode
        )));
    }
    let config = upstream
        .trust
        .client_config()
        .map_err(|e| failure(e.to_string()))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(upstream.server_name.clone(), tcp)
        .await
        .map_err(|e| failure(upstream.trust.explain(target, &e)))
}

/// Answers sqlx's start-up message with `refusal`, as PostgreSQL answers a refused start-up.
async fn refuse(mut client: UnixStream, refusal: &Refusal) {
    let startup = async {
        let mut length = [0u8; 4];
        client.read_exact(&mut length).await?;
        let rest = (u32::from_be_bytes(length) as usize).saturating_sub(4);
        let mut body = vec![0u8; rest.min(MAX_STARTUP)];
        client.read_exact(&mut body).await.map(|_| ())
    };
    if !matches!(
        tokio::time::timeout(STARTUP_TIMEOUT, startup).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = client.write_all(&error_response(refusal)).await;
    let _ = client.shutdown().await;
}

/// A PostgreSQL `ErrorResponse` (FATAL) carrying `refusal`.
fn error_response(refusal: &Refusal) -> Vec<u8> {
    let mut body = Vec::new();
    let message = refusal.message.replace('\0', " ");
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', refusal.code),
        (b'M', message.as_str()),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let length = u32::try_from(body.len() + 4).unwrap_or(u32::MAX);
    let mut message = vec![b'E'];
    message.extend_from_slice(&length.to_be_bytes());
    message.extend_from_slice(&body);
    message
}
