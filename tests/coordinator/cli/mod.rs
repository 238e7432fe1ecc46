//! `holdfast get|list|watch` (SPEC 8.2) and `holdfast events` (`events.rs`) run as processes against a real coordinator: their
//! output parsed (tables and the `--json` schema), exit codes and error reasons, keys.

mod admin;
mod events;
mod find;
mod queue;

use std::process::Output;
use std::time::Duration;

use holdfast::proto;
use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

use crate::auth::{Cast, keyed, reserve_seat, secured_shop};
use crate::common::{Decide, closed_url, hold, reserve_request, spawn_with_fakes};

/// The fields of a reservation in `--json`, all always present: scripts rely on them.
const RESERVATION_FIELDS: &[&str] = &[
    "audit",
    "branches",
    "created_at",
    "expires_at",
    "extensions_used",
    "holder",
    "id",
    "labels",
    "late_payment_honored",
    "payments",
    "queue",
    "refund",
    "rejection",
    "request_id",
    "state",
];

/// The binary with `args`, none of the caller's environment (no HOLDFAST_* leaks in).
fn holdfast(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.args(args).env_clear().kill_on_drop(true);
    cmd
}

async fn run(args: &[&str]) -> Output {
    tokio::time::timeout(Duration::from_secs(30), holdfast(args).output())
        .await
        .unwrap_or_else(|_| panic!("holdfast {args:?} did not finish in 30 s"))
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}

/// The keys of a JSON object, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

