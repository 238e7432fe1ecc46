//! Waitlists (SPEC 11) in the store: a refused placement joins the queues of the refused
//! holds (`QUEUED`, or `CANCELLING` ending `QUEUED` when something was placed), in join order;
//! a full queue writes nothing; an offer starts once (`QUEUED -> TRYING`, a new generation of
//! branches) and a refused one goes back keeping its place; Cancel of a `QUEUED` reservation;
//! waits that end are rejected with `QUEUE_WAIT_ENDED`; the offer lease is one instance's;
//! hold limits count queued reservations.

use std::time::Duration;

use holdfast::domain::policy::HoldLimits;
use holdfast::domain::waitlist::{QUEUE_WAIT_ENDED, QueueKey};
use holdfast::domain::{BranchState, Decision, Hold, Reservation, State, Verdict};
use holdfast::store::{BranchReport, Created, JoinQueue, Joined};

use super::{LONG, S, create, decide, lease, new_res, reports};

const HOUR: Duration = Duration::from_secs(3600);

/// The fixture's `seats/A1` hold: the queue the cases join.
fn a1(r: &Reservation) -> Hold {
    r.branches
        .iter()
        .map(|b| b.hold.clone())
        .find(|h| h.resource == "A1")
        .expect("the fixture holds seats/A1")
}

fn key(r: &Reservation) -> QueueKey {
    QueueKey::of(&a1(r))
}

/// Joins `r` (TRYING, every branch refused) to A1's queue.
async fn queue(store: &S, r: &Reservation, wait: Duration, max: u32) -> Joined {
    let refused = reports(r, BranchState::Rejected, None);
    store
        .join_queue(&JoinQueue {
            id: r.id,
            reports: &refused,
            holds: &[a1(r)],
            wait,
            max_length: max,
        })
        .await
        .unwrap()
}

fn queued(j: Joined) -> Reservation {
    match j {
        Joined::Queued(r) => r,
        other => panic!("expected QUEUED, got {other:?}"),
    }
}

async fn ids_in(store: &S, key: &QueueKey) -> Vec<uuid::Uuid> {
    let page = store.list_queue(key, 0, 100).await.unwrap();
    assert_eq!(page.length as usize, page.entries.len());
    page.entries.iter().map(|e| e.reservation_id).collect()
}

pub async fn joins_in_order_and_a_full_queue_writes_nothing(store: S) {
    let (a, _) = create(&store, "alice", "a", LONG).await;
    let (b, _) = create(&store, "bob", "b", LONG).await;
    let (c, _) = create(&store, "carol", "c", LONG).await;
    let a = queued(queue(&store, &a, HOUR, 2).await);
    assert_eq!(a.state, State::Queued);
    assert!(a.branches.iter().all(|b| b.state == BranchState::Rejected));
    let b = queued(queue(&store, &b, HOUR, 2).await);
    match queue(&store, &c, HOUR, 2).await {
        Joined::Full(k) => assert_eq!(k, key(&c)),
        other => panic!("a third in a queue of 2: {other:?}"),
    }
    assert_eq!(store.get(c.id).await.unwrap().unwrap().state, State::Trying);
    assert_eq!(ids_in(&store, &key(&a)).await, vec![a.id, b.id]);
    let place = store.queue_place(b.id).await.unwrap().expect("B waits");
    assert_eq!((place.position, place.key.clone()), (2, key(&b)));
    let waited = (place.until - place.since).num_seconds();
    assert!((3599..=3601).contains(&waited), "{place:?}");
    let queues = store.queues().await.unwrap();
    assert_eq!(queues, vec![(key(&a), 2)]);
    // Full stays full.
    let (d, _) = create(&store, "dave", "d", LONG).await;
    assert!(matches!(queue(&store, &d, HOUR, 2).await, Joined::Full(_)));
    // A Reserve no longer TRYING is not moved.
    match queue(&store, &a, HOUR, 10).await {
        Joined::Moved(now) => assert_eq!(now.state, State::Queued),
        other => panic!("{other:?}"),
    }
}

pub async fn something_placed_is_released_before_it_waits(store: S) {
    let (r, _) = create(&store, "alice", "a", LONG).await;
    let mut answers = reports(&r, BranchState::Held, None);
    if let Some(last) = answers.last_mut() {
        last.state = BranchState::Rejected;
    }
    let joined = store
        .join_queue(&JoinQueue {
            id: r.id,
            reports: &answers,
            holds: &[a1(&r)],
            wait: HOUR,
            max_length: 10,
        })
        .await
        .unwrap();
    let r = queued(joined);
    assert_eq!(
        (r.state, r.release_outcome),
        (State::Cancelling, Some(State::Queued))
    );
    // The release recorded: it waits.
    let released: Vec<BranchReport> = reports(&r, BranchState::Cancelled, None);
    let phase = store
        .record_phase(
            r.id,
            State::Cancelling,
            &released,
            Some(State::Queued),
            super::FAST,
        )
        .await
        .unwrap();
    assert_eq!(phase.reservation.state, State::Queued);
    assert_eq!(
        ids_in(&store, &key(&r)).await,
        vec![r.id],
        "kept its place meanwhile"
    );
}

