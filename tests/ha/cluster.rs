//! The HA stack on one machine, started and stopped by the test: etcd (Debian `etcd-server`),
//! three PostgreSQL 15 nodes under Patroni (Debian `patroni`; `synchronous_mode: true`,
//! `synchronous_node_count: 1`), and HAProxy (Debian `haproxy`) whose read-write port goes to
//! whichever node Patroni's REST API calls the primary (`GET /primary`). Ports are chosen free,
//! everything lives in a temporary folder, and [`Cluster`]'s drop stops every process it started
//! and deletes the folder.
//!
//! Each node has two TCP relays of this process in front of it (`relay.rs`): one for its
//! PostgreSQL port (what HAProxy and the standbys' replication dial) and one for its Patroni's
//! link to etcd; cutting both is the node's network cut. PostgreSQL refuses to run as root, so
//! as root Patroni (and the PostgreSQL it starts) runs as the `postgres` user (`setpriv`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::patroni::{self, Member};
use crate::relay::Relay;

/// Where Debian's PostgreSQL 15 server binaries are.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The programs the stack runs, as Debian installs them.
const PROGRAMS: [&str; 4] = [
    "/usr/bin/etcd",
    "/usr/bin/patroni",
    "/usr/sbin/haproxy",
    PG_BIN,
];

/// One PostgreSQL node under Patroni.
pub struct Node {
    pub name: String,
    pub pg_port: u16,
    pub rest_port: u16,
    /// In front of its PostgreSQL port: what HAProxy and replication dial.
    pub pg_relay: Relay,
    /// Between its Patroni and etcd.
    pub dcs_relay: Relay,
    dir: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The pid of this node's postmaster while it runs: the first line of `postmaster.pid`,
    /// if that process's command line names this node's data folder (a stale file's pid may
    /// be another process's by now).
    pub fn running_postmaster(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        let pid: u32 = text.lines().next()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let data = self.data().display().to_string();
        String::from_utf8_lossy(&cmdline)
            .contains(&data)
            .then_some(pid)
    }
}

pub struct Cluster {
    dir: PathBuf,
    pub nodes: Vec<Node>,
    /// HAProxy's read-write port (to the primary).
    pub rw_port: u16,
    etcd: Option<Child>,
    /// HAProxy, while it routes (a mutex: an outage stops and starts it through `&self`).
    haproxy: std::sync::Mutex<Option<Child>>,
}

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("a free port: {e}"))
}

/// The port a relay listens on (its URL's).
pub fn port_of(relay: &Relay) -> u16 {
    relay
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a relay URL with a port: {}", relay.url))
}

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Why the stack cannot run here (a program missing), if it cannot.
pub fn missing() -> Option<String> {
    PROGRAMS.iter().find(|p| !Path::new(p).exists()).map(|p| {
        format!("{p} is not installed (apt-get install etcd-server patroni haproxy postgresql-15)")
    })
}

