//! Patroni as the test drives it: each node's configuration, and its REST API (members,
//! switchover) over plain HTTP/1.0 on loopback.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{Node, PG_BIN, port_of};

/// A node's Patroni configuration. Timing is tight for a test (leader key ttl 10 s, a loop a
/// second, a crashed primary failed over at once: `primary_start_timeout: 0`); synchronous
/// replication with one synchronous standby, so a commit acknowledged to the client is on
/// two nodes; `fsync` off, since the faults kill processes, not the machine (the page cache
/// survives them). PostgreSQL advertises its relay's port (`connect_address`), so replication
/// and HAProxy go through it; Patroni reaches etcd through the node's other relay only
/// (`use_proxies`: not the members etcd advertises).
pub fn config(scope: &str, node: &Node, dir: &Path, data: &Path) -> String {
    format!(
        "scope: {scope}
namespace: /holdfast-ha/
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{dcs}
  use_proxies: true
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_node_count: 1
    primary_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 300
        shared_buffers: 32MB
        wal_log_hints: 'on'
        fsync: 'off'
        synchronous_commit: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
  initdb:
  - encoding: UTF8
  - auth: trust
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{relay}
  data_dir: {data}
  bin_dir: {PG_BIN}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
    rewind:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: '{dir}'
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
",
        name = node.name,
        rest = node.rest_port,
        dcs = port_of(&node.dcs_relay),
        pg = node.pg_port,
        relay = port_of(&node.pg_relay),
        data = data.display(),
        dir = dir.display(),
    )
}

/// One HTTP/1.0 exchange on loopback: (status, body), or `None` when nothing answers within
/// 5 s.
async fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    http_within(port, method, path, body, Duration::from_secs(5)).await
}

async fn http_within(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    within: Duration,
) -> Option<(u16, String)> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text.split(' ').nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Some((status, body))
    };
    tokio::time::timeout(within, exchange).await.ok().flatten()
}

/// Waits until `GET path` on `port` answers 200; panics after `within`.
pub async fn wait_http(port: u16, path: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !matches!(http(port, "GET", path, "").await, Some((200, _))) {
        assert!(
            Instant::now() < deadline,
            "nothing answers GET {path} on {port}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A member of the cluster as `GET /cluster` lists it.
#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    /// `leader`, `sync_standby`, `replica`.
    pub role: String,
    /// `running`, `streaming`, `stopped`, `starting`, ...
    pub state: String,
}

/// The members, as the Patroni at `rest_port` lists them.
pub async fn members(rest_port: u16) -> Option<Vec<Member>> {
    let (status, body) = http(rest_port, "GET", "/cluster", "").await?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let text = |m: &serde_json::Value, k: &str| m[k].as_str().unwrap_or_default().to_owned();
    Some(
        v["members"]
            .as_array()?
            .iter()
            .map(|m| Member {
                name: text(m, "name"),
                role: text(m, "role"),
                state: text(m, "state"),
            })
            .collect(),
    )
}

/// A planned switchover away from `leader` (Patroni picks the synchronous standby), asked of
/// the leader's REST API; returns once Patroni says it is done, or what it answered.
pub async fn switchover(rest_port: u16, leader: &str) -> Result<(), String> {
    let body = format!("{{\"leader\": \"{leader}\"}}");
    match http_within(
        rest_port,
        "POST",
        "/switchover",
        &body,
        Duration::from_secs(60),
    )
    .await
    {
        Some((200, _)) => Ok(()),
        other => Err(format!("POST /switchover: {other:?}")),
    }
}
