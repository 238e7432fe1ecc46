//! WatchReservation bounded and shared (#15 item 12): streams beyond the caps (per process,
//! per connection) are refused with RESOURCE_EXHAUSTED and a closed stream frees its slot; a
//! change made by another replica reaches a watcher promptly through one shared poller, not a
//! read per stream; a watcher attached while a Reserve is trying sees it end `REJECTED`.
//! (SIGTERM with a Watch open: `process/shutdown.rs`.)

use std::time::{Duration, Instant};

use holdfast::app::CoordinatorSettings;
use holdfast::coordinator::WatchLimits;
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::common::{
    Decide, error_metadata, hold, reason, reserve_request, settings, spawn_app, spawn_fakes,
    state_of,
};

fn with_watch(mut s: CoordinatorSettings, watch: WatchLimits) -> CoordinatorSettings {
    s.policy.watch = watch;
    s
}

/// `n` HELD reservations, each of its own holder (the hold limit is per holder).
async fn reserve_n(client: &mut CoordinatorClient<Channel>, n: usize) -> Vec<proto::Reservation> {
    let mut out = Vec::new();
    for i in 0..n {
        let mut req = reserve_request(&format!("w{i}"), vec![hold("seats", &format!("S{i}"))]);
        req.holder = format!("holder-{i}");
        let r = client.reserve(req).await.unwrap().into_inner();
        assert_eq!(state_of(&r), State::Held);
        out.push(r);
    }
    out
}

