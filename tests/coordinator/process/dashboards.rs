//! The dashboards and alerts of `deploy/` (SPEC 8.5) read only metrics that exist: every
//! `holdfast_*` name in a PromQL expression of `deploy/grafana/holdfast.json` and
//! `deploy/prometheus/alerts.yml` must be on the `/metrics` page of a live coordinator or of a
//! live participant (the real binary, split roles: `stock` on SQLite, `stock-redis` on
//! PostgreSQL and the local Redis, each with `--metrics-listen`; the coordinator with a
//! webhook nothing answers), after a Reserve that is confirmed and one that is cancelled. The
//! rules file passes `promtool check rules` when promtool is installed (`.ci/run` installs it),
//! else a structural check.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;

use super::{Holdfast, TempDatabase, holdfast_command, listen_addr, scrape};
use crate::common::{Decide, hold, proto_duration};

/// Every `holdfast_*` metric name an expression mentions.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("holdfast_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The PromQL of the dashboard: every `expr` of a panel's targets and every variable's query.
fn dashboard_exprs(json: &serde_json::Value, out: &mut Vec<String>) {
    match json {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// The rules file's expressions (`expr:` on one line, or a folded block `expr: >-` of the
/// lines indented below it), with the alert each belongs to.
fn rule_exprs(yaml: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut alert = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert:") {
            alert = name.trim().to_owned();
        }
        if let Some(value) = trimmed.strip_prefix("expr:") {
            let value = value.trim();
            if value == ">-" || value == "|" || value == ">" {
                let indent = line.len() - trimmed.len();
                let mut block = Vec::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if next.trim().is_empty() || next_indent <= indent {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                out.push((alert.clone(), block.join(" ")));
            } else {
                out.push((alert.clone(), value.to_owned()));
            }
        }
        i += 1;
    }
    out
}

/// The metric names on a /metrics page (histograms as their `_bucket`/`_sum`/`_count`).
fn exported(page: &str) -> BTreeSet<String> {
    page.split("\r\n\r\n")
        .nth(1)
        .unwrap_or(page)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// A folder removed when the test passes (kept with the logs when it fails).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn spawn(args: &[&str], log: &Path) -> Holdfast {
    let mut cmd = holdfast_command();
    cmd.args(args).env("RUST_LOG", "info");
    Holdfast::spawn(cmd, log.to_path_buf())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_name_only_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let rules_path = root.join("prometheus/alerts.yml");
    let rules = std::fs::read_to_string(&rules_path).expect("read alerts.yml");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana/holdfast.json")).expect("read holdfast.json"),
    )
    .expect("holdfast.json is JSON");

    // The rules parse: promtool when installed, else the structure Prometheus needs.
    let rule_list = rule_exprs(&rules);
    match std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules_path)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "promtool check rules failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => {
            assert!(rules.starts_with("# ") || rules.starts_with("groups:"));
            assert!(rules.contains("\ngroups:\n") || rules.starts_with("groups:"));
            let alerts = rules.matches("- alert:").count();
            assert_eq!(alerts, rule_list.len(), "every alert has one expr");
            assert!(!rules.contains('\t'), "YAML takes no tabs");
        }
    }
    for wanted in [
        "HoldfastStuckWork",
        "HoldfastRecoveryBacklog",
        "HoldfastFailedReservations",
        "HoldfastRefundsPending",
        "HoldfastExpiredHoldRate",
        "HoldfastParticipantErrors",
        "HoldfastEventsLagging",
        "HoldfastWebhookPaused",
    ] {
        assert!(
            rule_list.iter().any(|(a, _)| a == wanted),
            "alert {wanted} missing"
        );
    }
    let mut exprs: Vec<(String, String)> = rule_list;
    let mut panel_exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut panel_exprs);
    assert!(panel_exprs.len() >= 15, "{panel_exprs:?}");
    exprs.extend(panel_exprs.into_iter().map(|e| ("dashboard".to_owned(), e)));
    // Every replica counts every event of the log: summed across replicas, each event would
    // count once per replica.
    for (source, expr) in &exprs {
        if expr.contains("holdfast_events_appended_total") {
            assert!(
                expr.contains("max by") && !expr.contains("sum"),
                "{source}: aggregate the log's count with max: {expr}"
            );
        }
    }

    // Live processes: a stock participant (SQLite), a stock-redis one (PostgreSQL + Redis),
    // and a coordinator (SQLite) in front of both, each serving /metrics.
    let dir = TempDir(std::env::temp_dir().join(format!(
        "holdfast-dashboards-{}",
        uuid::Uuid::new_v4().simple()
    )));
    std::fs::create_dir_all(dir.path()).expect("temp dir");
    let listen = listen_addr(20);
    let at = |port: u16| SocketAddr::new(listen.ip(), port).to_string();
    let (stock, redis, coord) = (at(50061), at(50066), listen.to_string());
    let (m_stock, m_redis, m_coord) = (at(9465), at(9466), at(9464));
    let pg = TempDatabase::create().await;
    let redis_url =
        std::env::var("HOLDFAST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let prefix = format!("hf-dash-{}:", uuid::Uuid::new_v4().simple());
    let url = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let secret = dir.path().join("webhook-secret").display().to_string();
    std::fs::write(&secret, "dashboards-secret\n").expect("write the webhook secret");
    let mut processes = vec![
        spawn(
            &[
                "participant",
                "stock",
                "--listen",
                &stock,
                "--database-url",
                &url("stock.db"),
                "--metrics-listen",
                &m_stock,
            ],
            &dir.path().join("stock.log"),
        ),
        spawn(
            &[
                "participant",
                "stock-redis",
                "--listen",
                &redis,
                "--database-url",
                &pg.url,
                "--redis-url",
                &redis_url,
                "--redis-prefix",
                &prefix,
                "--metrics-listen",
                &m_redis,
            ],
            &dir.path().join("stock-redis.log"),
        ),
        spawn(
            &[
                "coordinator",
                "--listen",
                &coord,
                "--database-url",
                &url("coordinator.db"),
                "--participant",
                &format!("stock=http://{stock}"),
                "--participant",
                &format!("stock-redis=http://{redis}"),
                "--metrics-listen",
                &m_coord,
                // A webhook nothing answers: the sinks' series are exported too.
                "--webhook",
                "dashboards=http://127.0.0.1:9/holdfast",
                "--webhook-secret-file",
                &secret,
            ],
            &dir.path().join("coordinator.log"),
        ),
    ];
    for (process, (addr, service)) in processes.iter_mut().zip([
        (&stock, "tcc.v1.Participant"),
        (&redis, "tcc.v1.Participant"),
        (&coord, "tcc.v1.Coordinator"),
    ]) {
        process.wait_serving(addr.parse().unwrap(), service).await;
    }
    for addr in [&stock, &redis] {
        super::admin(addr.parse().unwrap())
            .await
            .put_resources(proto::PutResourcesRequest {
                resources: vec![proto::ResourceSpec {
                    resource: "mug".into(),
                    capacity: 10,
                }],
            })
            .await
            .expect("PutResources");
    }
    let mut client = CoordinatorClient::connect(format!("http://{coord}"))
        .await
        .expect("connect");
    for (i, confirm) in [(0, true), (1, false)] {
        let r = client
            .reserve(proto::ReserveRequest {
                request_id: format!("dash-{i}"),
                holder: "dash".into(),
                ttl: Some(proto_duration(Duration::from_secs(60))),
                holds: vec![hold("stock", "mug"), hold("stock-redis", "mug")],
                labels: Default::default(),
                queue: None,
            })
            .await
            .expect("Reserve")
            .into_inner();
        if confirm {
            client
                .confirm(Decide::on(&r).confirm())
                .await
                .expect("Confirm");
        } else {
            client
                .cancel(Decide::on(&r).cancel())
                .await
                .expect("Cancel");
        }
    }

    let mut named = BTreeSet::new();
    for (whose, expr) in &exprs {
        let names = names_in(expr);
        assert!(!names.is_empty(), "{whose}: no holdfast metric in {expr}");
        named.extend(names.into_iter().map(|name| (whose, expr, name)));
    }
    // Some series appear once a loop has seen the calls above (the event follower counts the
    // events after they commit): scraped again until each is there, for at most 30 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (live, missing) = loop {
        let mut live = BTreeSet::new();
        for addr in [&m_stock, &m_redis, &m_coord] {
            live.extend(exported(&scrape(addr.parse().unwrap()).await));
        }
        let missing: Vec<String> = named
            .iter()
            .filter(|(_, _, name)| !live.contains(name))
            .map(|(whose, expr, name)| format!("{whose}: {name} in {expr}"))
            .collect();
        if missing.is_empty() || tokio::time::Instant::now() >= deadline {
            break (live, missing);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let named: BTreeSet<String> = named.into_iter().map(|(_, _, name)| name).collect();
    assert!(
        missing.is_empty(),
        "metrics no live process exports:\n{}\n\nexported: {live:?}",
        missing.join("\n")
    );
    // The participants' metrics are among them (SPEC 8.5), not only the coordinator's.
    for name in [
        "holdfast_participant_calls_total",
        "holdfast_participant_barrier_total",
        "holdfast_participant_orphan_reclaims_total",
        "holdfast_stock_redis_rebuilds_total",
        "holdfast_retention_deleted_total",
        "holdfast_oldest_work_age_seconds",
    ] {
        assert!(named.contains(name), "nothing reads {name}");
    }
    drop(processes);
    let _ = holdfast::bench::deploy::delete_redis_keys(&redis_url, &prefix).await;
}
