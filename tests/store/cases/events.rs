//! The event log (SPEC 10): every change appends an event in its own transaction, numbered
//! in the order readers receive them, resumable after any number; owner scoping; the sinks'
//! cursors, leases, pauses; retention behind the slowest sink. PostgreSQL alone: a
//! transaction held open while later ones commit is neither skipped nor repeated, and two
//! replicas writing and numbering at once lose nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use holdfast::domain::{BranchState, Event, EventType, State};
use holdfast::store::events::EventPage;
use holdfast::store::{PgStore, Store};
use sqlx::PgPool;
use uuid::Uuid;

use super::{FAST, LONG, S, cancel, confirm, decide, held, lease, reports};

/// Numbers what is committed (PostgreSQL's sequencer; nothing to do on SQLite).
async fn number(store: &dyn Store) {
    while !store
        .event_log()
        .sequence_events(1000)
        .await
        .unwrap()
        .is_empty()
    {}
}

/// Every numbered event after `after` (all owners).
async fn read_after(store: &dyn Store, after: i64) -> Vec<Event> {
    number(store).await;
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

/// Sequences strictly increase, and (numbers never being skipped) without a hole.
fn assert_dense(events: &[Event]) {
    for pair in events.windows(2) {
        assert_eq!(pair[1].sequence, pair[0].sequence + 1, "a hole or a repeat");
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
    assert_dense(&events);
    assert_eq!(events[0].sequence, 1);
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
    // Resuming after any number gives exactly the rest.
    for k in 0..events.len() {
        let rest = read_after(&*store, events[k].sequence).await;
        let want: Vec<Uuid> = events[k + 1..].iter().map(|e| e.event_id).collect();
        assert_eq!(rest.iter().map(|e| e.event_id).collect::<Vec<_>>(), want);
    }
}

pub async fn readers_see_only_their_owner_s_events(store: S) {
    let mut mine = super::new_res("alice", "own-1", LONG);
    mine.owner = "shop-a".into();
    let mut theirs = super::new_res("alice", "own-2", LONG);
    theirs.owner = "shop-b".into();
    for new in [&mine, &theirs] {
        store.create(new, lease(), super::NO_LIMITS).await.unwrap();
    }
    number(&*store).await;
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
    assert_eq!(after[0].sequence, events[5].sequence + 1);
}

/// PostgreSQL: an event whose transaction stays open while later ones commit and are read
/// gets a number only when it commits; a reader that went past the others then reads it once.
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
    let meanwhile = read_after(&*store, cursor).await;
    assert_eq!(
        types_of(&meanwhile, fast.id),
        [EventType::Trying, EventType::Held]
    );
    assert!(types_of(&meanwhile, slow.id).is_empty());
    let cursor = meanwhile.last().unwrap().sequence;

    open.commit().await.unwrap();
    let late = read_after(&*store, cursor).await;
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].event_type, EventType::Extended);
    assert_eq!(late[0].reservation.id, slow.id);
    assert_eq!(late[0].sequence, cursor + 1);
}

/// PostgreSQL: two replicas (stores on one database) write and number at once while a reader
/// follows; the reader ends with every event exactly once, in each reservation's order.
pub async fn two_replicas_writing_and_numbering_lose_nothing(pool: PgPool) {
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
                    number(&*store).await;
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
    assert_dense(&seen);
    let ids: BTreeSet<Uuid> = seen.iter().map(|e| e.reservation.id).collect();
    for id in ids {
        use EventType::*;
        assert_eq!(types_of(&seen, id), [Trying, Held, Cancelling]);
    }
}
