//! The testkit against itself: a real coordinator, real reference participants and fakes on
//! loopback ports, a temporary SQLite folder (or PostgreSQL when `DATABASE_URL` is set).

mod auth;
mod clock;
mod dependencies;
mod events;
mod fakes;
mod files;
mod network;
mod postgres;
mod restart;
mod tls;

use std::time::Duration;

use holdfast_testkit::client::{Hold, Reserve, Reserved};
use holdfast_testkit::{Call, Harness};

/// A reservation of `resource` at `participant` for ten minutes.
pub fn order(request_id: &str, participant: &str, resource: &str) -> Reserve {
    Reserve::new(request_id, "alice")
        .hold(Hold::new(participant, resource))
        .ttl(Duration::from_secs(600))
}

pub async fn reserve(harness: &Harness, request: Reserve) -> Reserved {
    harness.client().reserve(request).await.unwrap()
}

/// Waits (polling, with a deadline) until `done` holds for the calls of fake `name`.
pub async fn until_calls(harness: &Harness, name: &str, done: impl Fn(&[Call]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let calls = harness.fake(name).unwrap().calls();
        if done(&calls) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fake {name} never got there; its calls: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
