//! A TCP relay standing for the network between the coordinator and a participant, so a test
//! can cut it and restore it.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A TCP relay in front of a server, standing for the network: `cut` drops every connection
/// and refuses new ones (an outage, as the client sees it); `restore` accepts again.
pub struct Relay {
    pub url: String,
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Mutex<Option<tokio::task::JoinSet<()>>>,
    /// While true, the server's bytes wait in the relay (requests still pass): a call lands,
    /// its answer does not arrive. Nothing is dropped, so the connection survives.
    hold_replies: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    pub async fn start(target_url: &str) -> Relay {
        let target: SocketAddr = target_url.trim_start_matches("http://").parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
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

    fn accept(&self, listener: TcpListener) {
        let target = self.target;
        let hold = self.hold_replies.clone();
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let hold = hold.subscribe();
                conns.spawn(async move {
                    if let Ok(outbound) = tokio::net::TcpStream::connect(target).await {
                        let (mut client_rx, mut client_tx) = inbound.into_split();
                        let (mut server_rx, server_tx) = outbound.into_split();
                        let requests = async move {
                            let mut server_tx = server_tx;
                            let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
                        };
                        let replies = async move {
                            let mut hold = hold;
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
                });
            }
        });
        *self.tasks.lock().unwrap() = Some(set);
    }

    /// Holds the server's answers in the relay (`true`) or lets them through again, those
    /// held first (`false`).
    pub fn hold_replies(&self, hold: bool) {
        self.hold_replies.send_replace(hold);
    }

    /// Drops every connection and stops listening.
    pub async fn cut(&self) {
        let tasks = self.tasks.lock().unwrap().take();
        if let Some(mut set) = tasks {
            set.shutdown().await;
        }
    }

    /// Listens again on the same address.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.accept(listener);
    }
}