pub async fn an_offer_starts_once_and_a_refused_one_keeps_its_place(store: S) {
    let (a, _) = create(&store, "alice", "a", LONG).await;
    let (b, _) = create(&store, "bob", "b", LONG).await;
    let a = queued(queue(&store, &a, HOUR, 10).await);
    let b = queued(queue(&store, &b, HOUR, 10).await);
    let heads = store.queue_heads(&key(&a), 10).await.unwrap();
    assert_eq!(
        heads.iter().map(|h| h.id).collect::<Vec<_>>(),
        vec![a.id, b.id]
    );
    assert_eq!(heads[0].quantity, 1);

    let offered = store
        .begin_offer(a.id, lease())
        .await
        .unwrap()
        .expect("offered");
    assert_eq!(
        (offered.state, offered.generation),
        (State::Trying, a.generation + 1)
    );
    assert!(
        offered
            .branches
            .iter()
            .all(|x| x.state == BranchState::Pending)
    );
    assert!(
        offered
            .branches
            .iter()
            .all(|x| a.branches.iter().all(|y| y.branch_id != x.branch_id)),
        "fresh branch ids"
    );
    assert!(
        store.begin_offer(a.id, lease()).await.unwrap().is_none(),
        "once"
    );
    let heads = store.queue_heads(&key(&a), 10).await.unwrap();
    assert_eq!(
        heads.iter().map(|h| h.id).collect::<Vec<_>>(),
        vec![b.id],
        "A is being offered"
    );

    // Refused again: back, first in line still.
    let back = queued(queue(&store, &offered, Duration::ZERO, 10).await);
    assert_eq!(back.state, State::Queued);
    assert_eq!(ids_in(&store, &key(&a)).await, vec![a.id, b.id]);
    let place = store.queue_place(a.id).await.unwrap().unwrap();
    assert_eq!(place.position, 1);
    let waited = (place.until - place.since).num_seconds();
    assert!(
        (3599..=3601).contains(&waited),
        "the wait is not restarted: {place:?}"
    );

    // Offered and held: it leaves the queue.
    let offered = store.begin_offer(a.id, lease()).await.unwrap().unwrap();
    let held = store
        .record_held(a.id, &reports(&offered, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(held.state, State::Held);
    assert_eq!(ids_in(&store, &key(&a)).await, vec![b.id]);
    assert_eq!(store.queue_place(b.id).await.unwrap().unwrap().position, 1);
}

pub async fn cancel_of_a_queued_reservation_leaves_the_queue(store: S) {
    let (a, token) = create(&store, "alice", "a", LONG).await;
    let a = queued(queue(&store, &a, HOUR, 10).await);
    let (verdict, after, leased) = decide(
        &store,
        a.id,
        &token,
        &Decision::Cancel {
            reason: Some("changed my mind".into()),
        },
    )
    .await;
    assert_eq!(verdict, Verdict::LeaveQueue);
    assert_eq!(after.state, State::Cancelled);
    assert!(!leased, "nothing to drive");
    assert!(ids_in(&store, &key(&a)).await.is_empty());
    assert!(store.queues().await.unwrap().is_empty());
}

pub async fn waits_end_with_queue_wait_ended(store: S) {
    let (a, _) = create(&store, "alice", "a", LONG).await;
    let (b, _) = create(&store, "bob", "b", LONG).await;
    let a = queued(queue(&store, &a, Duration::from_millis(1), 10).await);
    let b = queued(queue(&store, &b, HOUR, 10).await);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store
            .queue_heads(&key(&a), 10)
            .await
            .unwrap()
            .iter()
            .map(|h| h.id)
            .collect::<Vec<_>>(),
        vec![b.id],
        "a wait that is over is not offered"
    );
    assert!(store.begin_offer(a.id, lease()).await.unwrap().is_none());
    let ended = store.end_waits(100).await.unwrap();
    assert_eq!(ended.iter().map(|r| r.id).collect::<Vec<_>>(), vec![a.id]);
    let rejection = ended[0].rejection.clone().expect("a rejection");
    assert_eq!(
        (
            rejection.participant.as_str(),
            rejection.resource.as_str(),
            rejection.reason.as_str()
        ),
        ("seats", "A1", QUEUE_WAIT_ENDED)
    );
    assert_eq!(ended[0].state, State::Rejected);
    assert!(store.end_waits(100).await.unwrap().is_empty(), "once");
    assert_eq!(ids_in(&store, &key(&b)).await, vec![b.id]);
}

pub async fn one_instance_offers_a_queue_at_a_time(store: S) {
    let (a, _) = create(&store, "alice", "a", LONG).await;
    let a = queued(queue(&store, &a, HOUR, 10).await);
    let (mine, theirs) = (lease(), lease());
    assert!(store.lease_queue(&key(&a), mine).await.unwrap());
    assert!(store.lease_queue(&key(&a), mine).await.unwrap(), "renewed");
    assert!(!store.lease_queue(&key(&a), theirs).await.unwrap());
    let short = holdfast::store::WorkLease {
        owner: mine.owner,
        duration: Duration::from_millis(1),
    };
    assert!(store.lease_queue(&key(&a), short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store.lease_queue(&key(&a), theirs).await.unwrap(),
        "taken over once it lapsed"
    );
}

pub async fn hold_limits_count_queued_reservations(store: S) {
    let limits = HoldLimits {
        per_holder: 1,
        total: 0,
    };
    let (a, _) = create(&store, "alice", "a", LONG).await;
    queued(queue(&store, &a, HOUR, 10).await);
    match store
        .create(&new_res("alice", "second", LONG), lease(), limits)
        .await
        .unwrap()
    {
        Created::LimitReached(_) => {}
        other => panic!("a queued reservation counts against the holder's limit: {other:?}"),
    }
}
