//! `holdfast events tail|latest` (SPEC 10) as processes against a real coordinator: the feed
//! as JSON lines and as a table, a type filter, the latest sequence, and a tail that outlives
//! a coordinator restart, going on after the last event it printed.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::ChildStdout;
use tokio::sync::oneshot;

use super::{holdfast, run, stderr, stdout};
use crate::common::{hold, reserve_request, settings, spawn_fakes};

/// A coordinator serving on `listener` until the sender is used; joined by the handle.
fn serve(
    pool: &PgPool,
    participants: &[(&str, &str)],
    listener: TcpListener,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let store = holdfast::store::PgStore::from_pool(pool.clone());
    let settings = settings(participants);
    let (tx, rx) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        holdfast::app::serve_coordinator(settings, store, listener, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (tx, served)
}

async fn reserve(addr: SocketAddr, id: &str, seat: &str) -> proto::Reservation {
    let mut client = CoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    client
        .reserve(reserve_request(id, vec![hold("seats", seat)]))
        .await
        .unwrap()
        .into_inner()
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("tail printed nothing for 20 s")
        .unwrap()
        .expect("tail ended")
}

/// Lines of `tail` until the event of `id` of type `until`, as JSON.
async fn until(lines: &mut Lines<BufReader<ChildStdout>>, id: &str, until: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let line = next_line(lines).await;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let done = v["type"] == until && v["reservation"]["id"] == id;
        out.push(v);
        if done {
            return out;
        }
    }
}

#[sqlx::test]
async fn events_tail_follows_the_feed_and_goes_on_after_a_coordinator_restart(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let seats = fakes.get("seats").url.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("http://{addr}");
    let (stop, served) = serve(&pool, &[("seats", &seats)], listener);
    let first = reserve(addr, "t-1", "A1").await;

    let mut tail = holdfast(&[
        "events",
        "tail",
        "--after",
        "0",
        "--json",
        "--coordinator",
        &url,
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    let seen = until(&mut lines, &first.id, "RESERVATION_HELD").await;
    let types: Vec<&str> = seen.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["RESERVATION_TRYING", "RESERVATION_HELD"]);
    let held = seen[1]["sequence"].as_i64().unwrap();

    // The latest sequence, as a number and as JSON.
    let o = run(&["events", "latest", "--coordinator", &url]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), held.to_string());
    let o = run(&["events", "latest", "--json", "--coordinator", &url]).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap(),
        serde_json::json!({ "sequence": held })
    );

    // A table line per event, filtered by type.
    let mut table = holdfast(&[
        "events",
        "tail",
        "--after",
        "0",
        "--type",
        "reservation_held",
        "--coordinator",
        &url,
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut table_lines = BufReader::new(table.stdout.take().unwrap()).lines();
    let line = next_line(&mut table_lines).await;
    let cells: Vec<&str> = line.split("  ").collect();
    assert_eq!(cells.len(), 6, "{line}");
    assert_eq!(
        (cells[0], cells[2], cells[3], cells[5]),
        (
            held.to_string().as_str(),
            "RESERVATION_HELD",
            first.id.as_str(),
            "HELD"
        ),
        "{line}"
    );
    table.kill().await.unwrap();

    // The coordinator restarts on the same address: the tail subscribes again after the
    // last sequence it printed and goes on with the next event, none twice.
    let _ = stop.send(());
    served.await.unwrap();
    let listener = TcpListener::bind(addr).await.unwrap();
    let (_stop, _served) = serve(&pool, &[("seats", &seats)], listener);
    let second = reserve(addr, "t-2", "A2").await;
    let after = until(&mut lines, &second.id, "RESERVATION_HELD").await;
    assert_eq!(
        after[0]["reservation"]["id"],
        second.id.as_str(),
        "{after:#?}"
    );
    assert_eq!(after[0]["type"], "RESERVATION_TRYING");
    assert!(after[0]["sequence"].as_i64().unwrap() > held);
    tail.kill().await.unwrap();
    let mut said = String::new();
    let mut err = tail.stderr.take().unwrap();
    tokio::io::AsyncReadExt::read_to_string(&mut err, &mut said)
        .await
        .unwrap();
    assert!(
        said.contains(&format!("subscribing again after sequence {held}")),
        "{said}"
    );
}

#[tokio::test]
async fn events_tail_refuses_a_bad_type_before_sending_anything() {
    let o = run(&[
        "events",
        "tail",
        "--type",
        "sold",
        "--coordinator",
        "http://127.0.0.1:9",
    ])
    .await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is not an event type"),
        "{}",
        stderr(&o)
    );
}
