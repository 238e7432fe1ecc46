//! A TCP relay standing for the network between the coordinator and a participant, so a test
//! can cut it and restore it.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::net::TcpListener;

/// A TCP relay in front of a server, standing for the network: `cut` drops every connection
/// and refuses new ones (an outage, as the client sees it); `restore` accepts again.
pub struct Relay {
    pub url: String,
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Mutex<Option<tokio::task::JoinSet<()>>>,
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
        };
        relay.accept(listener);
        relay
    }

    fn accept(&self, listener: TcpListener) {
        let target = self.target;
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                conns.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        *self.tasks.lock().unwrap() = Some(set);
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
