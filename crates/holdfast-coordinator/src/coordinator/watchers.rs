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
//! - **Caps.** At most `per_process` streams open at once, `per_connection` per client
//!   connection (its two addresses; an HTTP connection's for a JSON API stream) and
//!   `per_principal` per caller (the anonymous caller of an auth-off server is one); beyond,
//!   [`Error::WatchLimit`] naming the cap. A stream's [`Slot`] is freed when it ends or its
//!   client goes away.
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
    /// Streams open at once by one principal.
    pub per_principal: usize,
    /// How often the shared poller reads the version of every watched reservation.
    pub poll: Duration,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            per_process: 1024,
            per_connection: 32,
            per_principal: 256,
            poll: Duration::from_millis(250),
        }
    }
}

/// Which cap a refused watch ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchScope {
    Process,
    Connection,
    Principal,
}

/// The client connection a stream came on: both its ends, so connections from one client port
/// to two listeners are two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WatchConnection {
    pub local: Option<SocketAddr>,
    pub remote: SocketAddr,
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
    per_connection: HashMap<WatchConnection, usize>,
    per_principal: HashMap<String, usize>,
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
    connection: Option<WatchConnection>,
    principal: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.watchers.lock();
        inner.open = inner.open.saturating_sub(1);
        if let Some(c) = self.connection {
            release(&mut inner.per_connection, &c);
        }
        release(&mut inner.per_principal, &self.principal);
    }
}

/// One stream fewer under `key`'s count (forgotten at zero).
fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(key);
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

    /// Takes a slot for one more stream by `principal` (empty: the anonymous caller) from
    /// `connection`, or says which cap is full (nothing taken then).
    pub fn admit(
        self: &Arc<Self>,
        principal: &str,
        connection: Option<WatchConnection>,
    ) -> Result<Slot, Error> {
        if *self.closing.borrow() {
            return Err(Error::ShuttingDown);
        }
        let limits = self.limits;
        let full = |limit, scope| Err(Error::WatchLimit { limit, scope });
        let mut inner = self.lock();
        if inner.open >= limits.per_process {
            return full(limits.per_process, WatchScope::Process);
        }
        let on_connection =
            connection.map_or(0, |c| inner.per_connection.get(&c).copied().unwrap_or(0));
        if connection.is_some() && on_connection >= limits.per_connection {
            return full(limits.per_connection, WatchScope::Connection);
        }
        if inner.per_principal.get(principal).copied().unwrap_or(0) >= limits.per_principal {
            return full(limits.per_principal, WatchScope::Principal);
        }
        if let Some(c) = connection {
            *inner.per_connection.entry(c).or_default() += 1;
        }
        *inner.per_principal.entry(principal.to_owned()).or_default() += 1;
        inner.open += 1;
        Ok(Slot {
            watchers: self.clone(),
            connection,
            principal: principal.to_owned(),
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
