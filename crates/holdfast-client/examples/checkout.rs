//! A checkout with the typed client: hold a seat for ten minutes, confirm it, see that a late
//! Cancel is refused with a `Reason`, and read the confirmation back from the event feed.
//! Against the all-in-one (`holdfast`; its `noop` participant holds anything):
//! `cargo run -p holdfast-client --example checkout` (`HOLDFAST_URL`, `HOLDFAST_API_KEY`).

use std::time::Duration;

use holdfast_client::{Client, EventFilter, EventType, Hold, ListFilter, Reason, Reserve, State};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("HOLDFAST_URL").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut builder = Client::builder(url).timeout(Duration::from_secs(10));
    if let Ok(key) = std::env::var("HOLDFAST_API_KEY") {
        builder = builder.api_key(key); // sent as `authorization: Bearer <key>`
    }
    let client = builder.connect().await?;
    let before = client.latest_sequence().await?;

    // The order id is the request id: a retried Reserve (the client retries by itself while
    // the coordinator is unavailable) answers the same reservation, never a second one.
    let order = format!("order-{}", std::process::id());
    let held = client
        .reserve(
            Reserve::new(&order, "alice")
                .hold(Hold::new("noop", "seat-A1"))
                .ttl(Duration::from_secs(600))
                .label("shop", "example"),
        )
        .await?;
    assert_eq!(held.reservation.state, State::Held);
    let id = held.reservation.id;

    let confirmed = client.confirm(id, &held.hold_token, None).await?;
    assert_eq!(confirmed.state, State::Confirmed);

    // A decided reservation does not change: the refusal carries the reason.
    match client
        .cancel(id, &held.hold_token, Some("changed my mind"))
        .await
    {
        Err(refused) if *refused.reason() == Reason::ReservationClosed => {}
        other => return Err(format!("a Cancel after Confirm answered {other:?}").into()),
    }

    // The feed: every change after `before` this caller may see, resumed by itself if the
    // connection drops.
    let confirmations = EventFilter {
        types: vec![EventType::Confirmed],
        ..EventFilter::default()
    };
    let mut events = client.events(before, confirmations);
    while let Some(event) = events.next().await {
        let event = event?;
        if event.reservation.id == id {
            println!("{order}: confirmed (event {})", event.sequence);
            break;
        }
    }

    let alices = client
        .list(ListFilter {
            holder: Some("alice".into()),
            state: Some(State::Confirmed),
            ..ListFilter::default()
        })
        .await?;
    println!(
        "alice has {} confirmed reservations on this page",
        alices.reservations.len()
    );
    Ok(())
}
