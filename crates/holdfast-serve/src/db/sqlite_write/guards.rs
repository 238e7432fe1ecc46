//! The guards that make the writer clean up after a write that left early: one that gave up
//! waiting for the lock ([`Queued`]), one dropped unfinished ([`Abandon`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Writer;

/// Counts a write queued for the lock until it has it. Giving up instead (its wait timed out
/// or its task was cancelled), it may be the write a finishing member handed the group to: the
/// writer is told to clean up ([`Writer::clean_up_soon`]), which commits a group nobody is left
/// to commit.
pub(super) struct Queued<'w>(&'w Arc<Writer>);

impl<'w> Queued<'w> {
    pub(super) fn new(writer: &'w Arc<Writer>) -> Queued<'w> {
        writer.queued.fetch_add(1, Ordering::AcqRel);
        Queued(writer)
    }

    pub(super) fn arrived(self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
        std::mem::forget(self);
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
        self.0.clean_up_soon();
    }
}

/// A write dropped unfinished: the writer undoes its part and, if it was in a group nobody else
/// will commit, commits the group ([`Writer::clean_up_soon`]).
pub(super) struct Abandon {
    pub(super) writer: Arc<Writer>,
    pub(super) armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if self.armed {
            self.writer.clean_up_soon();
        }
    }
}
