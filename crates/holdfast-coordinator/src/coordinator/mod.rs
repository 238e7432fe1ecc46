//! The coordinator: the reservation lifecycle driven across participants.
//!
//! Reserve places holds one participant at a time in canonical order, all-or-nothing.
//! Confirm and Cancel take their decision durably (in the store, under the row lock) before
//! any participant hears of it, then fan out in parallel. Release (cancel, expiry, rejection)
//! goes through one path, [`Coordinator::drive_release`]; confirmation through
//! [`Coordinator::drive_confirm`].
//!
//! By lifecycle phase: `place` (Reserve), `decide` (Confirm, Cancel), `extend` (Extend: told
//! to every participant before it is recorded), `payment_check`
//! (a Confirm's payment checked with its payments service), `drive` (the confirm, release and
//! refund fan-outs), `sold_out` (refusing a sold-out hold before anything is
//! recorded), `late_payment` (re-placing released holds),
//! `recovery` (the reaper and recovery loop), `on_demand` (one reaper pass, or one
//! reservation made due and released, within a call: test mode), `unregistered` (work waiting on a participant no
//! longer registered, reported at start), `watch` (WatchReservation) and `watchers` (its hub:
//! caps, the shared poller, shutdown), `subscribe` (Events/Subscribe), `waitlist` (queues
//! joined when sold out, and the offers of released units). This module
//! holds the [`Coordinator`] itself and its reads.

pub mod admin;
mod decide;
mod drive;
pub mod error;
mod extend;
mod faults;
mod inventory;
mod late_payment;
pub mod on_demand;
mod payment_check;
mod payments_read;
mod place;
pub mod policy;
pub mod recovery;
pub mod retention;
pub mod sold_out;
mod subscribe;
mod unregistered;
pub mod waitlist;
pub mod watch;
pub mod watchers;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use error::Error;
pub use place::Reserved;
pub use policy::Policy;
pub use retention::Retention;
pub(crate) use subscribe::Delivery;
pub use watchers::{WatchConnection, WatchLimits, WatchScope};

use crate::domain::validate::{self, Limits};
use crate::domain::{Actor, ListQuery, RefundState, Reservation, State, TokenKeys};
use crate::registry::Registry;
use crate::store::{Store, WorkLease};

/// A page of reservations and the cursor of the next page.
#[derive(Debug)]
pub struct Page {
    pub reservations: Vec<Reservation>,
    pub next: Option<(DateTime<Utc>, Uuid)>,
}

/// Drives reservations through their lifecycle.
#[derive(Clone)]
pub struct Coordinator {
    /// This instance, as a lease owner.
    instance: Uuid,
    store: Arc<dyn Store>,
    registry: Registry,
    limits: Limits,
    policy: Policy,
    /// Derive hold tokens (never stored; see `domain::token`).
    tokens: Arc<TokenKeys>,
    watchers: Arc<watchers::Watchers>,
    /// Refusals remembered so a sold-out hold is refused without a write (`sold_out`).
    sold_out: Arc<sold_out::SoldOutHints>,
    /// The waitlists as this process sees them (`waitlist`).
    waitlist: Arc<waitlist::Waitlist>,
    /// Taken by each sweep of the recovery loop and by an on-demand pass
    /// ([`Coordinator::sweep_now`]) for its whole length, so the two never claim side by side.
    sweeps: Arc<tokio::sync::Mutex<()>>,
    /// The event log as readers and sinks see it (SPEC 10).
    events: crate::events::EventFeed,
    /// What [`Coordinator::run_events`] moves the feed's latest sequence with.
    events_latest: Arc<tokio::sync::watch::Sender<i64>>,
    /// Notified after each write of this process, so its events are numbered at once.
    written: Arc<tokio::sync::Notify>,
}

