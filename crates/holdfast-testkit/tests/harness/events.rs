//! The events of a harness (SPEC 10): `Harness::events` is the log so far, and the client's
//! `events` stream follows it live, resuming by itself across a coordinator restart - no event
//! twice, none left out.

use holdfast_testkit::client::{EventFilter, EventType};
use holdfast_testkit::{Harness, Kind};

use crate::{order, reserve};

#[tokio::test]
async fn the_harness_shows_its_events_and_a_client_stream_resumes_across_a_restart() {
    let mut harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1), ("A2", 1), ("A3", 1)])
        .start()
        .await
        .unwrap();
    let first = reserve(&harness, order("o-1", "seats", "A1")).await;
    let client = harness.client();
    client
        .confirm(first.reservation.id, &first.hold_token, None)
        .await
        .unwrap();
    let so_far = harness.events(0).await.unwrap();
    let types: Vec<EventType> = so_far.iter().map(|e| e.event_type).collect();
    assert_eq!(
        types,
        [
            EventType::Trying,
            EventType::Held,
            EventType::Confirming,
            EventType::Confirmed
        ]
    );
    assert!(
        so_far
            .iter()
            .all(|e| e.reservation.id == first.reservation.id)
    );
    let last = so_far[3].sequence;
    assert_eq!(client.latest_sequence().await.unwrap(), last);
    assert!(harness.events(last).await.unwrap().is_empty());
    assert_eq!(harness.events(so_far[1].sequence).await.unwrap().len(), 2);

    // A live stream, open across a restart: it goes on after the last event it gave.
    let mut live = client.events(last, EventFilter::default());
    let second = reserve(&harness, order("o-2", "seats", "A2")).await;
    let trying = live.next().await.unwrap().unwrap();
    let held = live.next().await.unwrap().unwrap();
    assert_eq!(
        (trying.event_type, held.event_type),
        (EventType::Trying, EventType::Held)
    );
    assert_eq!(held.reservation.id, second.reservation.id);
    harness.kill_coordinator();
    harness.restart().await.unwrap();
    let third = reserve(&harness, order("o-3", "seats", "A3")).await;
    let next = live.next().await.unwrap().unwrap();
    assert_eq!(
        (next.event_type, next.reservation.id),
        (EventType::Trying, third.reservation.id)
    );
    assert!(next.sequence > held.sequence);
    let everything = harness.events(0).await.unwrap();
    assert_eq!(everything.len(), 8);
    assert!(everything.windows(2).all(|w| w[0].sequence < w[1].sequence));
}
