//! PostgreSQL: two coordinator replicas on one database take Reserves and Cancels from many
//! concurrent clients while a transaction that wrote an event stays open on the side. A
//! Subscribe stream on one replica receives every event of the log exactly once, in sequence
//! order: the open transaction's event, committed last, is not skipped, and nothing committed
//! meanwhile is lost or repeated.

use std::collections::BTreeSet;

use futures_util::future::join_all;
use holdfast::proto;
use holdfast::proto::event::Type;
use holdfast::store::PgStore;
use sqlx::PgPool;

use super::{EventsApp, next, subscribe, type_of};
use crate::common::{Decide, hold, reserve_request, settings, spawn_fakes};

/// Clients per replica, and the Reserve + Cancel pairs each makes.
const CLIENTS: usize = 8;
const PAIRS: usize = 4;

async fn reserve_and_cancel(app: &EventsApp, client: String) {
    let mut c = app.coordinator.clone();
    for i in 0..PAIRS {
        let mut request = reserve_request(&format!("{client}-{i}"), vec![hold("seats", "A1")]);
        request.holder = client.clone();
        let held = c.reserve(request).await.unwrap().into_inner();
        c.cancel(Decide::on(&held).cancel()).await.unwrap();
    }
}

#[sqlx::test(migrations = false)]
async fn two_replicas_and_a_transaction_held_open_neither_skip_nor_repeat(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let configured = || settings(&[("seats", &fakes.get("seats").url)]);
    let replicas = [
        EventsApp::start(configured(), PgStore::from_pool(pool.clone())).await,
        EventsApp::start(configured(), PgStore::from_pool(pool.clone())).await,
    ];
    let mut first = replicas[0].coordinator.clone();
    let slow = first
        .reserve(reserve_request("slow", vec![hold("seats", "S1")]))
        .await
        .unwrap()
        .into_inner();
    let mut stream = subscribe(&replicas[1].events, 0, None, None).await;

    let mut open = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE reservations SET extensions_used = extensions_used + 1 WHERE id = $1::uuid",
    )
    .bind(&slow.id)
    .execute(&mut *open)
    .await
    .unwrap();
    let clients = replicas.iter().enumerate().flat_map(|(r, app)| {
        (0..CLIENTS).map(move |c| reserve_and_cancel(app, format!("r{r}-c{c}")))
    });
    join_all(clients).await;
    open.commit().await.unwrap();

    // slow: TRYING, HELD, EXTENDED; each pair: TRYING, HELD, CANCELLING, CANCELLED.
    let expected = 3 + 2 * CLIENTS * PAIRS * 4;
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(logged as usize, expected, "the log holds every change");
    let mut received: Vec<proto::Event> = Vec::new();
    while received.len() < expected {
        let event = next(&mut stream).await;
        if type_of(&event) != Type::Heartbeat {
            received.push(event);
        }
    }
    for pair in received.windows(2) {
        assert!(
            pair[1].sequence > pair[0].sequence,
            "out of order or repeated"
        );
    }
    let ids: BTreeSet<&str> = received.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), expected, "an event twice");
    let stored: Vec<String> = sqlx::query_scalar("SELECT event_id::text FROM events")
        .fetch_all(&pool)
        .await
        .unwrap();
    let stored: BTreeSet<&str> = stored.iter().map(String::as_str).collect();
    assert_eq!(ids, stored, "the stream is the log");
    let extended = received
        .iter()
        .filter(|e| type_of(e) == Type::ReservationExtended)
        .count();
    assert_eq!(extended, 1, "the open transaction's event arrived once");
}
