//! Waitlists from the command line (SPEC 11) as processes against a real coordinator and a
//! real `seats` participant (one place per seat), authentication on: `holdfast admin queue`
//! lists a resource's queue in offer order through every page (table and `--json`), says when
//! nobody waits, and exits as the other admin commands; `get` shows where a QUEUED reservation
//! waits, `list --state queued` finds it, `watch` follows it from QUEUED to HELD when the
//! holder ahead cancels.

use std::time::Duration;

use holdfast::proto;
use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{holdfast, json, keys, run, stderr, stdout};
use crate::auth::{Cast, keyed, reserve_seat, secured_shop};
use crate::common::{Decide, closed_url, proto_duration};

/// A Reserve of seat A1 for `holder` that waits up to an hour when it is sold out.
fn queued_seat(request_id: &str, holder: &str) -> proto::ReserveRequest {
    proto::ReserveRequest {
        queue: Some(proto::QueueOptions {
            wait_up_to: Some(proto_duration(Duration::from_secs(3600))),
        }),
        ..reserve_seat(request_id, holder, "A1")
    }
}

#[sqlx::test]
async fn an_operator_sees_who_waits_and_a_holder_sees_where(pool: PgPool) {
    let cast = Cast::new();
    let (mut app, _seats) = secured_shop(pool, &cast).await;
    let url = format!("http://{}", app.addr);
    let mut reserve = async |request: proto::ReserveRequest| {
        app.client
            .reserve(keyed(request, &cast.shop.key))
            .await
            .unwrap()
            .into_inner()
    };
    let alice = reserve(queued_seat("q-1", "alice")).await;
    assert_eq!(alice.state(), proto::reservation::State::Held);
    let bob = reserve(queued_seat("q-2", "bob")).await;
    let carol = reserve(queued_seat("q-3", "carol")).await;
    assert_eq!(carol.state(), proto::reservation::State::Queued);
    let ops = ["--coordinator", &url, "--api-key", &cast.admin.key];
    let shop = ["--coordinator", &url, "--api-key", &cast.shop.key];

    // --json, one entry per page: every page is read, in offer order, with the length.
    let queue = [
        "admin",
        "queue",
        "seats",
        "A1",
        "--page-size",
        "1",
        "--json",
    ];
    let o = run(&[&queue[..], &ops].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(keys(&v), ["entries", "length"]);
    assert_eq!(v["length"], 2, "{v}");
    let entries = v["entries"].as_array().unwrap();
    let order: Vec<(&Value, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                &e["position"],
                e["reservation_id"].as_str().unwrap_or(""),
                e["holder"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            (&Value::from(1), bob.id.as_str(), "bob"),
            (&Value::from(2), carol.id.as_str(), "carol")
        ],
        "{v}"
    );
    assert_eq!(entries[0]["quantity"], 1);
    assert_eq!(
        keys(&entries[0]),
        [
            "holder",
            "position",
            "quantity",
            "reservation_id",
            "since",
            "until"
        ]
    );

    // The table: a row per waiting reservation, head first, and the length.
    let o = run(&[&["admin", "queue", "seats", "A1"][..], &ops].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["POSITION", "RESERVATION", "HOLDER", "QTY", "SINCE", "UNTIL"],
        "{table}"
    );
    assert_eq!(lines[1][..4], ["1", bob.id.as_str(), "bob", "1"], "{table}");
    assert_eq!(
        lines[2][..4],
        ["2", carol.id.as_str(), "carol", "1"],
        "{table}"
    );
    assert!(
        table.contains("(in 59m") && table.ends_with("\nlength: 2\n"),
        "{table}"
    );
    let o = run(&[&["admin", "queue", "seats", "A2"][..], &ops].concat()).await;
    assert_eq!(
        stdout(&o),
        "nobody is waiting (length 0)\n",
        "{}",
        stderr(&o)
    );

    // A holder's page says where it waits; a QUEUED one is listed by its state.
    let o = run(&[&["get", &bob.id][..], &shop].concat()).await;
    let page = stdout(&o);
    assert!(page.contains("state       QUEUED"), "{page}");
    assert!(
        page.contains("expires     - (queued: nothing is held)\n"),
        "{page}"
    );
    assert!(
        page.contains("queued      position 1 in seats/A1\n"),
        "{page}"
    );
    assert!(
        page.contains("waits until 20") && page.contains("(in 59m"),
        "{page}"
    );
    let v = json(&run(&[&["get", &carol.id, "--json"][..], &shop].concat()).await);
    assert_eq!(
        (v["state"].as_str(), v["queue"]["position"].as_i64()),
        (Some("QUEUED"), Some(2)),
        "{v}"
    );
    let v = json(&run(&[&["list", "--state", "queued", "--json"][..], &shop].concat()).await);
    let listed: Vec<&str> = v["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(
        listed,
        [carol.id.as_str(), bob.id.as_str()],
        "newest first: {v}"
    );

    // Watch follows bob from QUEUED to HELD: alice cancels, the seat is offered to the head.
    let mut child = holdfast(&[&["watch", &bob.id, "--json"][..], &shop].concat())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_state = async || {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("watch printed nothing for 20 s")
            .unwrap()
            .expect("watch ended early");
        serde_json::from_str::<Value>(&line).unwrap()["state"].clone()
    };
    assert_eq!(next_state().await, "QUEUED");
    app.client
        .cancel(keyed(Decide::on(&alice).cancel(), &cast.shop.key))
        .await
        .unwrap();
    while next_state().await != "HELD" {}
    let v = json(&run(&[&["admin", "queue", "seats", "A1", "--json"][..], &ops].concat()).await);
    assert_eq!(v["length"], 1, "{v}");
    assert_eq!(v["entries"][0]["reservation_id"], carol.id.as_str(), "{v}");
    assert_eq!(v["entries"][0]["position"], 1, "carol moved up: {v}");
    app.shut_down();
}

#[sqlx::test]
async fn admin_queue_exits_as_the_other_admin_commands(pool: PgPool) {
    let cast = Cast::new();
    let (mut app, _seats) = secured_shop(pool, &cast).await;
    let url = format!("http://{}", app.addr);
    let shop = ["--coordinator", &url, "--api-key", &cast.shop.key];
    let ops = ["--coordinator", &url, "--api-key", &cast.admin.key];

    // Refused by the coordinator: exit 1 and the reason (a client key; a bad id).
    let o = run(&[&["admin", "queue", "seats", "A1"][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("PERMISSION_DENIED"), "{}", stderr(&o));
    let o = run(&[&["admin", "queue", "seats", "", "--json"][..], &ops].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(
        (e["code"].as_str(), e["metadata"]["field"].as_str()),
        (Some("INVALID_ARGUMENT"), Some("resource")),
        "{e}"
    );

    // Usage: exit 2 before anything is sent, naming the flag.
    for (args, flag) in [
        (&["admin", "queue", "seats"][..], "RESOURCE"),
        (
            &["admin", "queue", "seats", "A1", "--page-size", "0"][..],
            "--page-size",
        ),
        (
            &["admin", "queue", "seats", "A1", "--during", "today"][..],
            "--during",
        ),
    ] {
        let o = run(&[args, &ops].concat()).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag), "{args:?}: {}", stderr(&o));
    }

    // Unreachable: exit 3, naming the coordinator.
    let closed = closed_url().await;
    let o = run(&["admin", "queue", "seats", "A1", "--coordinator", &closed]).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains(&closed), "{}", stderr(&o));
    app.shut_down();
}
