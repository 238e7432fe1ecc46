//! The `holdfast-client` crate against a real coordinator: typed values both ways, reasons
//! parsed from ErrorInfo, Reserve retried with the same request_id while the coordinator is
//! down (one reservation made, not two), Watch as a Stream; and its dependency tree.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use holdfast::store::PgStore;
use holdfast_client::{
    BranchState, Client, HoldToken, ListFilter, Reason, Reserve, RetryPolicy, State,
};
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::common::{settings, spawn_fakes, spawn_with_fakes};

fn basket(request_id: &str) -> Reserve {
    Reserve::new(request_id, "alice")
        .hold(holdfast_client::Hold::new("seats", "A1"))
        .hold(holdfast_client::Hold::new("stock", "sku-1").quantity(2))
        .ttl(Duration::from_secs(60))
        .label("order", "o-1")
}

#[sqlx::test]
async fn the_lifecycle_with_typed_values(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    let client = Client::connect(format!("http://{}", app.addr))
        .await
        .unwrap();

    let held = client.reserve(basket("c-1")).await.unwrap();
    let r = &held.reservation;
    assert_eq!(r.state, State::Held);
    assert_eq!(r.branches.len(), 2);
    assert!(r.branches.iter().all(|b| b.state == BranchState::Held));
    assert_eq!(r.branches[1].hold.quantity, 2);
    assert_eq!(r.labels.get("order").map(String::as_str), Some("o-1"));
    let lifetime = r.expires_at.duration_since(r.created_at).unwrap();
    assert!(
        lifetime > Duration::from_secs(59) && lifetime <= Duration::from_secs(61),
        "{lifetime:?}"
    );
    assert!(!format!("{held:?}").contains(held.hold_token.expose()));

    // A repeat answers the same reservation (and token).
    let again = client.reserve(basket("c-1")).await.unwrap();
    assert_eq!(again.reservation.id, r.id);
    assert_eq!(again.hold_token, held.hold_token);

    let extended = client
        .extend(
            r.id,
            &held.hold_token,
            Some(Duration::from_secs(30)),
            Some("x-1"),
        )
        .await
        .unwrap();
    assert_eq!(extended.extensions_used, 1);
    assert_eq!(
        extended.expires_at.duration_since(r.expires_at).unwrap(),
        Duration::from_secs(30)
    );

    let mut watch = client.watch(r.id).await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap().state, State::Held);
    let confirmed = client.confirm(r.id, &held.hold_token, None).await.unwrap();
    assert_eq!(confirmed.state, State::Confirmed);
    let mut last = None;
    while let Some(next) = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch stream stalled")
    {
        last = Some(next.unwrap().state);
    }
    assert_eq!(last, Some(State::Confirmed));

    let page = client
        .list(ListFilter {
            holder: Some("alice".into()),
            state: Some(State::Confirmed),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.reservations.iter().map(|r| r.id).collect::<Vec<_>>(),
        [r.id]
    );
    assert_eq!(page.next_page_token, None);
    app.shut_down();
}

#[sqlx::test]
async fn errors_carry_their_reason_and_reservation(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    let client = Client::connect(format!("http://{}", app.addr))
        .await
        .unwrap();
    let held = client.reserve(basket("c-2")).await.unwrap();
    let id = held.reservation.id;

    let e = client
        .confirm(id, &HoldToken::new("hf1.wrong"), None)
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.reason()),
        (tonic::Code::PermissionDenied, &Reason::HoldTokenMismatch)
    );
    assert_eq!(e.reservation_id(), Some(id));

    let e = client.get(uuid::Uuid::new_v4()).await.unwrap_err();
    assert_eq!(*e.reason(), Reason::ReservationNotFound);

    client
        .cancel(id, &held.hold_token, Some("no longer needed"))
        .await
        .unwrap();
    let e = client
        .confirm(id, &held.hold_token, None)
        .await
        .unwrap_err();
    assert_eq!(*e.reason(), Reason::ReservationClosed);
    assert_eq!(e.reservation_id(), Some(id));

    fakes
        .get("stock")
        .behaviour
        .reject
        .store(true, Ordering::SeqCst);
    let e = client.reserve(basket("c-3")).await.unwrap_err();
    assert_eq!(*e.reason(), Reason::InsufficientCapacity);
    assert_eq!(
        e.metadata().get("participant").map(String::as_str),
        Some("stock")
    );
    let rejected = client
        .get(
            e.reservation_id()
                .expect("a recorded rejection names its reservation"),
        )
        .await
        .unwrap();
    assert_eq!(rejected.state, State::Rejected);
    assert_eq!(
        rejected.rejection.map(|r| r.participant).as_deref(),
        Some("stock")
    );

    let e = client
        .reserve(Reserve::new("c-4", "alice"))
        .await
        .unwrap_err();
    assert_eq!(*e.reason(), Reason::InvalidArgument);
    assert!(e.message().contains("holds"), "{}", e.message());
    app.shut_down();
}

