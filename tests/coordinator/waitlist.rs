//! Waitlists (SPEC 11) on both databases, through a test-mode coordinator and a real `seats`
//! participant (one place per seat): first queued, first offered; a Reserve without `queue`
//! never gets ahead of a queue; offers follow releases within a second (awaited on Watch) and
//! expiries within the clock's move; the ends of a wait (over, Cancel, Confirm refused); a
//! head that fits one resource but not another keeps its place; a full queue; many
//! concurrent queued clients served in their queue's order; capacity added at a participant
//! offered by the sweep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::admin_client::AdminClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_types::StatusExt;

use crate::common::*;
use crate::testing::{Backend, Stack, pg_url, stack};

const HOUR: Duration = Duration::from_secs(3600);
const TEN_MINUTES: Duration = Duration::from_secs(600);

/// Offers follow releases and clock moves only (no periodic sweep), so every state a test
/// reads is the one its own steps made.
fn no_sweep(
    _: &mut holdfast::participants::ParticipantSettings,
    c: &mut holdfast::app::CoordinatorSettings,
) {
    c.policy.queue.sweep = Duration::from_secs(24 * 3600);
}

/// A Reserve of `seats` (one place each) by its own holder, waiting up to `wait` when sold
/// out (`None`: no queue).
fn reserve_seats(id: &str, seats: &[&str], wait: Option<Duration>) -> proto::ReserveRequest {
    let mut req = reserve_request(id, seats.iter().map(|s| hold("seats", s)).collect());
    req.holder = format!("holder-{id}");
    req.ttl = Some(proto_duration(TEN_MINUTES));
    req.queue = wait.map(|w| proto::QueueOptions {
        wait_up_to: Some(proto_duration(w)),
    });
    req
}

async fn reserve(
    s: &mut Stack,
    id: &str,
    seats: &[&str],
    wait: Option<Duration>,
) -> proto::Reservation {
    s.client
        .reserve(reserve_seats(id, seats, wait))
        .await
        .unwrap_or_else(|e| panic!("reserve {id}: {e:?}"))
        .into_inner()
}

/// Where a queued reservation waits, checked against its answer.
fn position(r: &proto::Reservation) -> i64 {
    assert_eq!(state_of(r), State::Queued, "{r:?}");
    r.queue
        .as_ref()
        .expect("a QUEUED answer says where")
        .position
}

