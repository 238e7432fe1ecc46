//! A paid checkout tested against holdfast's reference participants (`seats`, `payments`)
//! in-process, on a temporary SQLite folder: feature `reference-participants`. Run:
//! `cargo test -p holdfast-testkit --features reference-participants --example reference_participants`.

use std::time::Duration;

use holdfast_testkit::client::{Hold, Reason, Reserve, State};
use holdfast_testkit::{Harness, Kind};

const PRICE: i64 = 4_200;

async fn box_office() -> Harness {
    Harness::builder()
        .participants([Kind::Seats, Kind::Payments])
        .resources("seats", [("A1", 1)])
        .resources("payments", [("card-alice", 10_000)]) // an account and its balance
        .start()
        .await
        .expect("the harness starts")
}

fn order(id: &str) -> Reserve {
    Reserve::new(id, "alice")
        .hold(Hold::new("seats", "A1"))
        .ttl(Duration::from_secs(600))
}

async fn a_paid_order_is_confirmed_and_the_seat_sold() {
    let harness = box_office().await;
    let client = harness.client();
    let held = client.reserve(order("order-1")).await.unwrap();
    let id = held.reservation.id;

    let paid = harness
        .charge("card-alice", id, PRICE, "EUR")
        .await
        .unwrap();
    let confirmed = client
        .confirm(id, &held.hold_token, Some(paid))
        .await
        .unwrap();

    assert_eq!(confirmed.state, State::Confirmed);
    let seat = harness.resource("seats", "A1").await.unwrap();
    assert_eq!((seat.confirmed, seat.available), (1, 0));
}

async fn an_unpaid_hold_expires_and_frees_the_seat() {
    let harness = box_office().await;
    let client = harness.client();
    let held = client.reserve(order("order-1")).await.unwrap();
    assert_eq!(
        *client.reserve(order("order-2")).await.unwrap_err().reason(),
        Reason::InsufficientCapacity
    );

    harness.advance(Duration::from_secs(601)).await.unwrap(); // no sleeping

    assert_eq!(
        client.get(held.reservation.id).await.unwrap().state,
        State::Expired
    );
    assert_eq!(harness.resource("seats", "A1").await.unwrap().available, 1);
    let retry = client.reserve(order("order-3")).await.unwrap();
    assert_eq!(retry.reservation.state, State::Held);
}

/// `cargo run --example` runs the scenarios one after another; `cargo test` runs each as a test.
#[allow(dead_code)] // `cargo test` builds this file as a test harness, without `main`.
#[tokio::main]
async fn main() {
    a_paid_order_is_confirmed_and_the_seat_sold().await;
    an_unpaid_hold_expires_and_frees_the_seat().await;
    println!("all 2 scenarios passed");
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_paid_order_is_confirmed_and_the_seat_sold() {
        super::a_paid_order_is_confirmed_and_the_seat_sold().await;
    }

    #[tokio::test]
    async fn an_unpaid_hold_expires_and_frees_the_seat() {
        super::an_unpaid_hold_expires_and_frees_the_seat().await;
    }
}
