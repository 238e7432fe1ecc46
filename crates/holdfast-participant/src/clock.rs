//! The participant's host clock, and what a test deployment (`holdfast --test-mode`, the
//! testkit) moves of it: an offset added to every host-clock read that bounds a hold
//! (`--max-hold`), and the orphan reclaims run right after the clock moved. The reclaim itself
//! reads the database clock, which a test deployment moves on its own (the server crate's test mode).
//!
//! Outside test mode the offset stays zero and nobody registers a reclaim: a Try pays one
//! relaxed atomic load.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use super::ResourceError;

/// Something that releases holds past `expires_at + orphan_grace` on demand: a running
/// [`super::ParticipantService`].
pub trait OrphanReclaim: Send + Sync {
    /// Reclaims the orphans due now; how many.
    fn reclaim_now(&self) -> BoxFuture<'_, Result<usize, ResourceError>>;
}

/// The clock a participant reads for input bounds, shared by every participant of one
/// deployment (cheap to clone: one allocation shared). [`ParticipantClock::default`] is the
/// host clock, never moved.
#[derive(Clone, Default)]
pub struct ParticipantClock {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Microseconds added to the host clock; only ever moved forward.
    offset_us: AtomicI64,
    /// The reclaims of the participants serving with this clock (dropped when they stop).
    reclaims: Mutex<Vec<Weak<dyn OrphanReclaim>>>,
}

impl std::fmt::Debug for ParticipantClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParticipantClock")
            .field("offset_us", &self.inner.offset_us.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ParticipantClock {
    /// The host's clock plus the offset.
    pub fn now(&self) -> DateTime<Utc> {
        let offset = self.inner.offset_us.load(Ordering::Relaxed);
        let now = Utc::now();
        if offset == 0 {
            return now;
        }
        now.checked_add_signed(chrono::Duration::microseconds(offset))
            .unwrap_or(now)
    }

    /// How far this clock is ahead of the host's, in microseconds (zero outside test mode):
    /// for a participant whose own store keeps another clock (Redis's), to read it moved alike.
    pub fn offset_us(&self) -> i64 {
        self.inner.offset_us.load(Ordering::Relaxed)
    }

    /// Moves the offset to `offset_us` microseconds, unless it is already there or beyond
    /// (the clock never moves back).
    pub fn move_to(&self, offset_us: i64) {
        self.inner.offset_us.fetch_max(offset_us, Ordering::Relaxed);
    }

    /// Runs `reclaim` after every move ([`ParticipantClock::reclaim_orphans`]) for as long as
    /// the caller keeps it alive.
    pub fn register_reclaim(&self, reclaim: &Arc<dyn OrphanReclaim>) {
        let mut reclaims = self
            .inner
            .reclaims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        reclaims.retain(|r| r.strong_count() > 0);
        reclaims.push(Arc::downgrade(reclaim));
    }

    /// Runs every live participant's orphan reclaim once, one after the other; how many holds
    /// they reclaimed. A failure is logged and the others still run.
    pub async fn reclaim_orphans(&self) -> usize {
        let live: Vec<Arc<dyn OrphanReclaim>> = self
            .inner
            .reclaims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut reclaimed = 0;
        for reclaim in live {
            match reclaim.reclaim_now().await {
                Ok(n) => reclaimed += n,
                Err(e) => tracing::warn!(error = %e, "orphan reclaim after a clock move failed"),
            }
        }
        reclaimed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_moves_forward_only() {
        let clock = ParticipantClock::default();
        let host = Utc::now();
        clock.move_to(3_600_000_000);
        clock.move_to(1_000_000);
        let ahead = clock.now() - host;
        assert!(ahead >= chrono::Duration::hours(1), "{ahead}");
        assert!(ahead < chrono::Duration::hours(1) + chrono::Duration::minutes(1));
    }
}
