//! The real coordinator served over gRPC on a SQLite store, with the coordinator suite's
//! in-test participants: Reserve -> Confirm, Cancel, a rejection, and expiry by the reaper.

// The coordinator suite's helpers; this test uses a few of them (and none of the relay).
#[allow(dead_code, unused_imports)]
#[path = "../coordinator/common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast::app;
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use tokio::net::TcpListener;

use common::{Decide, hold, reason, reserve_request, settings, spawn_fakes, state_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_on_sqlite() {
    let db = crate::TempDb::fresh();
    let fakes = spawn_fakes(&["rooms", "seats"]).await;
    let (rooms, seats) = (
        fakes.get("rooms").url.clone(),
        fakes.get("seats").url.clone(),
    );
    let settings = settings(&[("rooms", &rooms), ("seats", &seats)]);
    let store = db.store().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app::serve_coordinator(settings, store, listener, async {
        let _ = stopped.await;
    }));
    let mut client = CoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    // Reserve -> HELD -> Confirm -> CONFIRMED, every branch confirmed at its participant.
    let r = client
        .reserve(reserve_request(
            "r1",
            vec![hold("seats", "A1"), hold("rooms", "r1")],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Held);
    let confirmed = client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);
    assert_eq!(fakes.get("seats").effects().0, 1);
    assert_eq!(fakes.get("rooms").effects().0, 1);

    // Cancel -> CANCELLED.
    let c = client
        .reserve(reserve_request("r2", vec![hold("seats", "A2")]))
        .await
        .unwrap()
        .into_inner();
    let cancelled = client
        .cancel(Decide::on(&c).cancel())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&cancelled), State::Cancelled);

    // A refusal: REJECTED, readable, nothing left held.
    fakes
        .get("rooms")
        .behaviour
        .reject
        .store(true, Ordering::SeqCst);
    let err = client
        .reserve(reserve_request(
            "r3",
            vec![hold("rooms", "r9"), hold("seats", "A3")],
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "INSUFFICIENT_CAPACITY");
    fakes
        .get("rooms")
        .behaviour
        .reject
        .store(false, Ordering::SeqCst);

    // Expiry: the reaper releases a lapsed hold by itself.
    let mut short = reserve_request("r4", vec![hold("seats", "A4")]);
    short.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let e = client.reserve(short).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: e.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if state_of(&now) == State::Expired && fakes.get("seats").effects().1 >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reaped: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fakes.get("seats").held().is_empty());
    assert!(fakes.get("rooms").held().is_empty());

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// #15 item 10 on SQLite: a `during` no store may hold (5000 BC fits SQLite's integers, not
/// PostgreSQL's timestamptz, nor a google.protobuf.Timestamp) is INVALID_ARGUMENT naming the
/// field on either backend, with nothing written and no participant called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_during_out_of_range_is_invalid_argument_on_sqlite() {
    let db = crate::TempDb::fresh();
    let fakes = spawn_fakes(&["rooms"]).await;
    let rooms = fakes.get("rooms").url.clone();
    let store = db.store().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app::serve_coordinator(
        settings(&[("rooms", &rooms)]),
        store,
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let mut client = CoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let start = (-5000 - 1970) * 31_556_952;
    let mut req = reserve_request("bc", vec![hold("rooms", "R1")]);
    req.holds[0].during = Some(proto::Interval {
        start: Some(prost_types::Timestamp {
            seconds: start,
            nanos: 0,
        }),
        end: Some(prost_types::Timestamp {
            seconds: start + 3600,
            nanos: 0,
        }),
    });
    let err = client.reserve(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .starts_with("holds[0].during.start is out of range"),
        "{}",
        err.message()
    );
    assert!(fakes.log.calls().is_empty(), "no participant called");
    let reader = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&reader)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing written");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