/// The coordinator's port answers, but nobody serves gRPC on it: each connection is counted
/// and closed at once, as a coordinator restarting would look to a client.
async fn refusing(listener: TcpListener, seen: Arc<AtomicUsize>, notify: Arc<tokio::sync::Notify>) {
    while let Ok((socket, _)) = listener.accept().await {
        drop(socket);
        seen.fetch_add(1, Ordering::SeqCst);
        notify.notify_one();
    }
}

#[sqlx::test]
async fn reserve_is_retried_with_the_same_request_id_until_the_coordinator_is_back(pool: PgPool) {
    let fakes = spawn_fakes(&["seats", "stock"]).await;
    let down = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = down.local_addr().unwrap();
    let (seen, notify) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let refuser = tokio::spawn(refusing(down, seen.clone(), notify.clone()));
    let client = Client::builder(format!("http://{addr}"))
        .retry(RetryPolicy {
            max_retries: 50,
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
        })
        .connect()
        .await
        .unwrap();
    let reserve = tokio::spawn({
        let client = client.clone();
        async move { client.reserve(basket("c-retry")).await }
    });
    // Two refused attempts seen, then the coordinator comes up on the same port.
    tokio::time::timeout(Duration::from_secs(20), async {
        while seen.load(Ordering::SeqCst) < 2 {
            notify.notified().await;
        }
    })
    .await
    .expect("the client did not retry");
    refuser.abort();
    let _ = refuser.await;
    let listener = TcpListener::bind(addr).await.unwrap();
    let urls: Vec<(String, String)> = ["seats", "stock"]
        .iter()
        .map(|n| (n.to_string(), fakes.get(n).url.clone()))
        .collect();
    let pairs: Vec<(&str, &str)> = urls.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(holdfast::app::serve_coordinator(
        settings(&pairs),
        store,
        listener,
        async {
            let _ = rx.await;
        },
    ));
    let held = tokio::time::timeout(Duration::from_secs(20), reserve)
        .await
        .expect("Reserve did not complete once the coordinator was back")
        .unwrap()
        .unwrap();
    assert_eq!(held.reservation.state, State::Held);
    let all = client.list(ListFilter::default()).await.unwrap();
    assert_eq!(
        all.reservations.len(),
        1,
        "one reservation, however many attempts"
    );

    // An answer about the reservation itself is never retried.
    fakes
        .get("seats")
        .behaviour
        .reject
        .store(true, Ordering::SeqCst);
    let e = client.reserve(basket("c-rejected")).await.unwrap_err();
    assert_eq!(*e.reason(), Reason::InsufficientCapacity);
    assert_eq!(
        fakes.log.count("seats", "Try"),
        2,
        "{:?}",
        fakes.log.summary()
    );
    let _ = tx.send(());
}

#[test]
fn the_client_crate_pulls_no_database_redis_or_telemetry_sdk() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            "holdfast-client",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"tonic"), "{tree}");
    for banned in [
        "sqlx",
        "redis",
        "opentelemetry",
        "opentelemetry_sdk",
        "holdfast",
    ] {
        assert!(
            !crates.contains(&banned),
            "{banned} in holdfast-client's tree:\n{tree}"
        );
    }
}
