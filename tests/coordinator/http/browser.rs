//! The console in a real browser: headless Chromium driven over WebDriver (chromedriver, started
//! by the test on a free port; `.ci/run` installs `chromium` and `chromium-driver`), against a
//! coordinator with authentication on. The page asks for a key; a reservation made over gRPC
//! appears in its table; its page counts down and turns EXPIRED live when the hold lapses (the
//! Watch stream); a ForceCancel through the button (reason, then confirmation) lands with its
//! audit entry; no hold token is ever in the page. The screenshot is the README's
//! (`docs/console.png`, rewritten with `HOLDFAST_UPDATE_SCREENSHOT=1`). The live events page shows
//! the recent events, then each new one as it happens. Every wait is for a DOM change, with a deadline that fails with what
//! the page showed last.

use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use holdfast::proto;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::process::{Child, Command};

use super::{HttpApp, spawn_http};
use crate::auth::{Cast, keyed, reserve_seat, secured_settings};
use crate::common::{proto_duration, spawn_fakes};

/// chromedriver on a free loopback port, killed when dropped.
pub(super) struct Driver {
    _child: Child,
    url: String,
}

pub(super) async fn start_driver() -> Driver {
    let port = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver (apt-get install chromium chromium-driver; .ci/run does)");
    // Ready once it accepts connections.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "chromedriver not listening: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Driver {
        _child: child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

pub(super) async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    let mut chrome = json!({
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1100", "--force-device-scale-factor=1"],
    });
    if std::path::Path::new("/usr/bin/chromium").exists() {
        chrome["binary"] = json!("/usr/bin/chromium");
    }
    caps.insert("goog:chromeOptions".into(), chrome);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session")
}

