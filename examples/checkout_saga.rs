//! A checkout saga tested against holdfast with `holdfast-testkit`: an order holds a seat and a
//! unit of merchandise, the card is charged, and the order is confirmed with the payment.
//! Five tests - the happy path, a sold-out seat, a sold-out seat waited for (queued, offered
//! when the holder lets it go, paid), a payment that lands after the hold expired (refunded),
//! a participant outage recovered - each deterministic, in well under 2 s, with no sleeps:
//! expiry is reached by moving the clock (`harness.advance`), the outage is a cut network
//! (`harness.cut` / `heal`).
//!
//! Run the tests: `cargo test --example checkout_saga`; or `cargo run --example checkout_saga`
//! runs the five one after another and prints how long each took.

use std::time::{Duration, Instant};

use holdfast_client::{
    Client, Error, Hold, Payment, Reason, Reservation, Reserve, Reserved, State,
};
use holdfast_testkit::{Harness, Kind};

// ---- the code under test: the shop's checkout ------------------------------------------------

/// What a customer orders: a seat for the show and a programme from the merchandise stock.
struct Order<'a> {
    id: &'a str,
    customer: &'a str,
    seat: &'a str,
}

/// The shop's checkout saga: hold everything the order needs for ten minutes, then confirm
/// with the payment the customer made.
struct Checkout {
    holdfast: Client,
}

impl Checkout {
    /// Step 1: hold the seat and the programme, all or nothing.
    async fn hold(&self, order: &Order<'_>) -> Result<Reserved, Error> {
        let request = Reserve::new(order.id, order.customer)
            .hold(Hold::new("seats", order.seat))
            .hold(Hold::new("stock", "programme").quantity(1))
            .ttl(Duration::from_secs(600));
        self.holdfast.reserve(request).await
    }

    /// Step 1, for a customer who would rather wait than be turned away: hold, or wait in the
    /// seat's waitlist for up to an hour (the reservation is then QUEUED, and HELD once an
    /// offer places it).
    async fn hold_or_wait(&self, order: &Order<'_>) -> Result<Reserved, Error> {
        let request = Reserve::new(order.id, order.customer)
            .hold(Hold::new("seats", order.seat))
            .hold(Hold::new("stock", "programme").quantity(1))
            .ttl(Duration::from_secs(600))
            .queue(Duration::from_secs(3600));
        self.holdfast.reserve(request).await
    }

    /// Step 2: the card was charged; confirm the order with that payment.
    async fn confirm(&self, held: &Reserved, payment: Payment) -> Result<Reservation, Error> {
        let id = held.reservation.id;
        self.holdfast
            .confirm(id, &held.hold_token, Some(payment))
            .await
    }
}

// ---- the tests -------------------------------------------------------------------------------

const PRICE: i64 = 4_200;

/// The shop: real seats, stock and payments participants, on a temporary SQLite folder.
async fn shop() -> (Harness, Checkout) {
    let harness = Harness::builder()
        .participants([Kind::Seats, Kind::Stock, Kind::Payments])
        .resources("seats", [("A1", 1), ("A2", 1)])
        .resources("stock", [("programme", 10)])
        .resources("payments", [("card-alice", 100_000), ("card-bob", 100_000)])
        .start()
        .await
        .expect("the shop starts");
    let checkout = Checkout {
        holdfast: harness.client(),
    };
    (harness, checkout)
}

async fn happy_path() {
    let (harness, checkout) = shop().await;
    let order = Order {
        id: "order-1",
        customer: "alice",
        seat: "A1",
    };
    let held = checkout.hold(&order).await.unwrap();
    assert_eq!(held.reservation.state, State::Held);

    let paid = harness
        .charge("card-alice", held.reservation.id, PRICE, "EUR")
        .await
        .unwrap();
    let done = checkout.confirm(&held, paid).await.unwrap();

    assert_eq!(done.state, State::Confirmed);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().confirmed, 1);
    assert_eq!(
        harness
            .resource("stock", "programme")
            .await
            .unwrap()
            .confirmed,
        1
    );
}

async fn sold_out_seat() {
    let (harness, checkout) = shop().await;
    let bob = Order {
        id: "order-1",
        customer: "bob",
        seat: "A1",
    };
    checkout.hold(&bob).await.unwrap();

    let alice = Order {
        id: "order-2",
        customer: "alice",
        seat: "A1",
    };
    let refused = checkout.hold(&alice).await.unwrap_err();

    assert_eq!(*refused.reason(), Reason::InsufficientCapacity);
    // All or nothing: alice holds no programme either (bob holds one).
    assert_eq!(
        harness.resource("stock", "programme").await.unwrap().held,
        1
    );
}