/// Starts `program args` in the background, its output to `log`, as the `postgres` user when
/// `as_postgres` and this runs as root.
fn spawn(program: &str, args: &[String], log: &Path, as_postgres: bool, home: &Path) -> Child {
    let mut cmd = if as_postgres && root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ]);
        c.arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    cmd.args(args)
        .env("HOME", home)
        .current_dir(home)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {program}: {e}"))
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// SIGTERM, up to `grace` for it to exit, then SIGKILL; reaped either way.
fn stop_child(child: &mut Child, grace: Duration) {
    signal(child.id(), "TERM");
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn etcd_args(dir: &Path, client: u16, peer: u16) -> Vec<String> {
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    [
        "--name=ha".to_owned(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={c}"),
        format!("--advertise-client-urls={c}"),
        format!("--listen-peer-urls={p}"),
        format!("--initial-advertise-peer-urls={p}"),
        format!("--initial-cluster=ha={p}"),
        "--initial-cluster-state=new".to_owned(),
        "--log-level=warn".to_owned(),
    ]
    .to_vec()
}

/// HAProxy's configuration: the read-write port to the node whose Patroni answers
/// `GET /primary` with 200, checked every 250 ms; sessions to a node marked down are shut, so
/// no client keeps a connection to a demoted primary.
fn haproxy_config(rw_port: u16, nodes: &[Node]) -> String {
    let mut text = format!(
        "global\n  maxconn 2000\n\
         defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30m\n  timeout server 30m\n\
         listen primary\n  bind 127.0.0.1:{rw_port}\n  option httpchk GET /primary\n\
         \x20 http-check expect status 200\n\
         \x20 default-server inter 250ms fastinter 250ms fall 2 rise 1 on-marked-down shutdown-sessions\n"
    );
    for n in nodes {
        text.push_str(&format!(
            "  server {} 127.0.0.1:{} maxconn 500 check port {}\n",
            n.name,
            port_of(&n.pg_relay),
            n.rest_port
        ));
    }
    text
}

impl Cluster {
    /// Starts etcd, three Patroni nodes and HAProxy; returns once a primary serves writes
    /// through HAProxy with a synchronous standby.
    pub async fn start() -> Cluster {
        let dir =
            std::env::temp_dir().join(format!("holdfast-ha-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let (etcd_client, etcd_peer) = (free_port(), free_port());
        let etcd = spawn(
            "/usr/bin/etcd",
            &etcd_args(&dir, etcd_client, etcd_peer),
            &dir.join("etcd.log"),
            false,
            &dir,
        );
        let mut cluster = Cluster {
            dir: dir.clone(),
            nodes: Vec::new(),
            rw_port: free_port(),
            etcd: Some(etcd),
            haproxy: std::sync::Mutex::new(None),
        };
        patroni::wait_http(etcd_client, "/health", Duration::from_secs(30)).await;
        let scope = format!("hf{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        for i in 0..3 {
            let node = cluster.node(i, &scope, etcd_client).await;
            cluster.nodes.push(node);
        }
        if root() {
            chown_postgres(&dir);
        }
        for node in &mut cluster.nodes {
            let config = node.dir.join("patroni.yml");
            node.patroni = Some(spawn(
                "/usr/bin/patroni",
                &[config.display().to_string()],
                &node.dir.join("patroni.log"),
                true,
                &node.dir,
            ));
        }
        std::fs::write(
            cluster.haproxy_cfg(),
            haproxy_config(cluster.rw_port, &cluster.nodes),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", cluster.haproxy_cfg().display()));
        cluster.start_routing();
        cluster.healthy(Duration::from_secs(120)).await;
        cluster
    }

    fn haproxy_cfg(&self) -> PathBuf {
        self.dir.join("haproxy.cfg")
    }

    /// Starts HAProxy (again) on the read-write port.
    pub fn start_routing(&self) {
        let child = spawn(
            "/usr/sbin/haproxy",
            &[
                "-db".to_owned(),
                "-f".to_owned(),
                self.haproxy_cfg().display().to_string(),
            ],
            &self.dir.join("haproxy.log"),
            false,
            &self.dir,
        );
        *self.haproxy.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    }

    /// Stops HAProxy: the database unreachable for holdfast, the cluster itself untouched.
    pub fn stop_routing(&self) {
        let child = self
            .haproxy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut h) = child {
            stop_child(&mut h, Duration::from_secs(5));
        }
    }

    async fn node(&self, i: usize, scope: &str, etcd_port: u16) -> Node {
        let name = format!("node{i}");
        let dir = self.dir.join(&name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let (pg_port, rest_port) = (free_port(), free_port());
        let pg_relay = Relay::start(&format!("http://127.0.0.1:{pg_port}")).await;
        let dcs_relay = Relay::start(&format!("http://127.0.0.1:{etcd_port}")).await;
        let node = Node {
            name,
            pg_port,
            rest_port,
            pg_relay,
            dcs_relay,
            dir,
            patroni: None,
        };
        let config = patroni::config(scope, &node, &node.dir, &node.data());
        std::fs::write(node.dir.join("patroni.yml"), config)
            .unwrap_or_else(|e| panic!("writing patroni.yml: {e}"));
        node
    }

    /// The URL of database `name` through HAProxy's read-write port.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.rw_port)
    }

    /// The members as Patroni sees them (asked of each node in turn until one answers).
    pub async fn members(&self) -> Vec<Member> {
        for n in &self.nodes {
            if let Some(m) = patroni::members(n.rest_port).await {
                return m;
            }
        }
        Vec::new()
    }

    /// The node Patroni calls the leader, once there is one.
    pub async fn leader(&self) -> Option<&Node> {
        let members = self.members().await;
        let name = members.iter().find(|m| m.role == "leader")?.name.clone();
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Waits until a leader runs, a synchronous standby streams, every member runs, and a
    /// write through HAProxy commits; panics with the members and logs after `within`.
    pub async fn healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let members = self.members().await;
            let leader = members
                .iter()
                .any(|m| m.role == "leader" && m.state == "running");
            // Patroni 3.0.2 says `running` of a standby; later versions `streaming`.
            let sync = members.iter().any(|m| {
                m.role == "sync_standby" && (m.state == "running" || m.state == "streaming")
            });
            let all = members.len() == self.nodes.len()
                && members
                    .iter()
                    .all(|m| m.state == "running" || m.state == "streaming");
            if leader && sync && all && self.writes().await {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "the HA cluster is not healthy after {within:?}: {members:?}\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether a write commits through HAProxy now.
    async fn writes(&self) -> bool {
        use sqlx::Connection;
        let Ok(Ok(mut conn)) = tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::PgConnection::connect(&self.url("postgres")),
        )
        .await
        else {
            return false;
        };
        let wrote = tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::query("SELECT txid_current()").execute(&mut conn),
        )
        .await;
        let _ = conn.close().await;
        matches!(wrote, Ok(Ok(_)))
    }

    /// After a failure: every log of the stack copied to a folder of its own (printed), the
    /// data deleted with the rest.
    fn keep_logs(&self) {
        let kept = std::env::temp_dir().join(format!(
            "{}-logs",
            self.dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("holdfast-ha")
        ));
        let _ = std::fs::create_dir_all(&kept);
        let mut logs = vec![self.dir.join("etcd.log"), self.dir.join("haproxy.log")];
        logs.extend(self.nodes.iter().map(|n| n.dir.join("patroni.log")));
        for (i, log) in logs.iter().enumerate() {
            let name = log.file_name().and_then(|n| n.to_str()).unwrap_or("log");
            let _ = std::fs::copy(log, kept.join(format!("{i}-{name}")));
        }
        eprintln!("ha: the stack's logs are kept in {}", kept.display());
    }

    /// The tail of every log of the stack, for a failure's report.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut logs = vec![self.dir.join("etcd.log"), self.dir.join("haproxy.log")];
        logs.extend(self.nodes.iter().map(|n| n.dir.join("patroni.log")));
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            out.push_str(&format!("--- {}\n", log.display()));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// The folder and everything in it owned by `postgres` (Patroni runs as that user).
fn chown_postgres(dir: &Path) {
    let out = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("chown: {e}"));
    assert!(
        out.status.success(),
        "chown postgres {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Cluster {
    /// Stops HAProxy, each Patroni (which stops its PostgreSQL), any postmaster left (a
    /// Patroni killed before it stopped its server), then etcd; deletes the folder.
    fn drop(&mut self) {
        self.stop_routing();
        for n in &mut self.nodes {
            if let Some(mut p) = n.patroni.take() {
                stop_child(&mut p, Duration::from_secs(30));
            }
        }
        for n in &self.nodes {
            if let Some(pid) = n.running_postmaster() {
                signal(pid, "KILL");
            }
        }
        if let Some(mut e) = self.etcd.take() {
            stop_child(&mut e, Duration::from_secs(5));
        }
        if std::thread::panicking() {
            self.keep_logs();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
