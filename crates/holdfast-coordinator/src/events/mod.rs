//! Events (SPEC 10) in the coordinator: the database appends and numbers them
//! (`store/events.rs`); here each process runs one loop, [`run_follower`], that counts what
//! became readable and follows the latest sequence, which the [`EventFeed`] hands to readers
//! (Subscribe, the JSON API) and sinks so they wake when there is more to read instead of each
//! polling the database. One reader's paging, filtering and heartbeats are [`subscription`].

pub(crate) mod subscription;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::domain::Event;
use crate::store::events::{EventLog, EventPage};
use crate::store::{Store, StoreError};

/// Events the follower reads per pass.
const FOLLOW_BATCH: u32 = 1000;

/// The shortest time between two passes while this process writes: under load the writes of
/// this long are read in one pass (one query) and readers wake once for them. Each pass costs
/// the database a horizon and a read of what was appended (BENCHMARKS.md "Events": at 20 ms
/// the passes cost about as much as the sink's own reads).
const PASS_INTERVAL: Duration = Duration::from_millis(100);

/// How often the loop looks for events when this process wrote nothing meanwhile (what other
/// replicas and background statements wrote is seen this late at most).
const IDLE_TICK: Duration = Duration::from_millis(250);

/// The largest page a reader may ask for.
pub const MAX_PAGE: u32 = 1000;

/// The log as readers and sinks see it: pages after a sequence, and the latest sequence this
/// process knows of, which changes as events become readable.
#[derive(Clone)]
pub struct EventFeed {
    store: Arc<dyn Store>,
    latest: watch::Receiver<i64>,
}

impl std::fmt::Debug for EventFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventFeed")
            .field("latest", &*self.latest.borrow())
            .finish()
    }
}

impl EventFeed {
    /// A feed over `store`'s log and the sender its [`run_follower`] moves.
    pub(crate) fn new(store: Arc<dyn Store>) -> (EventFeed, watch::Sender<i64>) {
        let (sender, latest) = watch::channel(0);
        (EventFeed { store, latest }, sender)
    }

    /// The latest sequence known to be readable (from the log's end when the process started;
    /// 0 while the log is empty).
    pub fn latest(&self) -> i64 {
        *self.latest.borrow()
    }

    /// A receiver that changes when [`EventFeed::latest`] moves (for `changed().await`).
    pub fn follow(&self) -> watch::Receiver<i64> {
        self.latest.clone()
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) events after `after`, of `owner`'s reservations
    /// only when given, their branches' states as each change left them where the lifecycle
    /// fixes them ([`Event::with_branch_states_of_its_change`]).
    pub async fn page(
        &self,
        after: i64,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let page = EventPage {
            after: after.max(0),
            owner,
            limit: limit.clamp(1, MAX_PAGE),
        };
        let events = self.store.event_log().events_after(&page).await?;
        Ok(events
            .into_iter()
            .map(Event::with_branch_states_of_its_change)
            .collect())
    }

    /// The store's log: the latest sequence as stored, the sinks' cursors and leases.
    pub fn log(&self) -> &dyn EventLog {
        self.store.event_log()
    }
}

/// Until `stop`: counts the events that became readable by type
/// (`holdfast_events_appended_total`) and publishes the latest sequence to the feed. It runs a
/// pass when this process wrote (`written`, notified by the store's writes; at most one per
/// [`PASS_INTERVAL`]) and otherwise every [`IDLE_TICK`], for what other replicas and
/// background statements wrote: idle, one cheap read per tick.
pub(crate) async fn run_follower(
    store: Arc<dyn Store>,
    latest: Arc<watch::Sender<i64>>,
    written: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    // Where the feed stands: what the process read before serving (`Coordinator::
    // start_events`), or what this loop had published before a panic restarted it.
    let mut known = *latest.borrow();
    loop {
        if *stop.borrow() {
            return;
        }
        crate::background::pass_failpoint("coord.events.pass");
        let started = tokio::time::Instant::now();
        let busy = match pass(&*store, &latest, &mut known).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::warn!(error = %e, "following the event log failed; retrying");
                false
            }
        };
        if busy {
            continue;
        }
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            _ = written.notified() => {}
            _ = tokio::time::sleep(IDLE_TICK) => {}
        }
        tokio::time::sleep_until(started + PASS_INTERVAL).await;
    }
}

/// One pass from `known`: counts the events appended after it and moves it (and the feed) to
/// the last of them; `true` when a full batch was read.
async fn pass(
    store: &dyn Store,
    latest: &watch::Sender<i64>,
    known: &mut i64,
) -> Result<bool, StoreError> {
    let appended = store
        .event_log()
        .appended_after(*known, FOLLOW_BATCH)
        .await?;
    for (_, event_type) in &appended {
        crate::telemetry::ops::event_appended(event_type.as_str());
    }
    let now = appended.last().map_or(*known, |(sequence, _)| *sequence);
    let full = appended.len() >= FOLLOW_BATCH as usize;
    *known = now;
    latest.send_if_modified(|known| {
        let moved = now > *known;
        if moved {
            *known = now;
        }
        moved
    });
    Ok(full)
}