/// Opens a watch and reads its first image.
async fn watch(
    client: &mut CoordinatorClient<Channel>,
    r: &proto::Reservation,
) -> Result<Streaming<proto::Reservation>, Status> {
    let mut stream = client
        .watch_reservation(proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await?
        .into_inner();
    let first = stream.message().await?.expect("a first image");
    assert_eq!(first.id, r.id);
    Ok(stream)
}

fn assert_watch_limit(err: &Status, scope: &str) {
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(reason(err), "WATCH_LIMIT_EXCEEDED");
    assert_eq!(error_metadata(err)["scope"], scope, "{err:?}");
}

#[sqlx::test(migrations = false)]
async fn watches_beyond_the_caps_are_refused_and_a_closed_stream_frees_its_slot(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let s = with_watch(
        settings(&[("seats", &fakes.get("seats").url)]),
        WatchLimits {
            per_process: 3,
            per_connection: 2,
            per_principal: 256,
            poll: Duration::from_millis(250),
        },
    );
    let app = spawn_app(pool, s).await;
    // One client connection (clones of a channel share it), and another.
    let mut a = app.client.clone();
    let mut b = CoordinatorClient::connect(format!("http://{}", app.addr))
        .await
        .unwrap();
    let rs = reserve_n(&mut a, 4).await;

    let a0 = watch(&mut a, &rs[0]).await.unwrap();
    let mut a1 = watch(&mut a, &rs[1]).await.unwrap();
    let err = watch(&mut a, &rs[2]).await.unwrap_err();
    assert_watch_limit(&err, "connection");
    let _b2 = watch(&mut b, &rs[2]).await.unwrap();
    let err = watch(&mut b, &rs[3]).await.unwrap_err();
    assert_watch_limit(&err, "process");

    // A stream its client closed gives its slot back (once the server saw it go).
    drop(a0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let _b3 = loop {
        match watch(&mut b, &rs[3]).await {
            Ok(stream) => break stream,
            Err(e) => {
                assert_watch_limit(&e, "process");
                assert!(
                    Instant::now() < deadline,
                    "the closed stream's slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // So does a stream that ended after a terminal state.
    a.confirm(Decide::on(&rs[1]).confirm()).await.unwrap();
    while let Some(m) = a1.message().await.unwrap() {
        assert_ne!(state_of(&m), State::Held);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let _a4 = loop {
        match watch(&mut a, &rs[0]).await {
            Ok(stream) => break stream,
            Err(e) => {
                assert_watch_limit(&e, "process");
                assert!(
                    Instant::now() < deadline,
                    "the ended stream's slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
}

/// Events/Subscribe streams take slots under the same caps: with room for two streams per
/// connection, a Watch and a Subscribe fill one connection and a second Subscribe is refused
/// naming the cap; once the Watch is closed, the Subscribe is admitted.
#[sqlx::test(migrations = false)]
async fn subscriptions_share_the_stream_caps_with_watches(pool: PgPool) {
    use holdfast::proto::events_client::EventsClient;
    let fakes = spawn_fakes(&["seats"]).await;
    let s = with_watch(
        settings(&[("seats", &fakes.get("seats").url)]),
        WatchLimits {
            per_process: 100,
            per_connection: 2,
            per_principal: 256,
            poll: Duration::from_millis(250),
        },
    );
    let app = spawn_app(pool, s).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = CoordinatorClient::new(channel.clone());
    let mut events = EventsClient::new(channel);
    let rs = reserve_n(&mut client, 1).await;
    let subscribe = |events: &mut EventsClient<Channel>| {
        let mut events = events.clone();
        async move {
            events
                .subscribe(proto::SubscribeRequest::default())
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let watched = watch(&mut client, &rs[0]).await.unwrap();
    let _first = subscribe(&mut events).await.unwrap();
    let err = subscribe(&mut events).await.unwrap_err();
    assert_watch_limit(&err, "connection");
    assert!(err.message().contains("Events/Subscribe"), "{err:?}");

    drop(watched);
    let deadline = Instant::now() + Duration::from_secs(5);
    let _second = loop {
        match subscribe(&mut events).await {
            Ok(stream) => break stream,
            Err(e) => {
                assert_watch_limit(&e, "connection");
                assert!(
                    Instant::now() < deadline,
                    "the closed watch's slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
}

/// Transactions committed in this test's database so far (PostgreSQL's statistics: each
/// backend reports at most once a second).
async fn commits(pool: &PgPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    n
}

#[sqlx::test(migrations = false)]
async fn a_change_made_by_another_replica_reaches_watchers_through_one_shared_poll(pool: PgPool) {
    const WATCHERS: usize = 100;
    let fakes = spawn_fakes(&["seats"]).await;
    let s = with_watch(
        settings(&[("seats", &fakes.get("seats").url)]),
        WatchLimits {
            per_process: 1000,
            per_connection: 1000,
            per_principal: 1000,
            poll: Duration::from_millis(100),
        },
    );
    let mut a = spawn_app(pool.clone(), s.clone()).await;
    let mut b = spawn_app(pool.clone(), s).await;
    let rs = reserve_n(&mut a.client, WATCHERS).await;
    let mut streams = Vec::new();
    for r in &rs {
        streams.push(watch(&mut a.client, r).await.unwrap());
    }

    // Idle, a hundred watchers cost this process a read per poll, not a read per stream per
    // poll: measured as the transactions the database committed meanwhile (both replicas'
    // recovery sweeps included).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = commits(&pool).await;
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    let during = commits(&pool).await - before;
    eprintln!("{during} transactions in {window:?} with {WATCHERS} watchers");
    // A read per watcher per second alone would be 500.
    assert!(during < 250, "{during} transactions in {window:?}");

    // Replica B confirms; A's watcher hears of it at A's next poll.
    let started = Instant::now();
    b.client
        .confirm(Decide::on(&rs[0]).confirm())
        .await
        .unwrap();
    let mut last = State::Held;
    let stream = &mut streams[0];
    tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(m) = stream.message().await.unwrap() {
            last = state_of(&m);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the watcher on A did not see B's confirm; last {last:?}"));
    assert_eq!(last, State::Confirmed);
    eprintln!("B's confirm reached A's watcher in {:?}", started.elapsed());
    a.shut_down();
    b.shut_down();
}

/// A watcher attached while a Reserve is still trying sees `TRYING`, then `REJECTED` when the
/// participant refuses, and the stream ends there. The stock participant's Try waits for the
/// item's row lock, taken here; the units go while it waits, so it is refused when it gets it.
#[sqlx::test(migrations = false)]
async fn a_watcher_sees_trying_then_rejected(pool: PgPool) {
    use crate::real::{PATIENCE, hold as real_hold, reserve, spawn_stack};
    use holdfast::participants::Kind::Stock;

    let stack = spawn_stack(pool.clone()).await;
    stack.put(Stock, &[("sku-w", 1)]).await;
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM stock_item WHERE resource = 'sku-w' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let reserving = {
        let mut client = stack.new_client().await;
        let req = reserve("r1", "watched", None, vec![real_hold(Stock, "sku-w", 1)]);
        tokio::spawn(async move { client.reserve(req).await })
    };
    // The Reserve is recorded TRYING and its Try waits for the lock.
    let mut client = stack.client();
    let deadline = Instant::now() + PATIENCE;
    let trying = loop {
        let page = client
            .list_reservations(proto::ListReservationsRequest {
                holder: "watched".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let waits: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if let Some(r) = page.reservations.into_iter().next()
            && waits > 0
        {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the Try never waited for the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stream = client
        .watch_reservation(proto::WatchReservationRequest {
            reservation_id: trying.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first image");
    assert_eq!(state_of(&first), State::Trying);

    sqlx::query("UPDATE stock_item SET available = 0 WHERE resource = 'sku-w'")
        .execute(&mut *lock)
        .await
        .unwrap();
    lock.commit().await.unwrap();
    let err = reserving.await.unwrap().unwrap_err();
    assert_eq!(reason(&err), "INSUFFICIENT_CAPACITY", "{err:?}");
    let mut seen = vec![];
    while let Some(msg) = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("the watch ends after the terminal state")
        .unwrap()
    {
        seen.push(state_of(&msg));
    }
    assert_eq!(seen, [State::Rejected], "after TRYING");
}

/// A watch of `r` asked with `key`, its first image read.
async fn watch_as(
    client: &mut CoordinatorClient<Channel>,
    r: &proto::Reservation,
    key: &str,
) -> Result<Streaming<proto::Reservation>, Status> {
    let request = crate::auth::keyed(
        proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        },
        key,
    );
    let mut stream = client.watch_reservation(request).await?.into_inner();
    let first = stream.message().await?.expect("a first image");
    assert_eq!(first.id, r.id);
    Ok(stream)
}

/// A fresh connection to the coordinator at `app`.
async fn connect(app: &crate::common::TestApp) -> CoordinatorClient<Channel> {
    CoordinatorClient::connect(format!("http://{}", app.addr))
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn one_principal_cannot_take_every_watch_over_any_number_of_connections(pool: PgPool) {
    const PER_PRINCIPAL: usize = 3;
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = crate::auth::Cast::new();
    let s = with_watch(
        crate::auth::secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
        WatchLimits {
            per_process: 100,
            per_connection: 100,
            per_principal: PER_PRINCIPAL,
            poll: Duration::from_millis(250),
        },
    );
    let app = spawn_app(pool, s).await;
    let (shop, stranger) = (cast.shop.key.as_str(), cast.stranger.key.as_str());
    let mut mine = Vec::new();
    for i in 0..=PER_PRINCIPAL {
        let mut client = connect(&app).await;
        let request =
            crate::auth::reserve_seat(&format!("p{i}"), &format!("h{i}"), &format!("S{i}"));
        let r = client
            .reserve(crate::auth::keyed(request, shop))
            .await
            .unwrap();
        mine.push(r.into_inner());
    }
    let mut client = connect(&app).await;
    let request = crate::auth::reserve_seat("theirs", "them", "T1");
    let theirs = client
        .reserve(crate::auth::keyed(request, stranger))
        .await
        .unwrap()
        .into_inner();

    // The cap, each stream on a connection of its own: the next one is refused, naming it.
    let mut open = Vec::new();
    for r in &mine[..PER_PRINCIPAL] {
        open.push(watch_as(&mut connect(&app).await, r, shop).await.unwrap());
    }
    let err = watch_as(&mut connect(&app).await, &mine[PER_PRINCIPAL], shop)
        .await
        .unwrap_err();
    assert_watch_limit(&err, "principal");
    assert_eq!(error_metadata(&err)["limit"], PER_PRINCIPAL.to_string());
    assert!(
        err.message().contains("--max-watches-per-principal"),
        "{err:?}"
    );
    // Another principal still watches.
    let _theirs = watch_as(&mut connect(&app).await, &theirs, stranger)
        .await
        .unwrap();
    // A stream closed gives the principal its place back (once the server saw it go).
    open.pop();
    let deadline = Instant::now() + Duration::from_secs(5);
    let _again = loop {
        match watch_as(&mut connect(&app).await, &mine[PER_PRINCIPAL], shop).await {
            Ok(stream) => break stream,
            Err(e) => {
                assert_watch_limit(&e, "principal");
                assert!(
                    Instant::now() < deadline,
                    "the closed stream's place never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
}