impl Coordinator {
    pub fn new(
        store: Arc<dyn Store>,
        registry: Registry,
        limits: Limits,
        policy: Policy,
        tokens: TokenKeys,
    ) -> Coordinator {
        let watchers = Arc::new(watchers::Watchers::new(policy.watch));
        let sold_out = Arc::new(sold_out::SoldOutHints::new(policy.sold_out_hint));
        let (events, events_latest) = crate::events::EventFeed::new(store.clone());
        let written = Arc::new(tokio::sync::Notify::new());
        Coordinator {
            instance: Uuid::new_v4(),
            store: Arc::new(watch::Publishing {
                inner: store,
                watchers: watchers.clone(),
                written: written.clone(),
            }),
            registry,
            limits,
            policy,
            tokens: Arc::new(tokens),
            watchers,
            sold_out,
            waitlist: Arc::default(),
            sweeps: Arc::default(),
            events,
            events_latest: Arc::new(events_latest),
            written,
        }
    }

    /// The event log (SPEC 10): pages after a sequence, the latest sequence, the sinks' state.
    pub fn events(&self) -> &crate::events::EventFeed {
        &self.events
    }

    /// Reads where the event log stands, before this process serves: the feed starts there and
    /// [`Coordinator::run_events`] counts every event appended after it, the first RPC's
    /// included (were it read by the loop's first pass, events written before that pass would
    /// never count). What was appended before this process started is not counted again.
    pub(crate) async fn start_events(&self) -> Result<(), crate::store::StoreError> {
        let latest = self.store.event_log().latest_sequence().await?;
        self.events_latest.send_replace(latest);
        Ok(())
    }

    /// Follows the event log's latest sequence (and counts what is appended) until `stop`
    /// turns true; one loop per process, started after [`Coordinator::start_events`].
    pub async fn run_events(self, stop: tokio::sync::watch::Receiver<bool>) {
        crate::events::run_follower(
            self.store.clone(),
            self.events_latest.clone(),
            self.written.clone(),
            stop,
        )
        .await;
    }

    fn lease(&self) -> WorkLease {
        WorkLease {
            owner: self.instance,
            duration: self.policy.lease,
        }
    }

    /// How long this instance owns work it takes (`--lease`): reservations it drives, and the
    /// event sinks it delivers.
    pub fn lease_duration(&self) -> std::time::Duration {
        self.policy.lease
    }

    /// The input limits requests are checked against (the API parses ids with them).
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Reads one reservation; another principal's does not exist for a client.
    pub async fn get(&self, actor: &Actor, id: Uuid) -> Result<Reservation, Error> {
        let r = self.read(id).await?;
        if actor.sees(&r) {
            self.with_queue(r).await
        } else {
            Err(Error::NotFound(id))
        }
    }

    async fn read(&self, id: Uuid) -> Result<Reservation, Error> {
        self.store.get(id).await?.ok_or(Error::NotFound(id))
    }

    /// Whether the database accepts writes now: one small committed write (readiness).
    pub async fn probe_write(&self) -> Result<(), Error> {
        Ok(self.store.probe_write().await?)
    }

    /// Lists reservations newest first: a client's own only.
    pub async fn list(&self, actor: &Actor, mut query: ListQuery) -> Result<Page, Error> {
        query.owner = actor.scope().map(str::to_owned);
        validate::list_filters(&query, &self.limits)?;
        let page_size = if query.limit == 0 {
            self.limits.default_page_size
        } else {
            query.limit.min(self.limits.max_page_size)
        };
        query.limit = page_size + 1;
        let mut reservations = self.store.list(&query).await?;
        let next = if reservations.len() > page_size as usize {
            reservations.truncate(page_size as usize);
            reservations.last().map(|r| (r.created_at, r.id))
        } else {
            None
        };
        Ok(Page { reservations, next })
    }
}

/// Counts a transition the caller asked for, if the reservation is now in that state.
fn entered(r: &Reservation, to: State) {
    if r.stored_state == to {
        crate::telemetry::reservation_entered(to);
    }
}

/// Counts a refund the caller recorded, if there is one pending.
fn refund_recorded(r: &Reservation) {
    if r.refund
        .as_ref()
        .is_some_and(|f| f.state == RefundState::Pending)
    {
        crate::telemetry::refund(RefundState::Pending);
    }
}
