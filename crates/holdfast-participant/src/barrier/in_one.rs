//! Barrier fragments for a resource that writes its business change and the branch's barrier
//! row in one autocommit statement (PostgreSQL only): a first Try's row ([`HeldBarrierRow`])
//! and a held branch's move to `confirmed` or `cancelled` ([`HeldBarrierMove`]). The SDK
//! binds the barrier's values; the resource writes the rest of the statement around them.

#[cfg(feature = "postgres")]
use sqlx::postgres::{PgArguments, PgRow};
#[cfg(feature = "postgres")]
use sqlx::query::Query;
#[cfg(feature = "postgres")]
use sqlx::{Postgres, Row};

use super::BarrierPhase;
#[cfg(feature = "postgres")]
use super::encode_items;
use crate::{BranchCtx, BranchKey};
#[cfg(feature = "postgres")]
use crate::{ResourceError, TryAnswer};

/// A first Try's barrier row, answered `Held`, for a resource that writes its Try and this row
/// in one statement ([`crate::Shortcuts::try_hold_in_one`], PostgreSQL only: without the
/// `postgres` feature it only names the trait method's parameter).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub struct HeldBarrierRow<'a> {
    participant: &'a str,
    branch: &'a BranchCtx,
}

impl<'a> HeldBarrierRow<'a> {
    pub(crate) fn new(participant: &'a str, branch: &'a BranchCtx) -> Self {
        Self {
            participant,
            branch,
        }
    }

    /// The branch's row, inserted once for each row `from` (a CTE of the statement: the
    /// business change, one row when it was made, none when it was not) returns:
    /// `INSERT INTO tcc_barrier ... SELECT ... FROM {from} RETURNING 1`, its seven values the
    /// parameters `$first` to `$first + 6` ([`HeldBarrierRow::bind`]). It has no `ON
    /// CONFLICT`: when the branch has a row already (a repeat, a Cancel that came first), the
    /// statement fails as a whole and undoes the business change with it.
    pub fn insert_from(from: &str, first: usize) -> String {
        let p = |i: usize| format!("${}", first + i);
        format!(
            "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer, \
                                      holder, items, expires_at, reclaim_after) \
             SELECT {}::text, {}::text, {}::text, 'held', 'held', {}::text, {}::jsonb, \
                    {}::timestamptz, {}::timestamptz \
             FROM {from} RETURNING 1",
            p(0),
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        )
    }

    /// True when the branch has no committed row (the statement's snapshot), on the
    /// parameters of [`HeldBarrierRow::insert_from`] numbered from the same `first`. A guard
    /// for the business change, so a repeat Try takes no business lock before its insert
    /// fails; the statement should then say it found the row (answer `None`).
    pub fn absent(first: usize) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM tcc_barrier WHERE participant = ${}::text \
             AND reservation_id = ${}::text AND branch_id = ${}::text)",
            first,
            first + 1,
            first + 2
        )
    }

    /// The answer of a statement that selects `held` (the rows [`HeldBarrierRow::insert_from`]
    /// inserted: `(SELECT count(*) FROM barrier)`) and `found` (`NOT` [`HeldBarrierRow::absent`]):
    /// `Held` when it inserted the row, `None` (go the general way) when the branch had one,
    /// else what `refused` makes of the row (nothing was written).
    #[cfg(feature = "postgres")]
    pub fn answer(
        row: &PgRow,
        refused: impl FnOnce(&PgRow) -> Result<TryAnswer, ResourceError>,
    ) -> Result<Option<TryAnswer>, ResourceError> {
        if row.try_get::<i64, _>("held")? == 1 {
            Ok(Some(TryAnswer::Held))
        } else if row.try_get("found")? {
            Ok(None)
        } else {
            refused(row).map(Some)
        }
    }

    /// Binds the row's seven values, in [`HeldBarrierRow::insert_from`]'s order; call it when
    /// the query's parameters before `$first` are bound.
    #[cfg(feature = "postgres")]
    pub fn bind<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments>
    where
        'a: 'q,
    {
        let branch = self.branch;
        query
            .bind(self.participant)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(&branch.holder)
            .bind(encode_items(&branch.items))
            .bind(branch.expires_at)
            .bind(branch.hold_until)
    }
}

/// A held branch's barrier row moved to `confirmed` or `cancelled` ([`HeldBarrierMove::to`])
/// by a resource that writes its Confirm or Cancel and this move in one statement
/// ([`crate::Shortcuts::settle_in_one`], PostgreSQL only).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub struct HeldBarrierMove<'a> {
    participant: &'a str,
    key: &'a BranchKey,
    to: BarrierPhase,
}

impl<'a> HeldBarrierMove<'a> {
    pub(crate) fn new(participant: &'a str, key: &'a BranchKey, to: BarrierPhase) -> Self {
        Self {
            participant,
            key,
            to,
        }
    }

    /// Where the row goes: [`BarrierPhase::Confirmed`] or [`BarrierPhase::Cancelled`].
    pub fn to(&self) -> BarrierPhase {
        self.to
    }

    /// The move, for a CTE of the statement: `UPDATE tcc_barrier b SET state = ... WHERE` the
    /// branch's row, held, `AND ({guard}) RETURNING b.items`, on the parameters
    /// `$first` to `$first + 3` ([`HeldBarrierMove::bind`]); the branch's reservation id is
    /// `$first + 1` and its branch id `$first + 2` (text), for the business change. `guard`
    /// may read `b.items` (the branch's items, a JSON array): make it true only when the
    /// business change can be made whole, and feed that change from this CTE
    /// (`... AND EXISTS (SELECT 1 FROM moved)`), so both are made or neither (PostgreSQL runs
    /// every data-modifying CTE to completion, read or not). The barrier row is the first row
    /// the statement locks, as on the SDK's general way.
    pub fn update_if(first: usize, guard: &str) -> String {
        format!(
            "UPDATE tcc_barrier b SET state = ${}::text, updated_at = clock_timestamp() \
             WHERE b.participant = ${}::text AND b.reservation_id = ${}::text \
               AND b.branch_id = ${}::text AND b.state || '' = 'held' AND ({guard}) \
             RETURNING b.items",
            first + 3,
            first,
            first + 1,
            first + 2,
        )
    }

    /// Binds the move's four values, in [`HeldBarrierMove::update_if`]'s order; call it when
    /// the query's parameters before `$first` are bound.
    #[cfg(feature = "postgres")]
    pub fn bind<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments>
    where
        'a: 'q,
    {
        query
            .bind(self.participant)
            .bind(&self.key.reservation_id)
            .bind(&self.key.branch_id)
            .bind(self.to.as_str())
    }
}