/// Types `key` into the console's key panel and sends it.
pub(super) async fn sign_in(page: &Client, key: &str) {
    page.find(Locator::Id("key-input"))
        .await
        .unwrap()
        .send_keys(key)
        .await
        .unwrap();
    page.find(Locator::Css("#key-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// What the page shows, read in one script: the view's state badge, countdown, live marker,
/// table rows, audit entries, key panel, flash message.
const LOOK: &str = r#"
const q = (s) => document.querySelector(s);
return {
  state: q('#state') ? q('#state').dataset.state || null : null,
  countdown: q('#countdown') ? q('#countdown').textContent : null,
  live: q('#live') ? q('#live').textContent : null,
  rows: Array.from(document.querySelectorAll('tr[data-id]')).map((r) => r.dataset.id),
  audit: Array.from(document.querySelectorAll('.audit-entry')).map((e) => e.textContent),
  asks_key: !q('#key-panel').classList.contains('hidden'),
  flash: q('#flash').classList.contains('hidden') ? null : q('#flash').textContent,
  confirming: Array.from(document.querySelectorAll('.confirm-box:not(.hidden)')).map((b) => b.textContent),
  main: q('#main').innerText.slice(0, 400),
};
"#;

/// Waits until `done` holds for what `script` (a DOM reading that returns an object) reads off
/// the page, polling; fails after `within` with the last reading. Every console test waits
/// through this.
pub(super) async fn until_shows(
    page: &Client,
    script: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let seen = page.execute(script, vec![]).await.unwrap();
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; the page last showed {seen:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`until_shows`] with this page's [`LOOK`].
async fn until(
    page: &Client,
    within: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    until_shows(page, LOOK, within, what, done).await
}

/// Asserts the page's HTML holds none of `tokens`.
async fn no_token(page: &Client, tokens: &[String]) {
    let html = page.source().await.unwrap();
    for t in tokens {
        assert!(!html.contains(t.as_str()), "a hold token in the page");
    }
}

async fn reserve(
    app: &HttpApp,
    key: &str,
    id: &str,
    seat: &str,
    ttl: Duration,
) -> proto::Reservation {
    let mut request = reserve_seat(id, "alice", seat);
    request.ttl = Some(proto_duration(ttl));
    app.grpc
        .clone()
        .reserve(keyed(request, key))
        .await
        .unwrap()
        .into_inner()
}

/// A live reservation's page, from the top: the README's picture (`docs/console.png`) when
/// `HOLDFAST_UPDATE_SCREENSHOT=1`, else a file under `target/` (a test run leaves the
/// checkout as it found it).
async fn screenshot(page: &Client) {
    page.execute("window.scrollTo(0, 0); return null;", vec![])
        .await
        .unwrap();
    let png = page.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG screenshot");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = if std::env::var_os("HOLDFAST_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        root.join("docs/console.png")
    } else {
        root.join("target/console.png")
    };
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, png).unwrap();
}

#[sqlx::test]
async fn the_console_in_a_real_browser(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let driver = start_driver().await;
    let page = browser(&driver).await;
    let mut tokens = Vec::new();

    // A reservation to cancel by hand, made before the page opens.
    let later = reserve(
        &app,
        &cast.shop.key,
        "later",
        "B7",
        Duration::from_secs(600),
    )
    .await;
    tokens.push(later.hold_token.clone());

    // The console asks for a key before it shows anything.
    page.goto(&format!("{}/#/reservations", app.base))
        .await
        .unwrap();
    until(&page, Duration::from_secs(10), "the key panel", |p| {
        p["asks_key"] == true
    })
    .await;
    sign_in(&page, &cast.admin.key).await;
    until(
        &page,
        Duration::from_secs(10),
        "the table with the first reservation",
        |p| {
            p["rows"]
                .as_array()
                .is_some_and(|r| r.contains(&json!(later.id)))
        },
    )
    .await;

    // A reservation made over gRPC now appears (the table refreshes itself).
    let soon = reserve(&app, &cast.shop.key, "soon", "A1", Duration::from_secs(8)).await;
    tokens.push(soon.hold_token.clone());
    until(
        &page,
        Duration::from_secs(10),
        "the new reservation in the table",
        |p| {
            p["rows"]
                .as_array()
                .is_some_and(|r| r.contains(&json!(soon.id)))
        },
    )
    .await;
    no_token(&page, &tokens).await;

    // Its page: HELD, a countdown that moves, live; then EXPIRED when the hold lapses.
    page.find(Locator::Css(&format!("tr[data-id='{}'] a", soon.id)))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let first = until(
        &page,
        Duration::from_secs(10),
        "the reservation page, live",
        |p| p["state"] == "HELD" && p["live"] == "live",
    )
    .await;
    let shown = first["countdown"].clone();
    until(&page, Duration::from_secs(5), "the countdown moving", |p| {
        p["countdown"] != shown && p["state"] == "HELD"
    })
    .await;
    screenshot(&page).await;
    until(&page, Duration::from_secs(30), "EXPIRED, live", |p| {
        p["state"] == "EXPIRED"
    })
    .await;
    no_token(&page, &tokens).await;

    // ForceCancel the other one through the button: a reason, then the confirmation.
    page.goto(&format!("{}/#/r/{}", app.base, later.id))
        .await
        .unwrap();
    until(
        &page,
        Duration::from_secs(10),
        "the second reservation's page",
        |p| p["state"] == "HELD",
    )
    .await;
    let form = "form[data-action='Force cancel']";
    page.find(Locator::Css(&format!("{form} textarea")))
        .await
        .unwrap()
        .send_keys("customer called support")
        .await
        .unwrap();
    page.find(Locator::Css(&format!("{form} button[type=submit]")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // Nothing happens before the confirmation.
    let asked = until(&page, Duration::from_secs(5), "the confirmation", |p| {
        p["confirming"][0]
            .as_str()
            .is_some_and(|m| m.contains("Yes, force cancel"))
    })
    .await;
    assert_eq!(
        asked["state"], "HELD",
        "cancelled before confirming: {asked:#}"
    );
    page.find(Locator::Css(&format!("{form} button.confirm")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let cancelled = until(
        &page,
        Duration::from_secs(20),
        "cancelled with its audit entry",
        |p| {
            ["CANCELLING", "CANCELLED"].contains(&p["state"].as_str().unwrap_or(""))
                && p["audit"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|e| e.as_str().unwrap_or("").contains("customer called support"))
                })
        },
    )
    .await;
    assert!(
        cancelled["audit"][0].as_str().unwrap().contains("ops"),
        "the audit names the principal: {cancelled:#}"
    );
    no_token(&page, &tokens).await;

    page.close().await.unwrap();
}

/// The live events page's rows, newest first: (type, reservation id), and its live marker.
const LOOK_EVENTS: &str = r#"
const q = (s) => document.querySelector(s);
return {
  live: q('#events-live') ? q('#events-live').textContent : null,
  events: Array.from(document.querySelectorAll('tr.event')).map((r) => [r.dataset.type, r.dataset.reservation]),
  asks_key: !q('#key-panel').classList.contains('hidden'),
};
"#;

/// Waits until `done` holds for the events page.
async fn until_events(page: &Client, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    until_shows(page, LOOK_EVENTS, Duration::from_secs(15), what, done).await
}

#[sqlx::test]
async fn the_console_shows_the_live_event_feed(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = Cast::new();
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let before = reserve(&app, &cast.shop.key, "ev-1", "A1", Duration::from_secs(600)).await;
    let driver = start_driver().await;
    let page = browser(&driver).await;
    page.goto(&format!("{}/#/events", app.base)).await.unwrap();
    until_events(&page, "the key panel", |p| p["asks_key"] == true).await;
    sign_in(&page, &cast.admin.key).await;
    // The recent past first: the earlier reservation's events, newest on top.
    let shown = until_events(&page, "the earlier events, live", |p| {
        p["live"] == "live" && p["events"].as_array().is_some_and(|e| e.len() >= 2)
    })
    .await;
    assert_eq!(
        shown["events"][0],
        json!(["RESERVATION_HELD", before.id]),
        "{shown:#}"
    );
    // Then each change as it happens.
    let after = reserve(&app, &cast.shop.key, "ev-2", "A2", Duration::from_secs(600)).await;
    let shown = until_events(&page, "the new reservation's events", |p| {
        p["events"][0] == json!(["RESERVATION_HELD", after.id])
    })
    .await;
    assert_eq!(shown["events"][1], json!(["RESERVATION_TRYING", after.id]));
    page.close().await.unwrap();
}