#[sqlx::test]
async fn get_and_list_show_a_reservation_to_its_owner_and_an_admin_only(pool: PgPool) {
    let cast = Cast::new();
    let (mut app, _seats) = secured_shop(pool, &cast).await;
    let url = format!("http://{}", app.addr);
    let r = app
        .client
        .reserve(keyed(reserve_seat("cli-1", "alice", "A1"), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    let shop = ["--coordinator", &url, "--api-key", &cast.shop.key];

    // The human page: its state, the branch table, no token.
    let o = run(&[&["get", &r.id][..], &shop].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.contains(&format!("id          {}", r.id)), "{page}");
    assert!(page.contains("state       HELD"), "{page}");
    let branch = page
        .lines()
        .find(|l| l.starts_with("seats"))
        .unwrap_or_default();
    let cells: Vec<&str> = branch.split_whitespace().collect();
    assert_eq!(cells, ["seats", "A1", "1", "HELD", "1"], "{page}");
    assert!(
        !page.contains(&r.hold_token),
        "a hold token in the output: {page}"
    );

    // --json: the stable schema.
    let o = run(&[&["get", &r.id, "--json"][..], &shop].concat()).await;
    let v = json(&o);
    assert_eq!(keys(&v), RESERVATION_FIELDS);
    assert_eq!(v["state"], "HELD");
    assert_eq!(v["holder"], "alice");
    assert_eq!(v["branches"][0]["participant"], "seats");
    assert_eq!(v["branches"][0]["state"], "HELD");
    assert!(!stdout(&o).contains(&r.hold_token));

    // The list as its owner (table and JSON) and as the admin; a stranger sees nothing.
    let o = run(&[&["list"][..], &shop].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        [
            "ID",
            "STATE",
            "HOLDER",
            "AGE",
            "EXPIRES IN",
            "BRANCHES",
            "LAST ERROR"
        ]
    );
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with(&r.id) && row.contains("HELD") && row.contains("1 HELD"),
        "{table}"
    );
    let admin = ["--coordinator", &url, "--api-key", &cast.admin.key];
    let v = json(&run(&[&["list", "--json", "--holder", "alice"][..], &admin].concat()).await);
    assert_eq!(keys(&v), ["next_page_token", "reservations"]);
    assert_eq!(v["reservations"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["reservations"][0]["id"], r.id.as_str());
    let stranger = ["--coordinator", &url, "--api-key", &cast.stranger.key];
    let v = json(&run(&[&["list", "--json"][..], &stranger].concat()).await);
    assert_eq!(v["reservations"], Value::Array(vec![]));

    // Refusals: exit 1 and the reason, as text or as the SPEC's JSON error.
    let o = run(&[&["get", &r.id][..], &stranger].concat()).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("RESERVATION_NOT_FOUND"),
        "{}",
        stderr(&o)
    );
    let o = run(&["get", &r.id, "--coordinator", &url, "--json"]).await;
    assert_eq!(o.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(keys(&e), ["code", "message", "metadata", "reason"]);
    assert_eq!(
        (e["code"].as_str(), e["reason"].as_str()),
        (Some("UNAUTHENTICATED"), Some("UNAUTHENTICATED"))
    );
    let o = run(&[&["get", "not-a-uuid", "--json"][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(e["code"], "INVALID_ARGUMENT", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("reservation_id"),
        "{e}"
    );
    app.shut_down();
}

#[tokio::test]
async fn an_unreachable_coordinator_and_bad_flags_have_exit_codes_of_their_own() {
    let closed = closed_url().await;
    let o = run(&["list", "--coordinator", &closed]).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains(&closed), "{}", stderr(&o));
    let o = run(&["list", "--state", "sold", "--coordinator", &closed]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--state"), "{}", stderr(&o));
    let o = run(&["list", "--coordinator", "not a url"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--coordinator"), "{}", stderr(&o));
    // An address without its scheme is a usage error naming the scheme, not a transport error.
    let bare = closed.trim_start_matches("http://");
    let o = run(&["list", "--coordinator", bare]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = stderr(&o);
    assert!(
        said.contains("--coordinator") && said.contains(&format!("http://{bare}")),
        "{said}"
    );
}

#[sqlx::test]
async fn watch_prints_each_state_until_the_reservation_ends(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let url = format!("http://{}", app.addr);
    let r = app
        .client
        .reserve(reserve_request("cli-watch", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let mut child = holdfast(&["watch", &r.id, "--json", "--coordinator", &url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    async fn next(lines: &mut Lines<BufReader<ChildStdout>>) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("watch printed nothing for 20 s")
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap())
    }
    let first = next(&mut lines).await.expect("watch ended before printing");
    assert_eq!(first["state"], "HELD");
    assert_eq!(keys(&first), RESERVATION_FIELDS);
    app.client
        .cancel(Decide::on(&r).cancel_because("changed my mind"))
        .await
        .unwrap();
    let mut states = vec![first["state"].clone()];
    while let Some(v) = next(&mut lines).await {
        states.push(v["state"].clone());
    }
    assert_eq!(
        states.last().and_then(Value::as_str),
        Some("CANCELLED"),
        "{states:?}"
    );
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("watch did not exit after the stream ended")
        .unwrap();
    assert!(status.success());
    let r = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: r.id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state(), proto::reservation::State::Cancelled);
    app.shut_down();
}

#[sqlx::test]
async fn watch_on_a_terminal_counts_down_live(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let url = format!("http://{}", app.addr);
    let r = app
        .client
        .reserve(reserve_request("cli-tty", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    // `script` gives the CLI a pseudo-terminal, as an operator's shell would.
    let line = format!(
        "{} watch {} --coordinator {url}",
        env!("CARGO_BIN_EXE_holdfast"),
        r.id
    );
    let mut child = Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .env_clear()
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    // Read until two different countdowns were drawn: the line is redrawn every second.
    let mut seen: Vec<String> = Vec::new();
    let mut text = String::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while seen.len() < 2 {
            let n = tokio::io::AsyncReadExt::read(&mut out, &mut buf)
                .await
                .unwrap();
            assert!(n > 0, "watch ended early: {text:?}");
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            seen = text
                .split("\x1b[2K")
                .filter_map(|s| s.split("expires in ").nth(1))
                .filter_map(|s| s.split_whitespace().next())
                .map(str::to_owned)
                .collect();
            seen.dedup();
        }
    };
    tokio::time::timeout(Duration::from_secs(15), read)
        .await
        .unwrap_or_else(|_| panic!("no live countdown in 15 s: {text:?}"));
    assert!(text.contains("HELD"), "{text:?}");
    app.client.cancel(Decide::on(&r).cancel()).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("watch did not end with the reservation")
        .unwrap();
    assert!(status.success());
    app.shut_down();
}