async fn sold_out_queued_offered_paid() {
    let (harness, checkout) = shop().await;
    let bob = Order {
        id: "order-1",
        customer: "bob",
        seat: "A1",
    };
    checkout.hold(&bob).await.unwrap();

    // Alice waits instead of being turned away: first in the seat's queue, holding nothing.
    let alice = Order {
        id: "order-2",
        customer: "alice",
        seat: "A1",
    };
    let waiting = checkout.hold_or_wait(&alice).await.unwrap();
    assert_eq!(waiting.reservation.state, State::Queued);
    assert_eq!(waiting.reservation.queue.as_ref().unwrap().position, 1);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().held, 1);

    // Bob walks away: his hold expires and the seat is offered to alice within the move.
    harness.advance(Duration::from_secs(601)).await.unwrap();
    let offered = harness.client().get(waiting.reservation.id).await.unwrap();
    assert_eq!(offered.state, State::Held);

    // She pays, with the token her Reserve answered, and the order is hers.
    let paid = harness
        .charge("card-alice", waiting.reservation.id, PRICE, "EUR")
        .await
        .unwrap();
    let done = checkout.confirm(&waiting, paid).await.unwrap();
    assert_eq!(done.state, State::Confirmed);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().confirmed, 1);
}

async fn late_payment_is_refunded() {
    let (harness, checkout) = shop().await;
    let alice = Order {
        id: "order-1",
        customer: "alice",
        seat: "A1",
    };
    let held = checkout.hold(&alice).await.unwrap();

    // Alice dawdles past the ten minutes: the hold expires and bob takes the seat.
    harness.advance(Duration::from_secs(601)).await.unwrap();
    let expired = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(expired.state, State::Expired);
    let bob = Order {
        id: "order-2",
        customer: "bob",
        seat: "A1",
    };
    checkout.hold(&bob).await.unwrap();

    // Her payment lands now: the seat cannot be had, so the payment is refunded.
    let paid = harness
        .charge("card-alice", held.reservation.id, PRICE, "EUR")
        .await
        .unwrap();
    let refused = checkout.confirm(&held, paid.clone()).await.unwrap_err();
    assert_eq!(*refused.reason(), Reason::HoldExpired);
    // The refund is sent before the answer or by recovery: the next clock move drives it.
    harness.advance(Duration::from_secs(1)).await.unwrap();
    let record = harness.payment(&paid.payment_ref).await.unwrap();
    assert_eq!(record.refunded_minor, PRICE);
}

async fn stock_outage_is_recovered() {
    let (harness, checkout) = shop().await;
    let alice = Order {
        id: "order-1",
        customer: "alice",
        seat: "A2",
    };
    let held = checkout.hold(&alice).await.unwrap();
    let paid = harness
        .charge("card-alice", held.reservation.id, PRICE, "EUR")
        .await
        .unwrap();

    // The stock service is unreachable when alice confirms: the decision is recorded (she
    // paid; the order will be confirmed), the programme's confirmation waits.
    harness.cut("stock").await.unwrap();
    let decided = checkout.confirm(&held, paid).await.unwrap();
    assert_eq!(decided.state, State::Confirming);

    // Back online: the coordinator's retry (due after its backoff) finishes the order.
    harness.heal("stock").await.unwrap();
    harness.advance(Duration::from_secs(60)).await.unwrap();
    let done = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(done.state, State::Confirmed);
    assert_eq!(
        harness
            .resource("stock", "programme")
            .await
            .unwrap()
            .confirmed,
        1
    );
}

/// Runs one scenario and says how long it took; fails past the 2 s budget.
async fn timed<F: std::future::Future<Output = ()>>(name: &str, scenario: F) -> Duration {
    let started = Instant::now();
    scenario.await;
    let took = started.elapsed();
    println!("checkout_saga: {name}: {} ms", took.as_millis());
    assert!(took < Duration::from_secs(2), "{name} took {took:?}");
    took
}

#[tokio::test]
async fn checkout_happy_path() {
    timed("happy path", happy_path()).await;
}

#[tokio::test]
async fn checkout_sold_out_seat() {
    timed("sold-out seat", sold_out_seat()).await;
}

#[tokio::test]
async fn checkout_sold_out_queued_offered_paid() {
    timed(
        "sold out, queued, offered, paid",
        sold_out_queued_offered_paid(),
    )
    .await;
}

#[tokio::test]
async fn checkout_late_payment_is_refunded() {
    timed("late payment refunded", late_payment_is_refunded()).await;
}

#[tokio::test]
async fn checkout_stock_outage_is_recovered() {
    timed("stock outage recovered", stock_outage_is_recovered()).await;
}

#[allow(dead_code)] // `cargo test` builds this file as a test harness, without `main`.
#[tokio::main]
async fn main() {
    let total = timed("happy path", happy_path()).await
        + timed("sold-out seat", sold_out_seat()).await
        + timed(
            "sold out, queued, offered, paid",
            sold_out_queued_offered_paid(),
        )
        .await
        + timed("late payment refunded", late_payment_is_refunded()).await
        + timed("stock outage recovered", stock_outage_is_recovered()).await;
    println!("checkout_saga: all five in {} ms", total.as_millis());
}
