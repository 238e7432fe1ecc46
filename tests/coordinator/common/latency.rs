//! A database some distance away: a TCP relay between a pool and PostgreSQL that passes every
//! byte unchanged, the server's answers each `delay` late (in order, without limiting
//! throughput), so each statement's round trip costs at least `delay` - a real network's
//! latency, not a hook. Time between two statements of one transaction grows with it, as it
//! does for a coordinator whose database is in another zone.

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A pool of `max` connections to the database `options` names, through a relay that delays
/// the server's answers by `delay`.
pub async fn pool_at_distance(options: &PgConnectOptions, max: u32, delay: Duration) -> PgPool {
    let target: SocketAddr = format!("{}:{}", options.get_host(), options.get_port())
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], options.get_port())));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            tokio::spawn(relay(client, server, delay));
        }
    });
    let relayed = options
        .clone()
        .host("127.0.0.1")
        .port(port)
        .ssl_mode(PgSslMode::Disable);
    PgPoolOptions::new()
        .max_connections(max)
        .connect_with(relayed)
        .await
        .unwrap()
}

/// Client to server as it comes; server to client each chunk `delay` after it arrived.
async fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
        let _ = server_tx.shutdown().await;
    });
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = server_rx.read(&mut buf).await {
            if chunks
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    });
    while let Some((at, chunk)) = due.recv().await {
        tokio::time::sleep_until(at).await;
        if client_tx.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = client_tx.shutdown().await;
    reader.abort();
    upstream.abort();
}
