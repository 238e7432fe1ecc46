//! The TLS flags through the real binary: an `https://` participant that speaks plaintext, an
//! `http://` participant refused by a TLS coordinator at start, the all-in-one on TLS,
//! `stock-redis` on `rediss://` against a TLS-only Redis, and `holdfast bench` over mTLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use tokio::net::TcpStream;
use tonic::transport::Channel;

use super::pki::{Ca, Files};
use super::{free_port, health, plaintext_channel, tls_channel};
use crate::common::{hold, reason, reserve_request, state_of};
use crate::process::TempDatabase;
use crate::process::bench::run_bench_document;

/// A `holdfast` process started by a test; its output goes to a log file. Killed when dropped.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn start(args: &[&str], env: &[(&str, &str)], log: PathBuf) -> Process {
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        for (k, _) in std::env::vars() {
            if k.starts_with("HOLDFAST_")
                || k == "DATABASE_URL"
                || k.starts_with("OTEL_")
                || k.starts_with("SSL_CERT_")
            {
                cmd.env_remove(k);
            }
        }
        // A key of the process is enough here: no second replica, no restart.
        let child = cmd
            .args(args)
            .env("RUST_LOG", "info")
            .env("HOLDFAST_EPHEMERAL_TOKEN_SECRET", "true")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn the holdfast binary");
        Process { child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit by itself.
    async fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "holdfast still runs after {within:?}; output:\n{}",
            self.output()
        );
    }

    /// Waits until a health check through `channel` is answered.
    async fn wait_serving(&mut self, channel: impl Fn() -> Channel) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("holdfast exited ({status}); output:\n{}", self.output());
            }
            match health(channel()).await {
                Ok(()) => return,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "not serving after 60 s ({e}); output:\n{}",
                    self.output()
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn an_https_participant_that_speaks_plaintext_fails_the_reserve_and_never_holds() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let log = crate::common::CallLog::default();
    let fake = crate::common::spawn_fake("seats", log.clone()).await;
    let https = fake.url.replace("http://", "https://");
    let db = TempDatabase::create().await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port().await));
    let ca_path = files.ca("ca", &ca);
    let mut process = Process::start(
        &[
            "coordinator",
            "--listen",
            &addr.to_string(),
            "--metrics-listen",
            "off",
            "--http-listen",
            "off",
            "--database-url",
            &db.url,
            "--participant",
            &format!("seats={https}"),
            "--participant-ca",
            ca_path.to_str().unwrap(),
        ],
        &[],
        files.dir.join("coordinator.log"),
    );
    process.wait_serving(|| plaintext_channel(addr)).await;

    let mut client = CoordinatorClient::new(plaintext_channel(addr));
    let err = client
        .reserve(reserve_request("https-plain-1", vec![hold("seats", "A1")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE", "{err:?}");
    assert!(
        log.calls().is_empty(),
        "a call reached the participant in plaintext: {:?}",
        log.calls()
    );
    let id = crate::common::error_metadata(&err)["reservation_id"].clone();
    let reservation = client
        .get_reservation(proto::GetReservationRequest { reservation_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(state_of(&reservation), State::Held);
    let output = process.output();
    assert!(
        output.contains("try failed")
            && output.contains("TLS handshake with")
            && output.contains("failed"),
        "no log line says the TLS handshake failed:\n{output}"
    );
}

#[tokio::test]
async fn a_tls_coordinator_refuses_an_http_participant_at_start_unless_allowed() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let (cert, key) = files.leaf("coordinator", &ca.issue("coordinator"));
    let database = format!("sqlite://{}", files.dir.join("coordinator.db").display());
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port().await));
    let listen = addr.to_string();
    let mut args = vec![
        "coordinator",
        "--listen",
        &listen,
        "--metrics-listen",
        "off",
        "--http-listen",
        "off",
        "--database-url",
        &database,
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--participant",
        "seats=http://127.0.0.1:1",
    ];
    let mut refused = Process::start(&args, &[], files.dir.join("refused.log"));
    assert_ne!(refused.exit_code(Duration::from_secs(60)).await, Some(0));
    let output = refused.output();
    assert!(
        output.contains("--allow-plaintext-participants")
            && output.contains("seats=http://127.0.0.1:1"),
        "the refusal does not name the flag and the participant:\n{output}"
    );

    args.push("--allow-plaintext-participants");
    let mut allowed = Process::start(&args, &[], files.dir.join("allowed.log"));
    allowed.wait_serving(|| tls_channel(addr, &ca, None)).await;
}

#[tokio::test]
async fn the_all_in_one_serves_tls_on_every_port_and_reaches_its_own_participants() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let (cert, key) = files.leaf("all-in-one", &ca.issue("all-in-one"));
    let listen = crate::process::listen_addr(9);
    let database = format!("sqlite://{}", files.dir.join("data/holdfast.db").display());
    let http = SocketAddr::new(listen.ip(), 8080);
    let mut process = Process::start(
        &[
            "--listen",
            &listen.to_string(),
            "--metrics-listen",
            "off",
            "--http-listen",
            &http.to_string(),
            "--database-url",
            &database,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
        files.dir.join("all-in-one.log"),
    );
    process
        .wait_serving(|| tls_channel(listen, &ca, None))
        .await;
    let noop = SocketAddr::new(listen.ip(), 50065);
    assert!(
        health(plaintext_channel(noop)).await.is_err(),
        "a participant port answered plaintext"
    );

    let mut client = CoordinatorClient::new(tls_channel(listen, &ca, None));
    let held = client
        .reserve(reserve_request(
            "all-in-one-tls",
            vec![hold("noop", "anything")],
        ))
        .await
        .expect("reserve through the all-in-one's TLS participants")
        .into_inner();
    assert_eq!(state_of(&held), State::Held);
    let confirmed = client
        .confirm(proto::ConfirmRequest {
            reservation_id: held.id,
            hold_token: held.hold_token,
            payment: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);

    // The HTTP listener serves TLS only, with the same certificate: the JSON API answers the
    // reservation over HTTPS; a plaintext request gets no HTTP answer.
    let answer = https_get(http, &ca, &format!("/v1/reservations/{}", confirmed.id)).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"state\":\"CONFIRMED\""),
        "{answer}"
    );
    let served = super::tls_connect(http, &ca, b"http/1.1").await.unwrap();
    let grpc = super::tls_connect(listen, &ca, b"h2").await.unwrap();
    assert_eq!(
        served.get_ref().1.peer_certificates().unwrap_or_default()[0].to_vec(),
        grpc.get_ref().1.peer_certificates().unwrap_or_default()[0].to_vec(),
        "the HTTP port serves another certificate than the gRPC port"
    );
    let plaintext = plain_get(http, "/healthz").await;
    assert!(
        !plaintext.starts_with("HTTP/1.1 200"),
        "plaintext answered: {plaintext}"
    );
    // Certificate reloads refused are scraped from the start, at 0.
    let metrics = https_get(http, &ca, "/metrics").await;
    assert!(
        metrics.contains("\nholdfast_tls_reload_failures_total 0"),
        "{metrics}"
    );
}

