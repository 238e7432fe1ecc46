//! The hub behind `WatchReservation`: who watches what, how many may, one shared poller for
//! all of them, and the end of every stream at shutdown.
//!
//! - **Events.** Every reservation a store write of this process returns is published to the
//!   watchers of that reservation ([`super::watch::Publishing`]).
//! - **One poller.** Changes made by other replicas, and lazy expiry (which writes nothing), are
//!   found by one task per process: every `poll` it asks the store for the version of every
//!   watched reservation in one statement ([`crate::store::Store::versions`]) and reads in
//!   full only those that changed. It runs while anything is watched. (Not PostgreSQL
//!   `LISTEN/NOTIFY`: a notifying transaction takes a database-wide lock through its commit,
//!   which would serialise every write of the hot path for the sake of a few watchers.)
//! - **Caps.** At most `per_process` streams open at once, and `per_connection` per client
//!   connection (its remote address); beyond, [`Error::WatchLimit`]. A stream's [`Slot`] is
//!   freed when it ends or its client goes away.
//! - **Shutdown.** [`Watchers::close`] ends every open stream with [`Error::ShuttingDown`] and
//!   refuses new ones, so a graceful shutdown does not wait for streams that could run until
//!   their hold's `max_ttl`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;
use uuid::Uuid;

use super::Error;
use crate::domain::Reservation;
use crate::store::Store;

/// Bounds on `WatchReservation` streams, and how often the shared poller looks.
#[derive(Clone, Copy, Debug)]
pub struct WatchLimits {
    /// Streams open at once in this process.
    pub per_process: usize,
    /// Streams open at once on one client connection.
    pub per_connection: usize,
    /// How often the shared poller reads the version of every watched reservation.
    pub poll: Duration,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            per_process: 1024,
            per_connection: 32,
            poll: Duration::from_millis(250),
        }
    }
}

/// Which cap a refused watch ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchScope {
    Process,
    Connection,
}

/// What watchers last saw of a reservation: (version, lapsed).
type Seen = (i64, bool);

/// One reservation's channel, and what its watchers last saw.
struct Channel {
    tx: broadcast::Sender<Arc<Reservation>>,
    seen: Option<Seen>,
}

impl Channel {
    /// Records `r` as seen, unless something newer was: versions only grow, and a lapsed read
    /// is newer than the same version unlapsed.
    fn see(&mut self, r: &Reservation) {
        let stamp = (r.version, lapsed(r));
        if self.seen.is_none_or(|seen| stamp > seen) {
            self.seen = Some(stamp);
        }
    }
}

#[derive(Default)]
struct Inner {
    channels: HashMap<Uuid, Channel>,
    open: usize,
    per_connection: HashMap<SocketAddr, usize>,
    polling: bool,
}

/// Per-reservation broadcast channels, the caps, the poller's state and the shutdown signal.
pub struct Watchers {
    limits: WatchLimits,
    inner: Mutex<Inner>,
    closing: tokio::sync::watch::Sender<bool>,
}

/// A stream's place under the caps; given back when dropped.
pub struct Slot {
    watchers: Arc<Watchers>,
    connection: Option<SocketAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.watchers.lock();
        inner.open = inner.open.saturating_sub(1);
        if let Some(c) = self.connection
            && let Some(n) = inner.per_connection.get_mut(&c)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.per_connection.remove(&c);
            }
        }
    }
}

/// Whether a reservation reads lapsed (`HELD` past `expires_at`, read as `EXPIRED`).
fn lapsed(r: &Reservation) -> bool {
    r.state != r.stored_state
}

