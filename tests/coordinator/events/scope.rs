//! Who sees which events (SPEC 10): a client the events of the reservations it owns, an admin
//! everyone's (authentication on, API keys); a subscription ends with UNAVAILABLE when the
//! coordinator shuts down.

use holdfast::proto;
use holdfast::proto::event::Type;
use holdfast::proto::events_client::EventsClient;
use sqlx::PgPool;
use tonic::Code;

use super::{EventsApp, events_through, events_until, next, subscribe, type_of};
use crate::auth::{Cast, keyed, reserve_seat, secured_shop};
use crate::common::{settings, spawn_fakes};

#[sqlx::test(migrations = false)]
async fn a_client_sees_its_own_reservations_events_and_an_admin_everyones(pool: PgPool) {
    let cast = Cast::new();
    let (app, _seats) = secured_shop(pool, &cast).await;
    let events = EventsClient::connect(format!("http://{}", app.addr))
        .await
        .unwrap();
    let mut c = app.client.clone();
    let shops = c
        .reserve(keyed(reserve_seat("o-1", "alice", "A1"), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    let strangers = c
        .reserve(keyed(reserve_seat("o-2", "bob", "A2"), &cast.stranger.key))
        .await
        .unwrap()
        .into_inner();
    let mut admin = subscribe(&events, 0, None, Some(&cast.admin.key)).await;
    let mut all = events_until(&mut admin, &strangers.id, Type::ReservationHeld).await;
    if !all
        .iter()
        .any(|e| type_of(e) == Type::ReservationHeld && e.owner == "shop")
    {
        all.extend(events_until(&mut admin, &shops.id, Type::ReservationHeld).await);
    }
    let last = all.iter().map(|e| e.sequence).max().unwrap();
    for (who, key) in [("shop", &cast.shop.key), ("stranger", &cast.stranger.key)] {
        let mut own = subscribe(&events, 0, None, Some(key)).await;
        let got = events_through(&mut own, last).await;
        let expected: Vec<i64> = all
            .iter()
            .filter(|e| e.owner == who)
            .map(|e| e.sequence)
            .collect();
        assert!(!expected.is_empty());
        assert_eq!(
            got.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            expected,
            "{who}"
        );
        let latest = events
            .clone()
            .get_latest_sequence(keyed(proto::GetLatestSequenceRequest::default(), key))
            .await
            .unwrap()
            .into_inner();
        assert!(latest.sequence >= last);
    }
    // Without a key: refused, as every call is.
    let refused = events
        .clone()
        .subscribe(proto::SubscribeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    // The metrics role has no business here.
    let refused = events
        .clone()
        .subscribe(keyed(proto::SubscribeRequest::default(), &cast.scraper.key))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
}

#[sqlx::test(migrations = false)]
async fn a_subscription_ends_unavailable_when_the_coordinator_shuts_down(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let settings = settings(&[("seats", &fakes.get("seats").url)]);
    let mut app = EventsApp::start(settings, holdfast::store::PgStore::from_pool(pool)).await;
    let mut stream = subscribe(&app.events, 0, None, None).await;
    assert_eq!(type_of(&next(&mut stream).await), Type::Heartbeat);
    let stopping = tokio::spawn(async move { app.stop().await });
    let end = tokio::time::timeout(super::NEXT, stream.message())
        .await
        .expect("an answer within 10 s")
        .unwrap_err();
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert_eq!(crate::common::reason(&end), "SHUTTING_DOWN");
    tokio::time::timeout(super::NEXT, stopping)
        .await
        .expect("the coordinator stops within 10 s")
        .unwrap();
}