/// `GET path` over TLS (verified against `ca`), the whole answer as text.
async fn https_get(addr: SocketAddr, ca: &Ca, path: &str) -> String {
    let stream = super::tls_connect(addr, ca, b"http/1.1").await.unwrap();
    get_on(stream, path).await
}

/// `GET path` in plaintext, whatever comes back.
async fn plain_get(addr: SocketAddr, path: &str) -> String {
    get_on(TcpStream::connect(addr).await.unwrap(), path).await
}

/// One HTTP/1.1 request on `stream`, read until the server closes or is quiet for 10 s (a
/// missing TLS close_notify, or a refused handshake, simply ends the answer).
async fn get_on<S>(mut stream: S, path: &str) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await
    {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A TLS-only Redis (`--port 0`) on a free port, stopped when dropped.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl TlsRedis {
    async fn start(files: &Files, ca: &Ca) -> TlsRedis {
        let (cert, key) = files.leaf("redis", &ca.issue("redis"));
        let ca_path = files.ca("redis-ca", ca);
        let port = free_port().await;
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--tls-port")
            .arg(port.to_string())
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(&ca_path)
            .args(["--tls-auth-clients", "no", "--dir"])
            .arg(&files.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (with TLS support) must be installed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "the TLS Redis did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        TlsRedis { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn stock_redis_holds_over_rediss() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let redis = TlsRedis::start(&files, &ca).await;
    let db = TempDatabase::create().await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port().await));
    let ca_path = files.ca("system-roots", &ca);
    let prefix = format!("hf:tls:{}:", uuid::Uuid::new_v4());
    let mut process = Process::start(
        &[
            "participant",
            "stock-redis",
            "--listen",
            &addr.to_string(),
            "--database-url",
            &db.url,
            "--redis-url",
            &format!("rediss://localhost:{}", redis.port),
            "--redis-prefix",
            &prefix,
        ],
        // rediss:// verifies against the system roots; SSL_CERT_FILE replaces them.
        &[("SSL_CERT_FILE", ca_path.to_str().unwrap())],
        files.dir.join("stock-redis.log"),
    );
    process.wait_serving(|| plaintext_channel(addr)).await;

    ResourceAdminClient::new(plaintext_channel(addr))
        .put_resources(proto::PutResourcesRequest {
            resources: vec![proto::ResourceSpec {
                resource: "sku-1".into(),
                capacity: 2,
            }],
        })
        .await
        .expect("put resources through rediss://");
    let answer = proto::participant_client::ParticipantClient::new(plaintext_channel(addr))
        .r#try(proto::TryRequest {
            reservation_id: uuid::Uuid::new_v4().to_string(),
            branch_id: uuid::Uuid::new_v4().to_string(),
            holder: "alice".into(),
            items: vec![hold("stock-redis", "sku-1")],
            expires_at: Some(prost_types::Timestamp {
                seconds: chrono::Utc::now().timestamp() + 600,
                nanos: 0,
            }),
        })
        .await
        .expect("a Try through rediss://")
        .into_inner();
    assert_eq!(
        answer.outcome,
        i32::from(proto::try_response::Outcome::Held)
    );
}

