//! A TCP relay standing for the network between the coordinator and a participant, so a test
//! can cut it and heal it, or let requests through while the answers wait.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// A TCP relay in front of a server, standing for the network: `cut` drops every connection
/// and refuses new ones (an outage, as the client sees it); `restore` accepts again on the same
/// address. Dropping it stops it.
pub struct Relay {
    /// Where callers connect (`http://127.0.0.1:<port>`).
    pub url: String,
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Mutex<Option<JoinSet<()>>>,
    /// While true, the server's bytes wait in the relay (requests still pass): a call lands,
    /// its answer does not arrive. Nothing is dropped, so the connection survives.
    hold_replies: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    /// A relay on 127.0.0.1:0 in front of `target_url` (`http://host:port`). Panics when the
    /// URL is not an `http://` socket address: a test's own mistake.
    pub async fn start(target_url: &str) -> Relay {
        let target: SocketAddr = match target_url.trim_start_matches("http://").parse() {
            Ok(addr) => addr,
            Err(e) => panic!("a relay needs an http://ip:port target, not {target_url:?}: {e}"),
        };
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let addr = listener.local_addr().expect("a bound socket's address");
        let relay = Relay {
            url: format!("http://{addr}"),
            addr,
            target,
            tasks: Mutex::new(None),
            hold_replies: tokio::sync::watch::Sender::new(false),
        };
        relay.accept(listener);
        relay
    }

    fn tasks(&self) -> MutexGuard<'_, Option<JoinSet<()>>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn accept(&self, listener: TcpListener) {
        let target = self.target;
        let hold = self.hold_replies.clone();
        let mut set = JoinSet::new();
        set.spawn(async move {
            // Dropped with the accept loop: a cut ends every connection at once.
            let mut conns = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let hold = hold.subscribe();
                conns.spawn(async move {
                    if let Ok(outbound) = tokio::net::TcpStream::connect(target).await {
                        relay_connection(inbound, outbound, hold).await;
                    }
                });
            }
        });
        *self.tasks() = Some(set);
    }

    /// Holds the server's answers in the relay (`true`) or lets them through again, those
    /// held first (`false`).
    pub fn hold_replies(&self, hold: bool) {
        self.hold_replies.send_replace(hold);
    }

    /// Drops every connection and stops listening.
    pub async fn cut(&self) {
        let tasks = self.tasks().take();
        if let Some(mut set) = tasks {
            set.shutdown().await;
        }
    }

    /// Listens again on the same address (nothing happens when it still listens).
    pub async fn restore(&self) {
        if self.tasks().is_some() {
            return;
        }
        let listener = TcpListener::bind(self.addr)
            .await
            .unwrap_or_else(|e| panic!("the relay cannot listen on {} again: {e}", self.addr));
        self.accept(listener);
    }
}

/// Copies bytes both ways until either side closes; the server's wait while `hold` is true.
async fn relay_connection(
    inbound: tokio::net::TcpStream,
    outbound: tokio::net::TcpStream,
    mut hold: tokio::sync::watch::Receiver<bool>,
) {
    let (mut client_rx, mut client_tx) = inbound.into_split();
    let (mut server_rx, mut server_tx) = outbound.into_split();
    let requests = async move {
        let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
    };
    let replies = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if hold.wait_for(|held| !*held).await.is_err() {
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(requests, replies);
}