/// Waits on WatchReservation until `r` is `want`; panics after `within`.
async fn watch_until(s: &mut Stack, r: &proto::Reservation, want: State, within: Duration) {
    let mut stream = s
        .client
        .watch_reservation(proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let seen = tokio::time::timeout(within, async {
        while let Some(next) = stream.next().await {
            let next = next.expect("a watch update");
            if state_of(&next) == want {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        seen,
        Ok(true),
        "{} did not become {want:?} within {within:?}",
        r.id
    );
}

async fn admin(s: &Stack) -> AdminClient<tonic::transport::Channel> {
    AdminClient::connect(format!("http://{}", s.addr))
        .await
        .expect("admin client")
}

/// The reservation ids of seat `seat`'s queue, in offer order.
async fn queue_of(s: &Stack, seat: &str) -> Vec<String> {
    let page = admin(s)
        .await
        .list_queue(proto::ListQueueRequest {
            participant: "seats".into(),
            resource: seat.into(),
            ..Default::default()
        })
        .await
        .expect("ListQueue")
        .into_inner();
    assert_eq!(page.length, page.entries.len() as i64);
    for (i, e) in page.entries.iter().enumerate() {
        assert_eq!(e.position, i as i64 + 1, "{page:?}");
    }
    page.entries.into_iter().map(|e| e.reservation_id).collect()
}

/// The event types of `holder`'s reservations from the oldest on, read from Events/Subscribe
/// until `enough` says so (at most 5 s). A `RESERVATION_HELD` is checked to say `from_queue`
/// exactly when a waitlist offer made it (the reservation's second generation or later).
async fn events_until(
    s: &Stack,
    holder: &str,
    enough: impl Fn(&[&'static str]) -> bool,
) -> Vec<&'static str> {
    use holdfast::proto::event::Type;
    let mut client =
        holdfast::proto::events_client::EventsClient::connect(format!("http://{}", s.addr))
            .await
            .expect("events client");
    let mut stream = client
        .subscribe(proto::SubscribeRequest {
            after_sequence: 0,
            filter: Some(proto::EventFilter {
                holders: vec![holder.to_owned()],
                ..Default::default()
            }),
        })
        .await
        .expect("subscribe")
        .into_inner();
    let mut seen: Vec<&'static str> = Vec::new();
    let mut tries = 0;
    let done = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(e) = stream.next().await {
            let e = e.expect("an event");
            let t = e.r#type();
            if t == Type::Heartbeat {
                continue;
            }
            if t == Type::ReservationTrying {
                tries += 1;
            }
            if t == Type::ReservationHeld {
                assert_eq!(e.from_queue, tries > 1, "from_queue of {e:?}");
            }
            seen.push(t.as_str_name());
            if enough(&seen) {
                return;
            }
        }
    })
    .await;
    assert!(done.is_ok(), "events of {holder} so far: {seen:?}");
    seen
}

/// A held; B and C queued; D without `queue` refused before anything is recorded; A cancels
/// -> B HELD within a second; B's hold expires -> C HELD within the clock's move.
async fn first_queued_first_offered(backend: Backend) {
    let mut s = stack(backend, no_sweep).await;
    let a = reserve(&mut s, "a", &["A1"], Some(HOUR)).await;
    assert_eq!(state_of(&a), State::Held, "a free seat is held, not queued");
    let b = reserve(&mut s, "b", &["A1"], Some(HOUR)).await;
    assert_eq!(position(&b), 1);
    assert!(
        !b.hold_token.is_empty(),
        "a queued answer carries its token"
    );
    let place = b.queue.as_ref().unwrap();
    assert_eq!(
        (place.participant.as_str(), place.resource.as_str()),
        ("seats", "A1")
    );
    let waited = place.until.as_ref().unwrap().seconds - place.since.as_ref().unwrap().seconds;
    assert!((3599..=3601).contains(&waited), "{place:?}");
    let c = reserve(&mut s, "c", &["A1"], Some(HOUR)).await;
    assert_eq!(position(&c), 2);
    assert_eq!(s.seat("A1").await, (1, 0), "queueing holds nothing");

    let d = s
        .client
        .reserve(reserve_seats("d", &["A1"], None))
        .await
        .unwrap_err();
    assert_eq!(reason(&d), "INSUFFICIENT_CAPACITY", "{d:?}");
    assert_eq!(
        error_metadata(&d).get("recorded").map(String::as_str),
        Some("false")
    );

    let not_held = s
        .client
        .confirm(Decide::on(&b).confirm())
        .await
        .unwrap_err();
    assert_eq!(not_held.code(), Code::FailedPrecondition);
    assert_eq!(reason(&not_held), "RESERVATION_NOT_HELD");
    assert_eq!(queue_of(&s, "A1").await, vec![b.id.clone(), c.id.clone()]);

    let released = Instant::now();
    s.client.cancel(Decide::on(&a).cancel()).await.unwrap();
    watch_until(&mut s, &b, State::Held, Duration::from_secs(1)).await;
    assert!(released.elapsed() < Duration::from_secs(1));
    let b_now = s.get(&b.id).await;
    assert!(b_now.queue.is_none(), "{b_now:?}");
    let c_now = s.get(&c.id).await;
    assert_eq!(position(&c_now), 1, "C moved up");
    let b_events = events_until(&s, "holder-b", |seen| seen.contains(&"RESERVATION_HELD")).await;
    assert_eq!(
        b_events,
        [
            "RESERVATION_TRYING",
            "RESERVATION_QUEUED",
            "RESERVATION_TRYING",
            "RESERVATION_HELD"
        ]
    );
    assert_eq!(s.seat("A1").await, (1, 0));

    // B lets its hold lapse: the move expires it and offers C within the call.
    s.advance(TEN_MINUTES + Duration::from_secs(60)).await;
    assert_eq!(state_of(&s.get(&b.id).await), State::Expired);
    assert_eq!(state_of(&s.get(&c.id).await), State::Held);
    assert!(queue_of(&s, "A1").await.is_empty());
    s.client.confirm(Decide::on(&c).confirm()).await.unwrap();
    assert_eq!(resource(&s.seats, "A1").await.confirmed, 1);
}

#[tokio::test]
async fn first_queued_first_offered_on_sqlite() {
    first_queued_first_offered(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn first_queued_first_offered_on_postgres(pool: PgPool) {
    first_queued_first_offered(Backend::Postgres(pg_url(&pool))).await;
}

/// The ends of a wait: Cancel of a QUEUED reservation -> CANCELLED (it leaves the queue);
/// `wait_up_to` passed -> REJECTED with QUEUE_WAIT_ENDED; bad `queue` options are refused
/// naming the field.
async fn a_wait_ends_by_cancel_or_by_time(backend: Backend) {
    let mut s = stack(backend, no_sweep).await;
    let a = reserve(&mut s, "a", &["A1"], None).await;
    assert_eq!(state_of(&a), State::Held);
    let short = reserve(&mut s, "short", &["A1"], Some(Duration::from_secs(300))).await;
    let gone = reserve(&mut s, "gone", &["A1"], Some(HOUR)).await;
    assert_eq!((position(&short), position(&gone)), (1, 2));

    let cancelled = s
        .client
        .cancel(Decide::on(&gone).cancel())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&cancelled), State::Cancelled);
    assert_eq!(queue_of(&s, "A1").await, vec![short.id.clone()]);

    s.advance(Duration::from_secs(6 * 60)).await;
    let ended = s.get(&short.id).await;
    assert_eq!(state_of(&ended), State::Rejected, "{ended:?}");
    assert_eq!(ended.rejection.unwrap().reason, "QUEUE_WAIT_ENDED");
    assert!(queue_of(&s, "A1").await.is_empty());
    assert_eq!(
        state_of(&s.get(&a.id).await),
        State::Held,
        "the holder keeps its seat"
    );

    for (wait, field) in [
        (Some(Duration::ZERO), "queue.wait_up_to"),
        (Some(2 * HOUR), "queue.wait_up_to"),
    ] {
        let e = s
            .client
            .reserve(reserve_seats("bad", &["A2"], wait))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{e:?}");
    }
    let mut no_wait = reserve_seats("bad", &["A2"], None);
    no_wait.queue = Some(proto::QueueOptions { wait_up_to: None });
    let e = s.client.reserve(no_wait).await.unwrap_err();
    assert!(e.message().contains("queue.wait_up_to"), "{e:?}");
    assert_eq!(s.seat("A2").await, (0, 1), "refused requests hold nothing");
}

#[tokio::test]
async fn a_wait_ends_by_cancel_or_by_time_on_sqlite() {
    a_wait_ends_by_cancel_or_by_time(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn a_wait_ends_by_cancel_or_by_time_on_postgres(pool: PgPool) {
    a_wait_ends_by_cancel_or_by_time(Backend::Postgres(pg_url(&pool))).await;
}

/// Two resources: B wants A1 and A2 while A holds A2. The participant refuses B's branch, so
/// B waits in both queues (A1, placed first, is released again). C then asks A1 with `queue`:
/// A1 has a queue, so C joins it without a Try, and D without `queue` is refused. The next
/// pass offers A1's queue: B does not fit (A2 is A's), keeps its place, and C, behind it,
/// gets A1. A's release of A2 cannot place B either (A1 is C's); C's release of A1 places B.
async fn a_head_that_fits_one_resource_keeps_its_place(backend: Backend) {
    let mut s = stack(backend, no_sweep).await;
    let a = reserve(&mut s, "a", &["A2"], None).await;
    let b = reserve(&mut s, "b", &["A1", "A2"], Some(HOUR)).await;
    assert_eq!(position(&b), 1);
    assert_eq!(s.seat("A1").await, (0, 1), "B's placed A1 was released");
    assert_eq!(queue_of(&s, "A1").await, vec![b.id.clone()]);
    assert_eq!(queue_of(&s, "A2").await, vec![b.id.clone()]);
    let c = reserve(&mut s, "c", &["A1"], Some(HOUR)).await;
    assert!(
        state_of(&c) == State::Held || position(&c) == 2,
        "C joins behind B, or a pass already placed it: {c:?}"
    );
    let d = s
        .client
        .reserve(reserve_seats("d", &["A1"], None))
        .await
        .unwrap_err();
    assert_eq!(
        error_metadata(&d).get("recorded").map(String::as_str),
        Some("false"),
        "{d:?}"
    );

    s.advance(Duration::from_secs(1)).await;
    assert_eq!(
        state_of(&s.get(&c.id).await),
        State::Held,
        "what is left fits C"
    );
    assert_eq!(state_of(&s.get(&b.id).await), State::Queued);
    assert_eq!(
        queue_of(&s, "A1").await,
        vec![b.id.clone()],
        "B kept its place"
    );
    assert_eq!(s.seat("A1").await, (1, 0));

    s.client.cancel(Decide::on(&a).cancel()).await.unwrap();
    s.advance(Duration::from_secs(1)).await;
    assert_eq!(
        state_of(&s.get(&b.id).await),
        State::Queued,
        "A1 is still C's"
    );
    assert_eq!(
        s.seat("A2").await,
        (0, 1),
        "the refused offer holds nothing"
    );

    s.client.cancel(Decide::on(&c).cancel()).await.unwrap();
    watch_until(&mut s, &b, State::Held, Duration::from_secs(1)).await;
    assert_eq!((s.seat("A1").await, s.seat("A2").await), ((1, 0), (1, 0)));
    assert!(queue_of(&s, "A1").await.is_empty() && queue_of(&s, "A2").await.is_empty());
    let events = events_until(&s, "holder-b", |seen| seen.contains(&"RESERVATION_HELD")).await;
    assert_eq!(
        events[..2],
        ["RESERVATION_TRYING", "RESERVATION_QUEUED"],
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .filter(|e| **e == "RESERVATION_TRYING")
            .count()
            >= 3,
        "offered at least twice: {events:?}"
    );
}

#[tokio::test]
async fn a_head_that_fits_one_resource_keeps_its_place_on_sqlite() {
    a_head_that_fits_one_resource_keeps_its_place(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn a_head_that_fits_one_resource_keeps_its_place_on_postgres(pool: PgPool) {
    a_head_that_fits_one_resource_keeps_its_place(Backend::Postgres(pg_url(&pool))).await;
}

/// `--max-queue-length 1`: the second to queue is refused RESOURCE_EXHAUSTED QUEUE_FULL with
/// RetryInfo, and holds nothing.
async fn a_full_queue_refuses(backend: Backend) {
    let mut s = stack(backend, |p, c| {
        no_sweep(p, c);
        c.policy.queue.max_length = 1;
    })
    .await;
    reserve(&mut s, "a", &["A1"], None).await;
    let b = reserve(&mut s, "b", &["A1"], Some(HOUR)).await;
    assert_eq!(position(&b), 1);
    let full = s
        .client
        .reserve(reserve_seats("c", &["A1"], Some(HOUR)))
        .await
        .unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    assert_eq!(reason(&full), "QUEUE_FULL");
    assert!(full.get_details_retry_info().is_some(), "{full:?}");
    assert_eq!(queue_of(&s, "A1").await, vec![b.id.clone()]);
}

#[tokio::test]
async fn a_full_queue_refuses_on_sqlite() {
    a_full_queue_refuses(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn a_full_queue_refuses_on_postgres(pool: PgPool) {
    a_full_queue_refuses(Backend::Postgres(pg_url(&pool))).await;
}

/// Many clients queue at once for a seat someone holds; each release offers the seat to the
/// head of the queue, in the order ListQueue showed, and nothing is ever held twice.
async fn concurrent_queuers_are_served_in_queue_order(backend: Backend) {
    const CLIENTS: usize = 16;
    let mut s = stack(backend, no_sweep).await;
    let mut holder = reserve(&mut s, "first", &["A1"], None).await;
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let mut client = s.client.clone();
        let start = start.clone();
        let req = reserve_seats(&format!("q{i}"), &["A1"], Some(HOUR));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            client.reserve(req).await.map(|r| r.into_inner())
        }));
    }
    let mut queued = Vec::new();
    for t in tasks {
        queued.push(t.await.expect("join").expect("queued"));
    }
    let mut positions: Vec<i64> = queued.iter().map(position).collect();
    positions.sort_unstable();
    assert_eq!(
        positions,
        (1..=CLIENTS as i64).collect::<Vec<_>>(),
        "distinct places"
    );
    let order = queue_of(&s, "A1").await;
    assert_eq!(order.len(), CLIENTS);
    for next in order {
        let next = queued
            .iter()
            .find(|r| r.id == next)
            .expect("one of ours")
            .clone();
        s.client.cancel(Decide::on(&holder).cancel()).await.unwrap();
        watch_until(&mut s, &next, State::Held, Duration::from_secs(1)).await;
        assert_eq!(s.seat("A1").await, (1, 0), "never held twice");
        holder = next;
    }
}

#[tokio::test]
async fn concurrent_queuers_are_served_in_queue_order_on_sqlite() {
    concurrent_queuers_are_served_in_queue_order(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn concurrent_queuers_are_served_in_queue_order_on_postgres(pool: PgPool) {
    concurrent_queuers_are_served_in_queue_order(Backend::Postgres(pg_url(&pool))).await;
}

// Capacity that comes back another way than a release made here (`ResourceAdmin/
// PutResources` at the participant) is found by the sweep (`--queue-sweep`), against the
// real stock participant on PostgreSQL: the waiting reservation is then held.
crate::parallel::parallel_test!(capacity_added_at_the_participant_is_offered_by_the_sweep => capacity_added_at_the_participant_is_offered_by_the_sweep_on);
async fn capacity_added_at_the_participant_is_offered_by_the_sweep_on(pool: PgPool) {
    use crate::real::{hold as stock_hold, reserve as reserve_of, spawn_stack_with};
    use holdfast::participants::Kind::Stock;
    let stack = spawn_stack_with(pool, |s| {
        s.policy.queue.sweep = Duration::from_millis(100);
    })
    .await;
    stack.put(Stock, &[("sku-w", 1)]).await;
    let mut client = stack.client();
    let first = client
        .reserve(reserve_of(
            "r1",
            "alice",
            None,
            vec![stock_hold(Stock, "sku-w", 1)],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&first), State::Held);
    let mut wait = reserve_of("r2", "bob", None, vec![stock_hold(Stock, "sku-w", 1)]);
    wait.queue = Some(proto::QueueOptions {
        wait_up_to: Some(proto_duration(HOUR)),
    });
    let bob = client.reserve(wait).await.unwrap().into_inner();
    assert_eq!(position(&bob), 1);

    stack.put(Stock, &[("sku-w", 2)]).await;
    let held = stack.wait_state(&bob.id, State::Held).await;
    assert!(held.queue.is_none(), "{held:?}");
    assert_eq!(stack.counts(Stock, "sku-w").await, (0, 2, 0));
    stack.stop().await;
}
