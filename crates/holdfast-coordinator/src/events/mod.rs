//! Events (SPEC 10) in the coordinator: the database appends them (`store/events.rs`); here
//! each process runs one loop, [`run_sequencer`], that numbers what committed (PostgreSQL;
//! replicas take turns by a row lock), counts what became readable, and follows the latest
//! sequence, which the [`EventFeed`] hands to readers (Subscribe, the JSON API) and sinks so
//! they wake when there is more to read instead of each polling the database. One reader's
//! paging, filtering and heartbeats are [`subscription`].

pub(crate) mod subscription;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::domain::Event;
use crate::store::events::{EventLog, EventPage};
use crate::store::{Store, StoreError};

/// Events numbered per sequencer transaction.
const NUMBER_BATCH: u32 = 1000;

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
    /// A feed over `store`'s log and the sender its [`run_sequencer`] moves.
    pub(crate) fn new(store: Arc<dyn Store>) -> (EventFeed, watch::Sender<i64>) {
        let (sender, latest) = watch::channel(0);
        (EventFeed { store, latest }, sender)
    }

    /// The latest sequence known to be readable (0 before the first pass or while the log is
    /// empty).
    pub fn latest(&self) -> i64 {
        *self.latest.borrow()
    }

    /// A receiver that changes when [`EventFeed::latest`] moves (for `changed().await`).
    pub fn follow(&self) -> watch::Receiver<i64> {
        self.latest.clone()
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) events after `after`, of `owner`'s reservations
    /// only when given.
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
        self.store.event_log().events_after(&page).await
    }

    /// The store's log: the latest sequence as stored, the sinks' cursors and leases.
    pub fn log(&self) -> &dyn EventLog {
        self.store.event_log()
    }
}

/// Until `stop`: numbers committed events, counts them by type
/// (`holdfast_events_appended_total`), and publishes the latest sequence to the feed. It runs
/// a pass when this process wrote (`written`, notified by the store's writes) and otherwise
/// every [`IDLE_TICK`], for what other replicas and background statements wrote: idle, one
/// cheap read per tick.
pub(crate) async fn run_sequencer(
    store: Arc<dyn Store>,
    latest: Arc<watch::Sender<i64>>,
    written: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() {
            return;
        }
        let busy = match pass(&*store, &latest).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::warn!(error = %e, "numbering events failed; retrying");
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
            }
            _ = written.notified() => {}
            _ = tokio::time::sleep(IDLE_TICK) => {}
        }
    }
}

/// One pass; `true` when a full batch was numbered (more may be waiting).
async fn pass(store: &dyn Store, latest: &watch::Sender<i64>) -> Result<bool, StoreError> {
    let log = store.event_log();
    let head = log.head().await?;
    let mut now = head.latest;
    let mut full = false;
    if head.waiting {
        let numbered = log.sequence_events(NUMBER_BATCH).await?;
        for (sequence, event_type) in &numbered {
            crate::telemetry::ops::event_appended(event_type.as_str());
            now = now.max(*sequence);
        }
        full = numbered.len() >= NUMBER_BATCH as usize;
    }
    latest.send_if_modified(|known| {
        let moved = now > *known;
        if moved {
            *known = now;
        }
        moved
    });
    Ok(full)
}
