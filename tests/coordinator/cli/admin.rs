//! `holdfast admin ...` (SPEC 8.1, 8.2) as processes against a real coordinator with
//! authentication on: an operator finds stuck work, pushes it, cancels and settles with a
//! reason, and reads who did what.

use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast::proto;
use serde_json::Value;
use sqlx::PgPool;

use super::{json, keys, run, stderr, stdout};
use crate::auth::{Cast, keyed, secured_settings};
use crate::common::{Decide, hold, reserve_request, spawn_app, spawn_fakes};

#[sqlx::test]
async fn an_operator_pushes_cancels_and_settles_work_with_reasons(pool: PgPool) {
    let cast = Cast::new();
    let fakes = spawn_fakes(&["seats", "stock"]).await;
    let (seats, stock) = (
        fakes.get("seats").url.clone(),
        fakes.get("stock").url.clone(),
    );
    let mut s = secured_settings(&cast, &[("seats", &seats), ("stock", &stock)]);
    // Nothing but the operator drives stuck work in this test.
    s.policy.sweep_interval = Duration::from_secs(3600);
    s.policy.backoff.base = Duration::from_secs(3600);
    s.policy.backoff.cap = Duration::from_secs(3600);
    let mut app = spawn_app(pool, s).await;
    let url = format!("http://{}", app.addr);
    let ops = [
        "--coordinator",
        url.as_str(),
        "--api-key",
        cast.admin.key.as_str(),
    ];
    let reserve = |id: &str, resource: &str, participant: &str| {
        keyed(
            reserve_request(id, vec![hold(participant, resource)]),
            &cast.shop.key,
        )
    };

    // ForceCancel: released without the token, audited with the operator's name and reason.
    let held = app
        .client
        .reserve(reserve("a-1", "A1", "seats"))
        .await
        .unwrap()
        .into_inner();
    let o = run(&[
        &[
            "admin",
            "force-cancel",
            &held.id,
            "--reason",
            "customer called",
            "--json",
        ][..],
        &ops,
    ]
    .concat())
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["state"], "CANCELLED", "{v}");
    assert_eq!(v["audit"][0]["action"], "force_cancel");
    assert_eq!(v["audit"][0]["principal"], cast.admin.name.as_str());
    assert_eq!(v["audit"][0]["reason"], "customer called");
    assert!(fakes.get("seats").held().is_empty(), "the seat is released");

    // Refusals: no reason is a usage error; a client key may not act as an operator.
    let o = run(&[&["admin", "force-cancel", &held.id][..], &ops].concat()).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let shop = [
        "--coordinator",
        url.as_str(),
        "--api-key",
        cast.shop.key.as_str(),
    ];
    let o = run(&[&["admin", "stuck"][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("PERMISSION_DENIED"), "{}", stderr(&o));

    // Stuck: a Confirm that its participant keeps failing; then it is back, and Retry
    // drives it now (the backoff is an hour).
    fakes
        .get("stock")
        .behaviour
        .fail_confirms
        .store(1_000, Ordering::SeqCst);
    let r = app
        .client
        .reserve(reserve("a-2", "sku-1", "stock"))
        .await
        .unwrap()
        .into_inner();
    let _ = app
        .client
        .confirm(keyed(Decide::on(&r).confirm(), &cast.shop.key))
        .await;
    let v = json(&run(&[&["admin", "stuck", "--json"][..], &ops].concat()).await);
    let stuck: Vec<&Value> = v["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["id"] == r.id.as_str())
        .collect();
    assert_eq!(stuck.len(), 1, "{v}");
    assert_eq!(stuck[0]["state"], "CONFIRMING");
    assert_ne!(stuck[0]["branches"][0]["last_error"], "", "{v}");
    fakes
        .get("stock")
        .behaviour
        .fail_confirms
        .store(0, Ordering::SeqCst);
    let retry = [
        "admin",
        "retry",
        &r.id,
        "--reason",
        "stock is back",
        "--json",
    ];
    let o = run(&[&retry[..], &ops].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["driven"], 1, "{v}");
    assert_eq!(v["reservations"][0]["state"], "CONFIRMED", "{v}");

    // Resolve: a participant lost a hold it had granted; the operator checked and settles it.
    let r = app
        .client
        .reserve(reserve("a-3", "A2", "seats"))
        .await
        .unwrap()
        .into_inner();
    fakes.get("seats").state.lock().unwrap().branches.clear();
    let failed = app
        .client
        .confirm(keyed(Decide::on(&r).confirm(), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.state(), proto::reservation::State::Failed);
    let o = run(&[
        &[
            "admin",
            "resolve",
            &r.id,
            "--outcome",
            "cancelled",
            "--reason",
            "checked: seat is free",
        ][..],
        &ops,
    ]
    .concat())
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.contains("state       CANCELLED"), "{page}");
    assert!(
        page.contains("checked: seat is free"),
        "the audit shows on the page: {page}"
    );
    let o = run(&[
        &[
            "admin",
            "resolve",
            &r.id,
            "--outcome",
            "held",
            "--reason",
            "x",
        ][..],
        &ops,
    ]
    .concat())
    .await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // The audit log: newest first, every action, the same schema every time.
    let v = json(&run(&[&["admin", "audit", "--json"][..], &ops].concat()).await);
    let entries = v["entries"].as_array().unwrap();
    let actions: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions,
        ["resolve_cancelled", "retry", "force_cancel"],
        "{v}"
    );
    assert_eq!(entries[1]["reason"], "stock is back", "{v}");
    for e in entries {
        assert_eq!(
            keys(e),
            [
                "action",
                "at",
                "participant",
                "principal",
                "reason",
                "reservation_id"
            ]
        );
        assert_eq!(e["principal"], cast.admin.name.as_str());
    }
    let o = run(&[&["admin", "audit", &held.id][..], &ops].concat()).await;
    let table = stdout(&o);
    assert!(table.starts_with("AT "), "{table}");
    assert_eq!(
        table.lines().count(),
        2,
        "one entry for that reservation: {table}"
    );
    app.shut_down();
}
