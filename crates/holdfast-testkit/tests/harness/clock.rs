//! `advance` and `expire_now`: expiry, the reaper and orphan reclaim read the moved clock.

use std::time::{Duration, Instant};

use holdfast_testkit::client::State;
use holdfast_testkit::{Harness, Kind};

use crate::{order, reserve};

#[tokio::test]
async fn advance_expires_a_ten_minute_hold_without_waiting() {
    let started = Instant::now();
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .start()
        .await
        .unwrap();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    let early = harness.advance(Duration::from_secs(599)).await.unwrap();
    assert_eq!(early.expired, 0);
    let read = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(read.state, State::Held);

    let advanced = harness.advance(Duration::from_secs(2)).await.unwrap();
    assert_eq!(advanced.expired, 1);
    assert!(advanced.offset >= Duration::from_secs(601));
    let read = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(read.state, State::Expired);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().available, 1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn expire_now_releases_one_reservation() {
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1), ("A2", 1)])
        .start()
        .await
        .unwrap();
    let one = reserve(&harness, order("o-1", "seats", "A1")).await;
    let other = reserve(&harness, order("o-2", "seats", "A2")).await;
    let expired = harness.expire_now(one.reservation.id).await.unwrap();
    assert_eq!(expired.state, State::Expired);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().available, 1);
    let read = harness.client().get(other.reservation.id).await.unwrap();
    assert_eq!(read.state, State::Held);
}

#[tokio::test]
async fn orphan_reclaim_reads_the_moved_clock() {
    let grace = Duration::from_secs(3600);
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .orphan_grace(grace)
        .start()
        .await
        .unwrap();
    reserve(&harness, order("o-1", "seats", "A1")).await;
    // The coordinator cannot release it: only the participant's own reclaim can.
    harness.cut("seats").await.unwrap();
    harness
        .advance(Duration::from_secs(600) + grace / 2)
        .await
        .unwrap();
    assert_eq!(harness.resource("seats", "A1").await.unwrap().available, 0);
    let advanced = harness.advance(grace).await.unwrap();
    assert_eq!(advanced.reclaimed, 1, "{advanced:?}");
    assert_eq!(harness.resource("seats", "A1").await.unwrap().available, 1);
}
