//! Waitlists in the console (SPEC 11), in headless Chromium over WebDriver (as `browser.rs`),
//! against a coordinator with authentication on and a real `seats` participant (one place per
//! seat): the inventory's "queued" column counts each resource's queue and links to its page;
//! the queue page lists who waits in offer order (position, reservation linking to its page,
//! holder, quantity, since, until) or says nobody is waiting; a QUEUED reservation's page
//! shows its position and until, and turns HELD, live, when the holder ahead cancels. Every
//! wait is for a DOM change, with a deadline that fails with what the page showed last.

use std::time::Duration;

use fantoccini::{Client, Locator};
use holdfast::proto;
use serde_json::{Value, json};
use sqlx::PgPool;

use super::browser::{browser, sign_in, start_driver, until_shows};
use super::waitlist::queue_shop;
use crate::auth::{Cast, keyed, reserve_seat};
use crate::common::{Decide, proto_duration};

/// What the page shows, in one script.
const LOOK: &str = r#"
const q = (s) => document.querySelector(s);
const text = (s) => q(s) ? q(s).textContent : null;
const cells = (r) => Array.from(r.querySelectorAll('td')).map((c) => c.textContent);
return {
  hash: location.hash,
  asks_key: !q('#key-panel').classList.contains('hidden'),
  inventory: Array.from(document.querySelectorAll('#inventory tr[data-resource]')).map((r) =>
    [r.dataset.resource, r.querySelector('.queued') ? r.querySelector('.queued').textContent : null]),
  queue: Array.from(document.querySelectorAll('#queue tbody tr')).map(cells),
  queue_links: Array.from(document.querySelectorAll('#queue tbody a')).map((a) => a.getAttribute('href')),
  queue_length: text('#queue-length'),
  state: q('#state') ? q('#state').dataset.state || null : null,
  place: text('#queue-place'),
  until: text('#queue-until'),
  countdown: text('#countdown'),
  main: q('#main').innerText.slice(0, 300),
};
"#;

async fn until(page: &Client, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    until_shows(page, LOOK, Duration::from_secs(15), what, done).await
}

async fn click(page: &Client, css: &str) {
    page.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn the_console_shows_who_waits_for_a_resource(pool: PgPool) {
    let cast = Cast::new();
    let app = queue_shop(&pool, &cast).await;
    let mut grpc = app.grpc.clone();
    let mut reserve = async |id: &str, holder: &str| {
        let mut request = reserve_seat(id, holder, "A1");
        request.queue = Some(proto::QueueOptions {
            wait_up_to: Some(proto_duration(Duration::from_secs(3600))),
        });
        grpc.reserve(keyed(request, &cast.shop.key))
            .await
            .unwrap()
            .into_inner()
    };
    let alice = reserve("c-1", "alice").await;
    let bob = reserve("c-2", "bob").await;
    let carol = reserve("c-3", "carol").await;
    assert_eq!(bob.state(), proto::reservation::State::Queued);

    let driver = start_driver().await;
    let page = browser(&driver).await;
    page.goto(&format!("{}/#/inventory?r=seats/A1&r=seats/A2", app.base))
        .await
        .unwrap();
    until(&page, "the key panel", |p| p["asks_key"] == true).await;
    sign_in(&page, &cast.admin.key).await;

    // The inventory counts each queue; A1's count opens its queue.
    until(&page, "the queued column", |p| {
        p["inventory"] == json!([["seats/A1", "2"], ["seats/A2", "0"]])
    })
    .await;
    click(&page, "#inventory tr[data-resource='seats/A1'] .queued a").await;
    let seen = until(&page, "A1's queue", |p| {
        p["queue"].as_array().is_some_and(|q| q.len() == 2)
    })
    .await;
    assert_eq!(seen["hash"], "#/queue?participant=seats&resource=A1");
    assert_eq!(seen["queue_length"], "2");
    let rows = seen["queue"].as_array().unwrap();
    assert_eq!(
        rows[0].as_array().unwrap()[..4],
        [json!("1"), json!(bob.id), json!("bob"), json!("1")],
        "{seen:#}"
    );
    assert_eq!(
        rows[1].as_array().unwrap()[..4],
        [json!("2"), json!(carol.id), json!("carol"), json!("1")],
        "{seen:#}"
    );
    assert!(
        rows.iter().all(|r| r[4] != "-" && r[5] != "-"),
        "since and until: {seen:#}"
    );
    assert_eq!(
        seen["queue_links"],
        json!([format!("#/r/{}", bob.id), format!("#/r/{}", carol.id)])
    );

    // Bob's page: where it waits and until when, counting down to the end of the wait.
    click(&page, &format!("#queue tr[data-id='{}'] a", bob.id)).await;
    let seen = until(&page, "bob's page, QUEUED", |p| p["state"] == "QUEUED").await;
    assert_eq!(seen["place"], "position 1 in seats/A1", "{seen:#}");
    assert!(seen["until"].as_str().is_some_and(|u| u != "-"), "{seen:#}");
    assert!(
        seen["countdown"]
            .as_str()
            .is_some_and(|c| c.starts_with("59:") || c.starts_with("1:00:")),
        "{seen:#}"
    );
    let main = seen["main"].as_str().unwrap_or("");
    assert!(
        main.contains("wait ends in") && main.contains("queued: nothing is held"),
        "{seen:#}"
    );

    // Alice cancels: bob's page turns HELD live; carol moves up.
    grpc.cancel(keyed(Decide::on(&alice).cancel(), &cast.shop.key))
        .await
        .unwrap();
    let seen = until(&page, "bob HELD", |p| p["state"] == "HELD").await;
    assert_eq!(
        seen["place"],
        Value::Null,
        "no queue place once held: {seen:#}"
    );
    page.goto(&format!("{}/#/r/{}", app.base, carol.id))
        .await
        .unwrap();
    until(&page, "carol at the head", |p| {
        p["state"] == "QUEUED" && p["place"] == "position 1 in seats/A1"
    })
    .await;

    // Nobody waits for A2: said so.
    page.goto(&format!(
        "{}/#/queue?participant=seats&resource=A2",
        app.base
    ))
    .await
    .unwrap();
    until(&page, "A2's empty queue", |p| {
        p["queue"] == json!([["nobody is waiting"]]) && p["queue_length"] == "0"
    })
    .await;

    // At a phone's width the queue page scrolls down, not across.
    page.set_window_size(390, 844).await.unwrap();
    page.goto(&format!(
        "{}/#/queue?participant=seats&resource=A1",
        app.base
    ))
    .await
    .unwrap();
    until(&page, "A1's queue at a phone's width", |p| {
        p["queue"].as_array().is_some_and(|q| q.len() == 1)
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
        "the queue page is {wide} px too wide"
    );
    page.close().await.unwrap();
}
