//! [`Shortcuts`]: the optional fast paths a [`Resource`](crate::Resource) may offer, apart
//! from the contract every participant writes. The SDK takes them in `service.rs` (Confirm,
//! Cancel, Extend), `service/try_phase.rs` (Try), `barrier_only.rs` and `try_batch.rs`.

use async_trait::async_trait;

use crate::barrier::{Backend, HeldBarrierMove, HeldBarrierRow};
use crate::{BranchCtx, DefaultDatabase, ResourceError, TryAnswer};

/// Fast paths for a resource's hot calls, offered from
/// [`Resource::shortcuts`](crate::Resource::shortcuts). None is needed for correctness: each
/// writes what the general way would, in fewer round trips or commits, and any call one of
/// them cannot do (answered `None` / `false`, or an error after writing nothing) goes the
/// general way, which answers repeats, disorder and lost holds.
///
/// When they pay (PostgreSQL; BENCHMARKS.md, "Participant shortcuts", has the rows): a
/// participant with no business data at all ([`Shortcuts::barrier_only`]: each call is one
/// barrier statement, shared by concurrent calls); a Try, Confirm or Cancel that is one
/// statement with its barrier row ([`Shortcuts::try_hold_in_one`],
/// [`Shortcuts::settle_in_one`]: a contended row lock is held inside PostgreSQL only, never
/// over a round trip to this process); and many first Tries contending for one row (a
/// sale's one stock item: [`Shortcuts::try_hold_batch`], the row locked once per batch).
/// A resource that offers `Shortcuts` is asked [`Shortcuts::try_hold_in_one`] for every first
/// Try it does not batch and [`Shortcuts::settle_in_one`] for every Confirm and Cancel, each
/// on a pooled connection of its own: offer them when you write both.
#[async_trait]
pub trait Shortcuts<DB: Backend = DefaultDatabase>: Send + Sync {
    /// True for a participant with no business data (its phases change nothing but the
    /// barrier, `try_hold` always holds, `confirm` always confirms): the SDK then records each
    /// first Try, and each Confirm/Cancel of a held branch, with one barrier statement and no
    /// transaction (on PostgreSQL one statement for many concurrent calls; on SQLite a member
    /// of the writer's group commit), and asks nothing else of this trait. Default: false.
    fn barrier_only(&self) -> bool {
        false
    }

    /// A first Try as one autocommit statement (PostgreSQL): the business change and the
    /// branch's barrier row, `row`'s [`HeldBarrierRow::insert_from`] fed by the change's CTE,
    /// so both are made or neither.
    ///
    /// Answer `Some(Held)` only when the statement inserted the row, `Some(Rejected)` only when
    /// it wrote nothing, and `None` for a branch this statement cannot do or whose row it
    /// found (the SDK goes the general way, [`Resource::try_hold`](crate::Resource::try_hold),
    /// which answers a repeat from the row). An error must mean the statement wrote nothing:
    /// the SDK then goes the general way too (a branch with a row already fails the insert).
    /// Guard the change with [`HeldBarrierRow::absent`] so a repeat takes no lock. Lock order
    /// is the business rows, then the barrier row: a call for the same branch still open (its
    /// row not committed) is waited for with the business locks held, and the rare inversion
    /// against that branch's general way is a deadlock PostgreSQL detects and ends (one call
    /// fails, nothing is lost). Default: `None`.
    async fn try_hold_in_one(
        &self,
        conn: &mut DB::Connection,
        branch: &BranchCtx,
        row: &HeldBarrierRow<'_>,
    ) -> Result<Option<TryAnswer>, ResourceError> {
        let _ = (conn, branch, row);
        Ok(None)
    }

    /// A held branch's Confirm or Cancel (`moved`'s [`HeldBarrierMove::to`]) as one autocommit
    /// statement (PostgreSQL), instead of a transaction of four round trips: `moved`'s
    /// [`HeldBarrierMove::update_if`] as the first CTE, guarded so it moves the row only when
    /// the business change can be made whole, and the business change fed by it, so both are
    /// made or neither.
    ///
    /// Answer `true` only when the statement moved the row; `false` (nothing written) sends
    /// the call the general way ([`Resource::confirm`](crate::Resource::confirm) /
    /// [`Resource::cancel`](crate::Resource::cancel) under the locked row), which answers
    /// repeats, Cancels before their Try and lost holds. An error must mean the statement
    /// wrote nothing: the SDK then goes the general way too. Every other writer of the
    /// branch's business rows must lock its barrier row first (the SDK's ways all do), so the
    /// guard, read in the statement's snapshot, still holds when the row is moved. Default:
    /// `false`.
    async fn settle_in_one(
        &self,
        conn: &mut DB::Connection,
        moved: &HeldBarrierMove<'_>,
    ) -> Result<bool, ResourceError> {
        let _ = (conn, moved);
        Ok(false)
    }

    /// True when concurrent first Tries may be held together ([`Shortcuts::try_hold_batch`],
    /// on PostgreSQL). Default: false.
    fn tries_in_batches(&self) -> bool {
        false
    }

    /// Many first Tries in one transaction (asked only when [`Shortcuts::tries_in_batches`],
    /// for concurrent first Tries of distinct branches, in arrival order): the business change
    /// of each that holds, an answer each, in order. The SDK has inserted their barrier rows
    /// (`Held`) first in this transaction and records those answered `Rejected` in it (or
    /// deletes their rows while orphaned holds exist), so a refused one must leave no
    /// business change. Lock business rows in one order for the whole batch (sorted), as
    /// [`Resource::try_hold`](crate::Resource::try_hold) does for one. An error rolls the batch
    /// back; each of its Tries then runs alone. Default: an error.
    async fn try_hold_batch(
        &self,
        conn: &mut DB::Connection,
        branches: &[&BranchCtx],
    ) -> Result<Vec<TryAnswer>, ResourceError> {
        let _ = (conn, branches);
        Err(ResourceError::Internal(
            "this resource does not hold Tries in batches".into(),
        ))
    }
}
