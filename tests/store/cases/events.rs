//! The event log (SPEC 10): every change appends an event in its own transaction, numbered
//! in the order readers receive them, resumable after any number; owner scoping; the sinks'
//! cursors, leases, pauses; retention behind the slowest sink. PostgreSQL alone: a
//! transaction held open while later ones commit is neither skipped nor repeated (readers wait
//! for it), and two replicas writing at once while a reader follows lose nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use holdfast::domain::{BranchState, Event, EventType, State};
use holdfast::store::events::EventPage;
use holdfast::store::{JoinQueue, Joined, PgStore, Store};
use sqlx::PgPool;
use uuid::Uuid;

use super::{FAST, LONG, S, cancel, confirm, decide, held, lease, reports};

/// Every event readable now after `after` (all owners): with the horizon per database,
/// everything this test committed (no other test writes to its database).
async fn read_after(store: &dyn Store, after: i64) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    let mut cursor = after;
    loop {
        let page = EventPage {
            after: cursor,
            owner: None,
            limit: 7,
        };
        let batch = store.event_log().events_after(&page).await.unwrap();
        let Some(last) = batch.last() else {
            return out;
        };
        cursor = last.sequence;
        out.extend(batch);
    }
}

fn types_of(events: &[Event], id: Uuid) -> Vec<EventType> {
    events
        .iter()
        .filter(|e| e.reservation.id == id)
        .map(|e| e.event_type)
        .collect()
}

/// Sequences strictly increase (they are sparse on PostgreSQL), each event once.
fn assert_increasing(events: &[Event]) {
    for pair in events.windows(2) {
        assert!(
            pair[1].sequence > pair[0].sequence,
            "out of order or a repeat"
        );
    }
    let ids: BTreeSet<Uuid> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), events.len(), "an event id twice");
}

pub async fn lifecycle_appends_events_in_order(store: S) {
    let (a, token_a) = held(&store, "alice", "ev-1", LONG).await;
    decide(&store, a.id, &token_a, &confirm()).await;
    store
        .record_phase(
            a.id,
            State::Confirming,
            &reports(&a, BranchState::Confirmed, None),
            Some(State::Confirmed),
            FAST,
        )
        .await
        .unwrap();
    let (b, token_b) = held(&store, "bob", "ev-2", LONG).await;
    decide(&store, b.id, &token_b, &cancel()).await;

    let events = read_after(&*store, 0).await;
    use EventType::*;
    assert_eq!(
        types_of(&events, a.id),
        [Trying, Held, Confirming, Confirmed]
    );
    assert_eq!(types_of(&events, b.id), [Trying, Held, Cancelling]);
    assert_increasing(&events);
    assert!(events[0].sequence > 0);
    let latest = store.event_log().latest_sequence().await.unwrap();
    assert_eq!(latest, events.last().unwrap().sequence);
    // Each carries the reservation as that change left it.
    for e in &events {
        let expected = match e.event_type {
            Trying => State::Trying,
            Held => State::Held,
            Confirming => State::Confirming,
            Confirmed => State::Confirmed,
            Cancelling => State::Cancelling,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(e.reservation.state, expected, "{e:?}");
        assert_eq!(e.reservation.branches.len(), 3);
        assert_eq!(
            e.reservation.labels.get("order").map(String::as_str),
            Some("o-1")
        );
    }
    // Where to start to receive the last two; more than there are: from the start.
    let log = store.event_log();
    let two = log.before_last(None, 2).await.unwrap();
    let last_two: Vec<Uuid> = events[events.len() - 2..]
        .iter()
        .map(|e| e.event_id)
        .collect();
    let got: Vec<Uuid> = read_after(&*store, two)
        .await
        .iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(got, last_two);
    assert_eq!(log.before_last(None, 1000).await.unwrap(), 0);
    assert_eq!(log.before_last(Some("nobody"), 1).await.unwrap(), 0);
    // Resuming after any number gives exactly the rest.
    for k in 0..events.len() {
        let rest = read_after(&*store, events[k].sequence).await;
        let want: Vec<Uuid> = events[k + 1..].iter().map(|e| e.event_id).collect();
        assert_eq!(rest.iter().map(|e| e.event_id).collect::<Vec<_>>(), want);
        // A page that starts inside a generation's events still carries its branches.
        assert!(rest.iter().all(|e| e.reservation.branches.len() == 3));
    }
}

/// An event carries the branches of its own generation: after a waitlist offer (the
/// reservation's next generation, fresh branches), its first generation's events still show
/// the first generation's branches, and the offer's events the new ones.
pub async fn events_carry_their_generation_s_branches(store: S) {
    let (a, _) = super::create(&store, "alice", "ev-gen", LONG).await;
    let hold = a
        .branches
        .iter()
        .map(|b| b.hold.clone())
        .find(|h| h.resource == "A1")
        .expect("the fixture holds seats/A1");
    let joined = store
        .join_queue(&JoinQueue {
            id: a.id,
            reports: &reports(&a, BranchState::Rejected, None),
            holds: &[hold],
            wait: Duration::from_secs(3600),
            max_length: 10,
        })
        .await
        .unwrap();
    assert!(matches!(joined, Joined::Queued(_)), "{joined:?}");
    let offered = store
        .begin_offer(a.id, lease())
        .await
        .unwrap()
        .expect("offered");
    let first: BTreeSet<Uuid> = a.branches.iter().map(|b| b.branch_id).collect();
    let second: BTreeSet<Uuid> = offered.branches.iter().map(|b| b.branch_id).collect();
    assert!(first.is_disjoint(&second), "an offer's branches are new");
    let events = read_after(&*store, 0).await;
    let mut generations = BTreeSet::new();
    for e in events.iter().filter(|e| e.reservation.id == a.id) {
        let carried: BTreeSet<Uuid> = e.reservation.branches.iter().map(|b| b.branch_id).collect();
        let want = if e.reservation.generation == a.generation {
            &first
        } else {
            &second
        };
        assert_eq!(
            &carried, want,
            "{:?} of generation {}",
            e.event_type, e.reservation.generation
        );
        generations.insert(e.reservation.generation);
    }
    assert_eq!(generations.len(), 2, "events of both generations");
}

pub async fn readers_see_only_their_owner_s_events(store: S) {
    let mut mine = super::new_res("alice", "own-1", LONG);
    mine.owner = "shop-a".into();
    let mut theirs = super::new_res("alice", "own-2", LONG);
    theirs.owner = "shop-b".into();
    for new in [&mine, &theirs] {
        store.create(new, lease(), super::NO_LIMITS).await.unwrap();
    }
    let page = EventPage {
        after: 0,
        owner: Some("shop-a"),
        limit: 100,
    };
    let seen = store.event_log().events_after(&page).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].reservation.id, mine.id);
    assert_eq!(seen[0].owner, "shop-a");
    assert_eq!(read_after(&*store, 0).await.len(), 2);
}

