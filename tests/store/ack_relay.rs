//! A TCP relay between a store's pool and PostgreSQL that loses one acknowledgement: once a
//! client message carries the marker it is given, the relay lets the server finish the
//! statement (or the transaction) and commit, then cuts the connection instead of passing on
//! the server's `ReadyForQuery` that says the transaction ended (`Z`, status `I`). The client
//! sees its connection fail; what it wrote is committed. A real fault, not a hook: the server
//! runs as it would, only the answer is lost.
//!
//! It reads the server's side as PostgreSQL messages (type byte, 32-bit length), so the pool
//! behind it must not negotiate TLS (`sslmode=disable`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Default)]
pub struct AckDropper {
    /// The bytes that arm the relay, once: the next transaction end after them is cut.
    marker: Arc<Mutex<Option<Vec<u8>>>>,
    cuts: Arc<AtomicUsize>,
}

impl AckDropper {
    /// Starts a relay to the server `options` point at; a pool of `max` connections through it.
    pub async fn start(options: &PgConnectOptions, max: u32) -> (AckDropper, PgPool) {
        let target: SocketAddr = format!("{}:{}", options.get_host(), options.get_port())
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], options.get_port())));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let relay = AckDropper::default();
        let r = relay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                tokio::spawn(r.clone().relay(client, server));
            }
        });
        let relayed = options
            .clone()
            .host("127.0.0.1")
            .port(port)
            .ssl_mode(PgSslMode::Disable);
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .connect_with(relayed)
            .await
            .unwrap();
        (relay, pool)
    }

    /// Cuts the first transaction end after a client message containing `marker`.
    pub fn arm(&self, marker: &str) {
        *self.marker.lock().unwrap() = Some(marker.as_bytes().to_vec());
    }

    /// How many acknowledgements were dropped.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    async fn relay(self, client: TcpStream, server: TcpStream) {
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut server_rx, mut server_tx) = server.into_split();
        let armed = Arc::new(AtomicBool::new(false));
        let upstream = {
            let armed = armed.clone();
            let marker = self.marker.clone();
            async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut tail: Vec<u8> = Vec::new();
                loop {
                    let n = match client_rx.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    {
                        let mut m = marker.lock().unwrap();
                        if let Some(wanted) = m.clone() {
                            tail.extend_from_slice(&buf[..n]);
                            if tail.windows(wanted.len()).any(|w| w == wanted.as_slice()) {
                                armed.store(true, Ordering::SeqCst);
                                *m = None;
                            }
                            let keep = tail.len().saturating_sub(wanted.len());
                            tail.drain(..keep);
                        }
                    }
                    if server_tx.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        };
        let cuts = self.cuts.clone();
        let downstream = async move {
            let mut pending: Vec<u8> = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            // After arming: a CommandComplete was seen (the marked statement ran).
            let mut completed = false;
            loop {
                let n = match server_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                pending.extend_from_slice(&buf[..n]);
                let mut out = Vec::new();
                while pending.len() >= 5 {
                    let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]])
                        as usize;
                    if pending.len() < 1 + len {
                        break;
                    }
                    let msg: Vec<u8> = pending.drain(..1 + len).collect();
                    if armed.load(Ordering::SeqCst) {
                        if msg[0] == b'C' {
                            completed = true;
                        }
                        if completed && msg[0] == b'Z' && msg.get(5) == Some(&b'I') {
                            // Committed; the client never hears it.
                            let _ = client_tx.write_all(&out).await;
                            cuts.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                    out.extend_from_slice(&msg);
                }
                if client_tx.write_all(&out).await.is_err() {
                    return;
                }
            }
        };
        // Whichever side ends first ends the connection (dropping every half closes both).
        tokio::select! {
            _ = upstream => {}
            _ = downstream => {}
        }
    }
}
