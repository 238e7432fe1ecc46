//! What an idle or slow peer can hold (SPEC 7.4), against a real coordinator with its HTTP
//! listener: hundreds of half-open connections (half an HTTP/1.1 head, half an HTTP/2
//! preface, nothing at all; plaintext and TLS) do not stop a fresh client's Reserve from being
//! answered and are closed by the server once `--header-timeout` has passed; a connection with
//! a complete head and no request open is closed after `--idle-timeout` while a Watch stream
//! older than that keeps streaming; beyond `--max-connections` a new connection is closed at
//! once while the open ones keep working.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use holdfast::app::{self, CoordinatorSettings};
use holdfast::conn::ConnectionLimits;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::store::PgStore;
use holdfast::tls::{Listener, ServerTls};
use sqlx::PgPool;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Channel, Endpoint};

use crate::common::{Decide, hold, reserve_request, settings, spawn_fakes, state_of};
use crate::tls::pki::{Ca, Files};
use crate::tls::{tls_channel, tls_connect};

/// Half-open connections of each kind a test holds.
const FLOOD: usize = 100;

/// A coordinator's gRPC and HTTP addresses.
struct Ports {
    grpc: SocketAddr,
    http: SocketAddr,
}

/// Starts a coordinator whose gRPC and HTTP listeners have `limits` (TLS with `tls`).
async fn spawn(
    pool: PgPool,
    settings: CoordinatorSettings,
    limits: ConnectionLimits,
    tls: Option<ServerTls>,
) -> Ports {
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ports = Ports {
        grpc: grpc.local_addr().unwrap(),
        http: http.local_addr().unwrap(),
    };
    let store = PgStore::from_pool(pool);
    store.migrate().await.unwrap();
    let grpc = Listener::new(grpc, tls.clone()).with_limits(limits);
    let http = Listener::new(http, tls).with_limits(limits);
    tokio::spawn(async move {
        app::serve_coordinator_with_http(
            settings,
            store,
            grpc,
            Some(http.into()),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    ports
}

fn limits(header_timeout: Duration, idle_timeout: Duration, max: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_timeout,
        idle_timeout,
        max_connections: max,
    }
}

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// Connects to `addr` and sends `first` (maybe nothing).
async fn half_open(addr: SocketAddr, first: &[u8]) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(first).await.unwrap();
    tcp
}

/// How long after `since` the server closed `stream` (its reads reach end of stream or a
/// reset; what it wrote before, such as HTTP/2 SETTINGS, is skipped); fails after `within`.
async fn closed_by_server<S: AsyncRead + Unpin>(
    mut stream: S,
    since: Instant,
    within: Duration,
) -> Duration {
    let mut buf = [0u8; 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read_to_end)
        .await
        .unwrap_or_else(|_| panic!("the connection was still open {within:?} after it was made"))
}

/// The count of `holdfast_connections_dropped_total{reason}` in this process's metrics.
fn dropped(reason: &str) -> u64 {
    let text = holdfast::telemetry::metrics_handle().render();
    let wanted = format!(
        "{}{{reason=\"{reason}\"}} ",
        holdfast::conn::CONNECTIONS_DROPPED
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// A Reserve of one seat on `channel`, answered HELD.
async fn reserve_held(channel: Channel, id: &str) -> holdfast::proto::Reservation {
    let mut client = CoordinatorClient::new(channel);
    let mut request = reserve_request(id, vec![hold("seats", id)]);
    request.holder = format!("holder-{id}");
    let r = client.reserve(request).await.unwrap().into_inner();
    assert_eq!(state_of(&r), State::Held);
    r
}

/// Awaits every connection closing, each no sooner than `not_before` after it was made and
/// within `within`; when the first closed.
async fn all_closed<S: AsyncRead + Unpin>(
    streams: Vec<(S, Instant)>,
    not_before: Duration,
    within: Duration,
) -> Instant {
    let waits = streams.into_iter().map(|(s, at)| async move {
        let after = closed_by_server(s, at, within).await;
        assert!(
            after >= not_before,
            "closed {after:?} after it was made, before {not_before:?}"
        );
        at + after
    });
    let closed = futures_util::future::join_all(waits).await;
    closed.into_iter().min().expect("connections")
}

#[sqlx::test(migrations = false)]
async fn half_open_connections_do_not_stop_grpc_and_are_closed_after_the_header_timeout(
    pool: PgPool,
) {
    let fakes = spawn_fakes(&["seats"]).await;
    let header_timeout = Duration::from_secs(2);
    let ports = spawn(
        pool,
        settings(&[("seats", &fakes.get("seats").url)]),
        limits(header_timeout, Duration::from_secs(300), 10_000),
        None,
    )
    .await;
    let before = dropped("header_timeout");
    // Half an HTTP/1.1 head on the HTTP port; half a preface, or nothing, on the gRPC port.
    let mut open = Vec::new();
    for i in 0..FLOOD {
        let at = Instant::now();
        open.push((
            half_open(ports.http, b"GET /v1/reservations HTTP/1.1\r\nHost: x\r\n").await,
            at,
        ));
        let first: &[u8] = if i % 2 == 0 {
            b""
        } else {
            b"PRI * HTTP/2.0\r\n"
        };
        open.push((half_open(ports.grpc, first).await, Instant::now()));
        open.push((half_open(ports.grpc, b"").await, Instant::now()));
    }
    // With all of them open, a fresh client is answered.
    reserve_held(channel(ports.grpc), "fresh").await;
    let answered = Instant::now();
    // Each is closed by the server once the header timeout has passed since it was made (the
    // first after the Reserve was answered), and counted.
    let flood = open.len() as u64;
    let not_before = header_timeout - Duration::from_millis(50);
    let first = all_closed(open, not_before, Duration::from_secs(6)).await;
    assert!(
        first > answered,
        "a half-open connection closed before the Reserve was answered"
    );
    assert!(dropped("header_timeout") - before >= flood);
}

#[sqlx::test(migrations = false)]
async fn silent_tls_connections_are_closed_after_the_header_timeout(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let tls = files.server_tls("coordinator", &ca.issue("coordinator"), None);
    let header_timeout = Duration::from_secs(2);
    let mut settings = settings(&[("seats", &fakes.get("seats").url)]);
    settings.participant_transport.allow_plaintext = true;
    let ports = spawn(
        pool,
        settings,
        limits(header_timeout, Duration::from_secs(300), 10_000),
        Some(tls),
    )
    .await;
    // No handshake at all on either port; a handshake and then nothing (no HTTP/2 preface, no
    // HTTP/1.1 head) on each.
    let mut silent = Vec::new();
    let mut handshaken = Vec::new();
    for _ in 0..FLOOD / 2 {
        for addr in [ports.grpc, ports.http] {
            silent.push((half_open(addr, b"").await, Instant::now()));
        }
        let at = Instant::now();
        handshaken.push((tls_connect(ports.grpc, &ca, b"h2").await.unwrap(), at));
        let at = Instant::now();
        handshaken.push((tls_connect(ports.http, &ca, b"http/1.1").await.unwrap(), at));
    }
    reserve_held(tls_channel(ports.grpc, &ca, None), "fresh").await;
    let answered = Instant::now();
    let not_before = header_timeout - Duration::from_millis(50);
    let (a, b) = tokio::join!(
        all_closed(silent, not_before, Duration::from_secs(6)),
        all_closed(handshaken, not_before, Duration::from_secs(6)),
    );
    assert!(
        a.min(b) > answered,
        "a half-open connection closed before the Reserve was answered"
    );
}

#[sqlx::test(migrations = false)]
async fn an_idle_connection_is_closed_but_a_watch_stream_outlives_the_idle_timeout(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let idle_timeout = Duration::from_secs(1);
    let ports = spawn(
        pool,
        settings(&[("seats", &fakes.get("seats").url)]),
        // A head that is late would be closed only after 5 s: a close at 1 s is the idle rule.
        limits(Duration::from_secs(5), idle_timeout, 10_000),
        None,
    )
    .await;
    let r = reserve_held(channel(ports.grpc), "watched").await;
    let mut watcher = CoordinatorClient::new(channel(ports.grpc));
    let mut stream = watcher
        .watch_reservation(holdfast::proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state_of(&stream.message().await.unwrap().unwrap()),
        State::Held
    );

    // A complete HTTP/1.1 head answered, then nothing: idle, closed after the idle timeout.
    let at = Instant::now();
    let mut http = half_open(
        ports.http,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    let mut answer = [0u8; 12];
    http.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    let after = closed_by_server(http, at, Duration::from_secs(4)).await;
    assert!(
        after >= idle_timeout - Duration::from_millis(50),
        "closed after {after:?}"
    );

    // The Watch stream, open longer than the idle timeout by now, still sees the Confirm.
    let mut client = CoordinatorClient::new(channel(ports.grpc));
    client.confirm(Decide::on(&r).confirm()).await.unwrap();
    let confirmed = async {
        while let Some(next) = stream.message().await.unwrap() {
            if state_of(&next) == State::Confirmed {
                return true;
            }
        }
        false
    };
    let confirmed = tokio::time::timeout(Duration::from_secs(5), confirmed).await;
    assert_eq!(
        confirmed,
        Ok(true),
        "the stream ended or stalled before CONFIRMED"
    );
}

#[sqlx::test(migrations = false)]
async fn beyond_max_connections_a_new_connection_is_closed_at_once(pool: PgPool) {
    const MAX: usize = 3;
    let fakes = spawn_fakes(&["seats"]).await;
    let ports = spawn(
        pool,
        settings(&[("seats", &fakes.get("seats").url)]),
        limits(Duration::from_secs(10), Duration::from_secs(300), MAX),
        None,
    )
    .await;
    // MAX connections, each answered (so each holds its place).
    let mut clients = Vec::new();
    for i in 0..MAX {
        let channel = Endpoint::from_shared(format!("http://{}", ports.grpc))
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        reserve_held(channel.clone(), &format!("r{i}")).await;
        clients.push(channel);
    }
    // One more is closed at once: well before the header timeout could close it.
    let at = Instant::now();
    let before = dropped("max_connections");
    let refused = half_open(ports.grpc, b"").await;
    let after = closed_by_server(refused, at, Duration::from_secs(2)).await;
    assert!(after < Duration::from_secs(2));
    assert!(
        dropped("max_connections") > before,
        "the refusal is counted"
    );
    // The open ones keep working.
    reserve_held(clients[0].clone(), "still").await;
    // One closed gives its place to the next.
    clients.pop();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let next = Endpoint::from_shared(format!("http://{}", ports.grpc))
            .unwrap()
            .timeout(Duration::from_secs(2))
            .connect()
            .await;
        let answered = match next {
            Ok(channel) => {
                let mut client = CoordinatorClient::new(channel);
                let mut request = reserve_request("next", vec![hold("seats", "next")]);
                request.holder = "holder-next".into();
                client.reserve(request).await.is_ok()
            }
            Err(_) => false,
        };
        if answered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's place never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The HTTP listener has a cap of its own: MAX held there too, one more closed at once.
    let mut held = Vec::new();
    for _ in 0..MAX {
        let mut http = half_open(
            ports.http,
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
        )
        .await;
        let mut answer = [0u8; 12];
        http.read_exact(&mut answer).await.unwrap();
        held.push(http);
    }
    let at = Instant::now();
    let refused = half_open(ports.http, b"").await;
    assert!(closed_by_server(refused, at, Duration::from_secs(2)).await < Duration::from_secs(2));
}
