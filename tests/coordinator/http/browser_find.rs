//! The on-call console in a real browser (headless Chromium over WebDriver, as `browser.rs`),
//! against a coordinator with authentication on and real seats and payments participants: the
//! overview's counts come from the database; the search box finds a reservation by its request
//! id, by the first characters of its id and by its holder; `#/reservations/ID` opens it; its
//! Payments panel shows the money trail (the payment applied, a second one refunded), and a
//! decided reservation shows no countdown; the inventory shows each resource's stock levels
//! at its participant; each view fits a phone's width; stuck work is listed oldest first with
//! its next retry and last error. Every wait is for a DOM change, with a deadline
//! that fails with what the page showed last.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::browser::{browser, sign_in, start_driver, until_shows};
use super::spawn_http;
use crate::auth::{Cast, keyed, reserve_seat, secured_settings};

use crate::common::{Decide, Shop, charge_for, proto_duration};

/// What the page shows, in one script.
const LOOK: &str = r#"
const q = (s) => document.querySelector(s);
const text = (s) => q(s) ? q(s).textContent : null;
return {
  hash: location.hash,
  asks_key: !q('#key-panel').classList.contains('hidden'),
  live: Object.fromEntries(Array.from(document.querySelectorAll('#counts .stat')).map((s) => [s.dataset.state, Number(s.querySelector('.value').textContent)])),
  hour: Array.from(document.querySelectorAll('#hour .stat')).map((s) => s.textContent),
  charts: Array.from(document.querySelectorAll('.chart')).map((c) => c.dataset.chart),
  state: q('#state') ? q('#state').dataset.state || null : null,
  countdown: text('#countdown'),
  payments: Array.from(document.querySelectorAll('tr.payment')).map((r) => [r.dataset.ref, r.dataset.state]),
  results: Array.from(document.querySelectorAll('#search-results tr[data-id]')).map((r) => r.dataset.id),
  summary: text('#search-summary'),
  participants: Array.from(document.querySelectorAll('#participants tr[data-participant]')).map((r) =>
    [r.dataset.participant, r.querySelector('.url').textContent, r.querySelector('.badge').textContent]),
  inventory: Array.from(document.querySelectorAll('#inventory tr[data-resource]')).map((r) =>
    [r.dataset.resource, ...['.available', '.held', '.confirmed'].map((c) => r.querySelector(c) ? Number(r.querySelector(c).textContent) : null)]),
  main: q('#main').innerText.slice(0, 300),
};
"#;

async fn until(page: &Client, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    until_shows(page, LOOK, Duration::from_secs(15), what, done).await
}