/// `holdfast bench` with TLS on every hop and client certificates required (`--tls-*` with a
/// certificate made by rcgen), short: every row is clean, and the run says it was over TLS
/// (stderr and the JSON document), so its numbers are told apart from a plaintext run's.
#[test]
fn the_bench_runs_with_mutual_tls_on_every_hop() {
    let (files, ca) = (Files::new(), Ca::new("holdfast bench CA"));
    let (cert, key) = files.leaf("bench", &ca.issue("bench"));
    let ca_path = files.ca("ca", &ca);
    let (doc, output) = run_bench_document(&[
        "latency",
        "throughput",
        "holds",
        "--duration",
        "1s",
        "--clients",
        "4",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-ca",
        ca_path.to_str().unwrap(),
        "--tls-client-auth",
    ]);
    assert!(
        output.contains("bench: transport TLS (every gRPC hop, client certificates required)"),
        "{output}"
    );
    assert_eq!(doc["tls"], true, "{output}");
    assert_eq!(doc["tls_client_auth"], true, "{output}");
    let rows = doc["results"].as_array().expect("results");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["scenario"].as_str()).collect();
    assert_eq!(
        names,
        [
            "latency-noop",
            "latency-real",
            "throughput-noop",
            "throughput-real",
            "holds-stock"
        ],
        "{output}"
    );
    for r in rows {
        assert!(r["failure"].is_null(), "{r}");
        assert_eq!(r["error_count"], 0, "{r}");
        assert!(r["ok"].as_u64().is_some_and(|ok| ok > 0), "{r}");
    }
}

#[tokio::test]
async fn a_coordinator_with_an_expired_certificate_refuses_to_start_naming_the_flag() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let key = ca.issue("any").key;
    let now = chrono::Utc::now().timestamp();
    let expired = ca.issue_valid("coordinator", &key, now - 30 * 86_400, now - 86_400);
    let (cert, key) = files.leaf("coordinator", &expired);
    let database = format!("sqlite://{}", files.dir.join("coordinator.db").display());
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port().await)).to_string();
    let args = [
        "coordinator",
        "--listen",
        &listen,
        "--metrics-listen",
        "off",
        "--http-listen",
        "off",
        "--database-url",
        &database,
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let mut refused = Process::start(&args, &[], files.dir.join("expired.log"));
    assert_ne!(refused.exit_code(Duration::from_secs(60)).await, Some(0));
    let output = refused.output();
    assert!(
        output.contains(&format!("--tls-cert {}", cert.display())) && output.contains("expired"),
        "the refusal does not name the flag and say why:\n{output}"
    );
}

/// `stock-redis` on the TLS Redis of `ca`, with `--redis-ca redis_ca` and `env`.
fn stock_redis_with_ca(
    files: &Files,
    redis: &TlsRedis,
    db: &TempDatabase,
    addr: SocketAddr,
    redis_ca: &std::path::Path,
    env: &[(&str, &str)],
    log: &str,
) -> Process {
    let prefix = format!("hf:tls:{}:", uuid::Uuid::new_v4());
    Process::start(
        &[
            "participant",
            "stock-redis",
            "--listen",
            &addr.to_string(),
            "--database-url",
            &db.url,
            "--redis-url",
            &format!("rediss://localhost:{}", redis.port),
            "--redis-prefix",
            &prefix,
            "--redis-ca",
            redis_ca.to_str().unwrap(),
        ],
        env,
        files.dir.join(log),
    )
}

#[tokio::test]
async fn redis_ca_is_trusted_alone_not_with_the_system_roots() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let redis = TlsRedis::start(&files, &ca).await;
    let db = TempDatabase::create().await;
    let redis_ca = files.ca("redis-ca", &ca);
    let unrelated = files.ca("unrelated-ca", &Ca::new("not Redis's CA"));

    // The system store vouches for Redis, --redis-ca does not: refused, naming the flag.
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port().await));
    let system = [("SSL_CERT_FILE", redis_ca.to_str().unwrap())];
    let mut refused = stock_redis_with_ca(&files, &redis, &db, addr, &unrelated, &system, "b.log");
    assert_ne!(refused.exit_code(Duration::from_secs(60)).await, Some(0));
    let output = refused.output();
    assert!(
        output.contains(&format!("--redis-ca {}", unrelated.display())),
        "the refusal does not name the flag:\n{output}"
    );

    // --redis-ca names Redis's CA (and the system store does not hold it): serves.
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port().await));
    let mut process = stock_redis_with_ca(&files, &redis, &db, addr, &redis_ca, &[], "a.log");
    process.wait_serving(|| plaintext_channel(addr)).await;
    ResourceAdminClient::new(plaintext_channel(addr))
        .put_resources(proto::PutResourcesRequest {
            resources: vec![proto::ResourceSpec {
                resource: "sku-1".into(),
                capacity: 2,
            }],
        })
        .await
        .expect("put resources through rediss:// verified by --redis-ca");
}