impl Watchers {
    pub fn new(limits: WatchLimits) -> Watchers {
        Watchers {
            limits,
            inner: Mutex::new(Inner::default()),
            closing: tokio::sync::watch::Sender::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Takes a slot for one more stream from `connection`, or says which cap is full.
    pub fn admit(self: &Arc<Self>, connection: Option<SocketAddr>) -> Result<Slot, Error> {
        if *self.closing.borrow() {
            return Err(Error::ShuttingDown);
        }
        let mut inner = self.lock();
        if inner.open >= self.limits.per_process {
            return Err(Error::WatchLimit {
                limit: self.limits.per_process,
                scope: WatchScope::Process,
            });
        }
        if let Some(c) = connection {
            let n = inner.per_connection.entry(c).or_default();
            if *n >= self.limits.per_connection {
                return Err(Error::WatchLimit {
                    limit: self.limits.per_connection,
                    scope: WatchScope::Connection,
                });
            }
            *n += 1;
        }
        inner.open += 1;
        Ok(Slot {
            watchers: self.clone(),
            connection,
        })
    }

    /// Subscribes to the changes of one reservation; starts the shared poller if it is not
    /// running.
    pub fn subscribe(
        self: &Arc<Self>,
        id: Uuid,
        store: &Arc<dyn Store>,
    ) -> broadcast::Receiver<Arc<Reservation>> {
        let mut inner = self.lock();
        inner.channels.retain(|_, c| c.tx.receiver_count() > 0);
        let rx = inner
            .channels
            .entry(id)
            .or_insert_with(|| Channel {
                tx: broadcast::channel(16).0,
                seen: None,
            })
            .tx
            .subscribe();
        if !inner.polling {
            inner.polling = true;
            tokio::spawn(poll(self.clone(), store.clone()));
        }
        rx
    }

    /// What a watcher read itself: the poller compares against it.
    pub fn saw(&self, r: &Reservation) {
        if let Some(c) = self.lock().channels.get_mut(&r.id) {
            c.see(r);
        }
    }

    /// Tells the watchers of `r` (if any) about it.
    pub fn publish(&self, r: &Reservation) {
        let mut inner = self.lock();
        if let Some(c) = inner.channels.get_mut(&r.id) {
            c.see(r);
            let _ = c.tx.send(Arc::new(r.clone()));
        }
    }

    /// Ends every open stream (each with [`Error::ShuttingDown`]) and refuses new ones.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Resolves once [`Watchers::close`] was called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// The watched reservations (dropping channels nobody listens to any more); `None` when
    /// nothing is watched, and the poller then stops.
    fn watched(&self) -> Option<Vec<(Uuid, Option<Seen>)>> {
        let mut inner = self.lock();
        inner.channels.retain(|_, c| c.tx.receiver_count() > 0);
        if inner.channels.is_empty() {
            inner.polling = false;
            return None;
        }
        Some(inner.channels.iter().map(|(id, c)| (*id, c.seen)).collect())
    }
}

/// The shared poller: runs while anything is watched and the process is not closing.
async fn poll(watchers: Arc<Watchers>, store: Arc<dyn Store>) {
    let closed = watchers.closed();
    tokio::pin!(closed);
    loop {
        tokio::select! {
            _ = &mut closed => {
                watchers.lock().polling = false;
                return;
            }
            _ = tokio::time::sleep(watchers.limits.poll) => {}
        }
        let Some(watched) = watchers.watched() else {
            return;
        };
        let ids: Vec<Uuid> = watched.iter().map(|(id, _)| *id).collect();
        let stamps = match store.versions(&ids).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "watch poll failed; retrying");
                continue;
            }
        };
        crate::telemetry::watch_poll(ids.len());
        let seen: HashMap<Uuid, Option<Seen>> = watched.into_iter().collect();
        for s in stamps {
            let changed = seen
                .get(&s.id)
                .is_some_and(|seen| seen.is_none_or(|(v, l)| (s.version, s.lapsed) > (v, l)));
            if !changed {
                continue;
            }
            match store.get(s.id).await {
                Ok(Some(r)) => watchers.publish(&r),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, id = %s.id, "watch read failed"),
            }
        }
    }
}