/// Types `text` into the header's search box and submits it.
async fn search(page: &Client, text: &str) {
    let input = page.find(Locator::Id("search-input")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(text).await.unwrap();
    page.find(Locator::Css("#search button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn the_console_finds_a_reservation_and_shows_its_money_trail(pool: PgPool) {
    let shop = Shop::open(&pool, 100_000).await;
    crate::common::put_resources(&shop.seats, &[("A2", 1)]).await;
    let cast = Cast::new();
    let participants = [
        ("seats", shop.seats.as_str()),
        ("payments", shop.payments.as_str()),
    ];
    let app = spawn_http(pool, secured_settings(&cast, &participants)).await;
    let mut grpc = app.grpc.clone();

    // Paid twice: the first payment applied, the second refunded.
    let mut request = reserve_seat("order-paid", "alice", "A1");
    request.ttl = Some(proto_duration(Duration::from_secs(600)));
    let paid = grpc
        .reserve(keyed(request, &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    let first = charge_for(&shop.payments, "card-1", &paid.id, 4_200).await;
    let decide = Decide::on(&paid);
    grpc.confirm(keyed(decide.confirm_with(&first), &cast.shop.key))
        .await
        .unwrap();
    let second = charge_for(&shop.payments, "card-1", &paid.id, 1_500).await;
    grpc.confirm(keyed(decide.confirm_with(&second), &cast.shop.key))
        .await
        .expect_err("the second payment is refunded");
    // And one held, of another holder.
    let held = grpc
        .reserve(keyed(
            reserve_seat("order-held", "bob", "A2"),
            &cast.shop.key,
        ))
        .await
        .unwrap()
        .into_inner();

    let driver = start_driver().await;
    let page = browser(&driver).await;
    page.goto(&format!("{}/#/", app.base)).await.unwrap();
    until(&page, "the key panel", |p| p["asks_key"] == true).await;
    sign_in(&page, &cast.admin.key).await;

    // The overview: live counts from the database, the last hour by state, its charts.
    let seen = until(&page, "the live counts and the last hour's", |p| {
        p["live"]["HELD"] == 1
            && p["hour"]
                .as_array()
                .is_some_and(|h| h.iter().any(|s| s == "CONFIRMED1"))
    })
    .await;
    assert_eq!(seen["live"]["TRYING"], 0, "{seen:#}");
    assert_eq!(seen["charts"].as_array().map(Vec::len), Some(4), "{seen:#}");

    // The search box: a request id that matches one reservation opens it.
    search(&page, "order-paid").await;
    let seen = until(&page, "the paid reservation, found by request id", |p| {
        p["state"] == "CONFIRMED" && p["payments"].as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    assert_eq!(seen["hash"], format!("#/r/{}", paid.id));
    // The money trail: the payment applied, the second one refunded; no countdown.
    assert_eq!(
        seen["payments"],
        json!([
            [first.payment_ref, "APPLIED"],
            [second.payment_ref, "REFUNDED"]
        ])
    );
    assert_eq!(seen["countdown"], "", "{seen:#}");

    // The first characters of an id: that one.
    search(&page, &held.id[..23]).await;
    until(&page, "the held reservation, found by id prefix", |p| {
        p["hash"] == format!("#/r/{}", held.id) && p["state"] == "HELD"
    })
    .await;
    // A holder with several reservations lists them; the other search finds nothing.
    let mut again = reserve_seat("order-held-2", "bob", "A1");
    again.ttl = Some(proto_duration(Duration::from_secs(600)));
    let rejected = grpc.reserve(keyed(again, &cast.shop.key)).await;
    assert!(rejected.is_err(), "A1 is sold");
    search(&page, "bob").await;
    let seen = until(&page, "bob's reservations", |p| {
        p["results"].as_array().is_some_and(|r| r.len() == 2)
    })
    .await;
    assert!(
        seen["results"]
            .as_array()
            .unwrap()
            .contains(&json!(held.id)),
        "{seen:#}"
    );
    search(&page, "nobody-has-this").await;
    until(&page, "nothing found, said so", |p| {
        p["main"].as_str().unwrap_or("").contains("Nothing matches")
    })
    .await;

    // The inventory: the resources of the latest reservations, as the seats participant
    // counts them: A1 sold, A2 held.
    page.goto(&format!("{}/#/inventory", app.base))
        .await
        .unwrap();
    until(&page, "the inventory", |p| {
        p["inventory"] == json!([["seats/A1", 0, 0, 1], ["seats/A2", 0, 1, 0]])
    })
    .await;

    // The participants: where each is, reachable.
    page.goto(&format!("{}/#/participants", app.base))
        .await
        .unwrap();
    until(&page, "the participants", |p| {
        p["participants"]
            == json!([
                ["payments", shop.payments, "reachable"],
                ["seats", shop.seats, "reachable"]
            ])
    })
    .await;

    // #/reservations/ID opens a reservation's page too.
    page.goto(&format!("{}/#/reservations/{}", app.base, paid.id))
        .await
        .unwrap();
    until(&page, "the long route", |p| p["state"] == "CONFIRMED").await;

    // At a phone's width nothing runs off the side: the page scrolls down, not across (wide
    // tables scroll inside their own box).
    page.set_window_size(390, 844).await.unwrap();
    for view in [
        "#/",
        &format!("#/r/{}", paid.id),
        "#/inventory",
        "#/participants",
    ] {
        page.goto(&format!("{}/{view}", app.base)).await.unwrap();
        until(&page, "the view at a phone's width", |p| {
            p["main"].as_str().is_some_and(|m| !m.contains("Loading"))
        })
        .await;
        let wide: Value = page
            .execute(
                "return document.documentElement.scrollWidth - window.innerWidth;",
                vec![],
            )
            .await
            .unwrap();
        assert!(
            wide.as_i64().is_some_and(|w| w <= 0),
            "{view} is {wide} px too wide"
        );
    }
    page.close().await.unwrap();
}

/// Stuck work in the browser: oldest first, each with its age, attempts, next retry and last
/// error; the Participants view counts them as the participant's backlog.
#[sqlx::test]
async fn the_console_lists_stuck_work_oldest_first(pool: PgPool) {
    let fakes = crate::common::spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let settings = secured_settings(&cast, &[("seats", &fakes.get("seats").url)]);
    let app = spawn_http(pool, settings).await;
    let mut grpc = app.grpc.clone();
    let mut made = Vec::new();
    for (i, seat) in ["A1", "A2"].into_iter().enumerate() {
        let request = reserve_seat(&format!("stuck-{i}"), "alice", seat);
        let r = grpc.reserve(keyed(request, &cast.shop.key)).await.unwrap();
        made.push(r.into_inner());
    }
    // The participant fails every call from now on: neither release can finish.
    fakes
        .get("seats")
        .script(&holdfast_testkit::fake::Script::new().fail_next(10_000));
    for r in &made {
        grpc.cancel(keyed(Decide::on(r).cancel(), &cast.shop.key))
            .await
            .unwrap();
    }
    let driver = start_driver().await;
    let page = browser(&driver).await;
    page.goto(&format!("{}/#/stuck", app.base)).await.unwrap();
    until(&page, "the key panel", |p| p["asks_key"] == true).await;
    sign_in(&page, &cast.admin.key).await;
    const STUCK: &str = r#"return Array.from(document.querySelectorAll('#stuck tr[data-id]')).map((r) =>
        [r.dataset.id, ...Array.from(r.querySelectorAll('td')).slice(1).map((c) => c.textContent)]);"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rows = loop {
        // The view reads once; read it again until both were retried at least once.
        page.execute(
            "location.hash = '#/stuck?' + Date.now(); return null;",
            vec![],
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rows: Value = page.execute(STUCK, vec![]).await.unwrap();
        let retried = rows.as_array().is_some_and(|rows| {
            rows.len() == 2 && rows.iter().all(|r| r[3].as_str().is_some_and(|a| a != "0"))
        });
        if retried {
            break rows;
        }
        assert!(Instant::now() < deadline, "stuck work not shown: {rows:#}");
    };
    // Oldest first: the first made on top; each with its next retry and last error.
    assert_eq!(
        (&rows[0][0], &rows[1][0]),
        (&json!(made[0].id), &json!(made[1].id)),
        "{rows:#}"
    );
    for row in rows.as_array().unwrap() {
        assert_eq!(row[1], "CANCELLING", "{row}");
        let next = row[4].as_str().unwrap_or("");
        assert!(
            next.starts_with("in ") || next == "due now",
            "next retry: {row}"
        );
        assert!(
            !row[5].as_str().unwrap_or("").is_empty(),
            "last error: {row}"
        );
    }
    // The participant's backlog: both stuck reservations wait on it.
    page.goto(&format!("{}/#/participants", app.base))
        .await
        .unwrap();
    const BACKLOG: &str = r#"return Array.from(document.querySelectorAll('#participants tr[data-participant]')).map((r) =>
        [r.dataset.participant, r.querySelector('.backlog').textContent]);"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows: Value = page.execute(BACKLOG, vec![]).await.unwrap();
        if rows == json!([["seats", "2"]]) {
            break;
        }
        assert!(Instant::now() < deadline, "the backlog: {rows:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    page.close().await.unwrap();
}