pub async fn sinks_keep_a_cursor_a_lease_and_a_pause(store: S) {
    let log = store.event_log();
    let (first, second) = (lease(), lease());
    let state = log.lease_sink("nats", first).await.unwrap().unwrap();
    assert_eq!(state.delivered_through, 0);
    assert!(!state.paused);
    assert_eq!(log.lease_sink("nats", second).await.unwrap(), None);
    assert!(log.record_delivered("nats", first.owner, 5).await.unwrap());
    assert!(!log.record_delivered("nats", second.owner, 9).await.unwrap());
    // The cursor never goes back.
    assert!(log.record_delivered("nats", first.owner, 3).await.unwrap());
    let again = log.lease_sink("nats", first).await.unwrap().unwrap();
    assert_eq!(again.delivered_through, 5);
    // Failing, then failing past the give-up period: paused, until resumed.
    let failing = log
        .record_sink_failure("nats", first.owner, "connection refused", LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(failing.failing_since.is_some() && !failing.paused);
    assert_eq!(failing.last_error.as_deref(), Some("connection refused"));
    let paused = log
        .record_sink_failure("nats", first.owner, "still refused", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert!(paused.paused);
    assert!(log.resume_sink("nats").await.unwrap());
    assert!(!log.resume_sink("no-such-sink").await.unwrap());
    // A stopping holder gives the lease up; only the holder can.
    assert!(!log.release_sink("nats", second.owner).await.unwrap());
    assert!(log.release_sink("nats", first.owner).await.unwrap());
    let taken = log.lease_sink("nats", second).await.unwrap().unwrap();
    assert_eq!(taken.delivered_through, 5, "the cursor outlives the lease");
    let listed = log.sinks().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].paused && listed[0].failing_since.is_none());
}

pub async fn retention_never_passes_an_active_sink(store: S) {
    for i in 0..3 {
        held(&store, "alice", &format!("keep-{i}"), LONG).await;
    }
    let events = read_after(&*store, 0).await;
    assert_eq!(events.len(), 6);
    let log = store.event_log();
    let sink = lease();
    log.lease_sink("hooks", sink).await.unwrap().unwrap();
    log.record_delivered("hooks", sink.owner, events[3].sequence)
        .await
        .unwrap();
    assert!(log.sink_lag("hooks").await.unwrap() < Duration::from_secs(60));
    // Older than "now": only what the sink has delivered may go.
    assert_eq!(log.purge_events(Duration::ZERO, 100).await.unwrap(), 4);
    let left = read_after(&*store, 0).await;
    assert_eq!(left.len(), 2);
    assert_eq!(left[0].sequence, events[4].sequence);
    // Numbers are never handed out again once purged.
    log.record_delivered("hooks", sink.owner, events[5].sequence)
        .await
        .unwrap();
    assert_eq!(log.purge_events(Duration::ZERO, 100).await.unwrap(), 2);
    assert_eq!(log.sink_lag("hooks").await.unwrap(), Duration::ZERO);
    held(&store, "alice", "keep-after", LONG).await;
    let after = read_after(&*store, 0).await;
    assert!(after[0].sequence > events[5].sequence);
}

/// PostgreSQL: while a transaction that wrote an event stays open, later transactions commit
/// theirs; a reader reads none of them (it would have to pass the open one), then, once it
/// commits, every one exactly once, the open one's first (its number is the smaller).
pub async fn a_transaction_held_open_is_read_once_when_it_commits(pool: PgPool) {
    let store: S = crate::postgres(pool.clone()).await;
    let (slow, _) = held(&store, "alice", "slow", LONG).await;
    let before = read_after(&*store, 0).await;
    let cursor = before.last().unwrap().sequence;

    let mut open = pool.begin().await.unwrap();
    sqlx::query("UPDATE reservations SET extensions_used = extensions_used + 1 WHERE id = $1")
        .bind(slow.id)
        .execute(&mut *open)
        .await
        .unwrap();
    let (fast, _) = held(&store, "bob", "fast", LONG).await;
    let committed: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE sequence > $1")
        .bind(cursor)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(committed, 2, "the later transactions' events are committed");
    assert!(read_after(&*store, cursor).await.is_empty());
    assert_eq!(store.event_log().latest_sequence().await.unwrap(), cursor);

    open.commit().await.unwrap();
    let late = read_after(&*store, cursor).await;
    let types: Vec<(Uuid, EventType)> = late
        .iter()
        .map(|e| (e.reservation.id, e.event_type))
        .collect();
    assert_eq!(
        types,
        [
            (slow.id, EventType::Extended),
            (fast.id, EventType::Trying),
            (fast.id, EventType::Held)
        ]
    );
    assert_increasing(&late);
    let latest = store.event_log().latest_sequence().await.unwrap();
    assert_eq!(latest, late[2].sequence);
}

/// PostgreSQL: two replicas (stores on one database) write at once while a reader
/// follows; the reader ends with every event exactly once, in each reservation's order.
pub async fn two_replicas_writing_lose_nothing(pool: PgPool) {
    crate::postgres(pool.clone()).await;
    let replicas: Vec<S> = vec![
        Arc::new(PgStore::from_pool(pool.clone())),
        Arc::new(PgStore::from_pool(pool.clone())),
    ];
    let mut writers = tokio::task::JoinSet::new();
    for (r, store) in replicas.iter().enumerate() {
        for w in 0..8 {
            let store = store.clone();
            writers.spawn(async move {
                for i in 0..5 {
                    let (h, token) = held(&store, "alice", &format!("r{r}-w{w}-{i}"), LONG).await;
                    decide(&store, h.id, &token, &cancel()).await;
                }
            });
        }
    }
    let reader = replicas[0].clone();
    let mut seen: Vec<Event> = Vec::new();
    while !writers.is_empty() {
        let after = seen.last().map_or(0, |e| e.sequence);
        seen.extend(read_after(&*reader, after).await);
        if let Some(done) = writers.try_join_next() {
            done.unwrap();
        }
        tokio::task::yield_now().await;
    }
    let after = seen.last().map_or(0, |e| e.sequence);
    seen.extend(read_after(&*reader, after).await);
    assert_eq!(seen.len(), 2 * 8 * 5 * 3);
    assert_increasing(&seen);
    let ids: BTreeSet<Uuid> = seen.iter().map(|e| e.reservation.id).collect();
    for id in ids {
        use EventType::*;
        assert_eq!(types_of(&seen, id), [Trying, Held, Cancelling]);
    }
}

/// PostgreSQL: transaction ids are the server's, but a transaction left open in another
/// database never appends here, so it holds no reader of this log back: what commits here
/// after it is readable at once.
pub async fn another_database_s_open_transaction_holds_no_reader_back(pool: PgPool) {
    use sqlx::Connection;
    let store: S = crate::postgres(pool.clone()).await;
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut elsewhere = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut open = elsewhere.begin().await.unwrap();
    let foreign: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut *open)
        .await
        .unwrap();
    let (h, _) = held(&store, "alice", "after-foreign", LONG).await;
    let ours: String = sqlx::query_scalar(
        "SELECT min(sequence >> 20)::text FROM events WHERE reservation_id = $1",
    )
    .bind(h.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        ours.parse::<i64>().unwrap() > foreign.parse::<i64>().unwrap(),
        "this database's transaction started after the other's"
    );
    let readable = read_after(&*store, 0).await;
    assert_eq!(
        types_of(&readable, h.id),
        [EventType::Trying, EventType::Held]
    );
    open.rollback().await.unwrap();
}
