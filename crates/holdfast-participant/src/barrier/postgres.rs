//! The barrier's SQL on PostgreSQL: row locks (`FOR UPDATE`, `SKIP LOCKED` for sweeps) and
//! `clock_timestamp()` as the clock.
//!
//! A statement that names one branch and wants its row held says `state || '' = 'held'`: that
//! does not imply the predicate of `tcc_barrier_orphans` (the participant's held rows, for the
//! reclaim sweep), so the planner cannot reach the row through it and visit every held row of
//! the participant on the way; it takes the primary key (`tests/participants/barrier_plans.rs`).

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Pool, Postgres, Row, Transaction};

use super::{
    Backend, BarrierPhase, BarrierRow, BranchCounts, answer_parts, encode_items, parse_try_answer,
};
use crate::{BranchCtx, BranchKey, ResourceError, TryAnswer};

/// The barrier columns every reader needs (a macro so queries stay static strings).
macro_rules! barrier_columns {
    () => {
        "state, try_answer, try_reason, holder, items, expires_at, reclaim_after"
    };
}

/// A `held` row of participant `$1` past its reclaim time: an orphaned hold (`$alias` is the
/// barrier table's alias in the query; a macro so queries stay static strings).
macro_rules! orphaned {
    ($alias:literal) => {
        concat!(
            $alias,
            ".participant = $1 AND ",
            $alias,
            ".state = 'held' AND ",
            $alias,
            ".reclaim_after <= clock_timestamp()"
        )
    };
}

/// The branch keys a batch statement returned.
fn keys_of(rows: &[sqlx::postgres::PgRow]) -> Result<HashSet<BranchKey>, ResourceError> {
    rows.iter()
        .map(|row| {
            Ok(BranchKey {
                reservation_id: row.try_get("reservation_id")?,
                branch_id: row.try_get("branch_id")?,
            })
        })
        .collect()
}

fn barrier_from_row(row: &sqlx::postgres::PgRow) -> Result<BarrierRow, ResourceError> {
    let state: String = row.try_get("state")?;
    let answer: Option<String> = row.try_get("try_answer")?;
    Ok(BarrierRow {
        phase: BarrierPhase::parse(&state)?,
        try_answer: parse_try_answer(answer.as_deref(), row.try_get("try_reason")?)?,
        holder: row.try_get("holder")?,
        items: row.try_get("items")?,
        expires_at: row.try_get("expires_at")?,
        hold_until: row.try_get("reclaim_after")?,
    })
}

#[async_trait]
impl Backend for Postgres {
    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError> {
        crate::migrations::run_postgres(pool).await
    }

    type Write = Transaction<'static, Postgres>;
    type WriteConnection = sqlx::pool::PoolConnection<Postgres>;

    async fn acquire_write(pool: &Pool<Self>) -> Result<Self::WriteConnection, sqlx::Error> {
        pool.acquire().await
    }

    async fn begin_write(pool: &Pool<Self>) -> Result<Self::Write, sqlx::Error> {
        pool.begin().await
    }

    /// A concurrent call for the same branch blocks here until the other transaction ends.
    /// `ON CONFLICT DO NOTHING` waits for a concurrent uncommitted insert and then sees its
    /// outcome, so two first calls cannot both insert.
    async fn lock(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<BarrierRow, ResourceError> {
        let inserted = sqlx::query(
            "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state) \
             VALUES ($1, $2, $3, 'trying') ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_optional(&mut *conn)
        .await?;
        if inserted.is_some() {
            // Our own uncommitted insert: already locked, nothing recorded yet.
            return Ok(BarrierRow::trying());
        }
        let row = sqlx::query(concat!(
            "SELECT ",
            barrier_columns!(),
            " FROM tcc_barrier \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3 FOR UPDATE"
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_one(&mut *conn)
        .await?;
        barrier_from_row(&row)
    }

    async fn lock_existing(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<BarrierRow, ResourceError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            barrier_columns!(),
            " FROM tcc_barrier \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3 FOR UPDATE"
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_optional(&mut *conn)
        .await?;
        match row {
            Some(row) => barrier_from_row(&row),
            None => Self::lock(conn, participant, key).await,
        }
    }

    async fn record_try(
        conn: &mut PgConnection,
        participant: &str,
        branch: &BranchCtx,
        phase: BarrierPhase,
        answer: &TryAnswer,
    ) -> Result<(), ResourceError> {
        let (answer, reason) = answer_parts(answer);
        sqlx::query(
            "UPDATE tcc_barrier SET state = $4, try_answer = $5, try_reason = $6, holder = $7, \
                    items = $8, expires_at = $9, reclaim_after = $10, updated_at = clock_timestamp() \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3",
        )
        .bind(participant)
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(phase.as_str())
        .bind(answer)
        .bind(reason)
        .bind(&branch.holder)
        .bind(encode_items(&branch.items))
        .bind(branch.expires_at)
        .bind(branch.hold_until)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// One statement: the row with its answer. `ON CONFLICT DO NOTHING` waits for a concurrent
    /// uncommitted insert of the same branch and then sees its outcome.
    async fn insert_try(
        conn: &mut PgConnection,
        participant: &str,
        branch: &BranchCtx,
        phase: BarrierPhase,
        answer: &TryAnswer,
    ) -> Result<bool, ResourceError> {
        let (answer, reason) = answer_parts(answer);
        let inserted = sqlx::query(
            "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer, \
                                      try_reason, holder, items, expires_at, reclaim_after) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(participant)
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(phase.as_str())
        .bind(answer)
        .bind(reason)
        .bind(&branch.holder)
        .bind(encode_items(&branch.items))
        .bind(branch.expires_at)
        .bind(branch.hold_until)
        .fetch_optional(&mut *conn)
        .await?;
        Ok(inserted.is_some())
    }

    const BATCHES_BARRIER_ONLY: bool = true;

    /// One statement for the batch: rows in key order, so two replicas' batches lock alike.
    async fn insert_held_batch(
        conn: &mut PgConnection,
        participant: &str,
        branches: &[&BranchCtx],
    ) -> Result<Vec<bool>, ResourceError> {
        let mut sorted = branches.to_vec();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        let text = |f: fn(&BranchCtx) -> &str| sorted.iter().map(|b| f(b)).collect::<Vec<_>>();
        let rows = sqlx::query(
            "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer, \
                                      holder, items, expires_at, reclaim_after) \
             SELECT $1, t.reservation_id, t.branch_id, 'held', 'held', t.holder, t.items, \
                    t.expires_at, t.reclaim_after \
             FROM UNNEST($2::text[], $3::text[], $4::text[], $5::jsonb[], $6::timestamptz[], \
                         $7::timestamptz[]) \
                  AS t(reservation_id, branch_id, holder, items, expires_at, reclaim_after) \
             ON CONFLICT DO NOTHING RETURNING reservation_id, branch_id",
        )
        .bind(participant)
        .bind(text(|b| &b.key.reservation_id))
        .bind(text(|b| &b.key.branch_id))
        .bind(text(|b| &b.holder))
        .bind(
            sorted
                .iter()
                .map(|b| encode_items(&b.items))
                .collect::<Vec<_>>(),
        )
        .bind(sorted.iter().map(|b| b.expires_at).collect::<Vec<_>>())
        .bind(sorted.iter().map(|b| b.hold_until).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
        let inserted = keys_of(&rows)?;
        Ok(branches.iter().map(|b| inserted.contains(&b.key)).collect())
    }

    /// The orphan check, and the record or the delete it decides, in one statement. The
    /// refused rows themselves (`held` until this statement) are not orphans. Each row is
    /// found by its whole key, the participant with it (as in `advance_held_batch`).
    async fn settle_refused(
        conn: &mut PgConnection,
        participant: &str,
        refused: &[(&BranchKey, &str)],
    ) -> Result<bool, ResourceError> {
        let ids: Vec<&str> = refused
            .iter()
            .map(|(k, _)| k.reservation_id.as_str())
            .collect();
        let branch_ids: Vec<&str> = refused.iter().map(|(k, _)| k.branch_id.as_str()).collect();
        let reasons: Vec<&str> = refused.iter().map(|(_, reason)| *reason).collect();
        let recorded: bool = sqlx::query_scalar(concat!(
            "WITH k AS ( \
                 SELECT * FROM UNNEST($5::text[], $2::text[], $3::text[], $4::text[]) \
                 AS k(participant, reservation_id, branch_id, reason)), \
             orphaned AS ( \
                 SELECT EXISTS (SELECT 1 FROM tcc_barrier o WHERE ",
            orphaned!("o"),
            " AND NOT EXISTS (SELECT 1 FROM k WHERE k.reservation_id = o.reservation_id \
                                 AND k.branch_id = o.branch_id)) AS found), \
             rejected AS ( \
                 UPDATE tcc_barrier b SET state = 'rejected', try_answer = 'rejected', \
                        try_reason = k.reason, updated_at = clock_timestamp() \
                 FROM k WHERE b.participant = k.participant \
                   AND b.reservation_id = k.reservation_id \
                   AND b.branch_id = k.branch_id AND NOT (SELECT found FROM orphaned)), \
             deleted AS ( \
                 DELETE FROM tcc_barrier b USING k \
                 WHERE b.participant = k.participant AND b.reservation_id = k.reservation_id \
                   AND b.branch_id = k.branch_id AND (SELECT found FROM orphaned)) \
             SELECT NOT found FROM orphaned"
        ))
        .bind(participant)
        .bind(ids)
        .bind(branch_ids)
        .bind(reasons)
        .bind(vec![participant; refused.len()])
        .fetch_one(&mut *conn)
        .await?;
        Ok(recorded)
    }

    /// One statement for the batch (`state = 'held'` decides per row, as alone); keys in
    /// order, as for the inserts. The participant comes with each key rather than as a
    /// condition of its own: on a young table (no statistics yet) PostgreSQL estimated
    /// `participant = $1` at one row, read every row of the participant and hash-joined the
    /// batch to them, a cost growing with the table (`tests/participants`
    /// `barrier_plans::a_batch_of_barrier_moves_finds_each_row_by_key_on_a_young_table`).
    /// As a join key it leaves one plan: each row found by its whole primary key.
    async fn advance_held_batch(
        conn: &mut PgConnection,
        participant: &str,
        keys: &[&BranchKey],
        to: BarrierPhase,
    ) -> Result<Vec<bool>, ResourceError> {
        let mut sorted = keys.to_vec();
        sorted.sort();
        let rows = sqlx::query(
            "UPDATE tcc_barrier b SET state = $4, updated_at = clock_timestamp() \
             FROM UNNEST($1::text[], $2::text[], $3::text[]) \
                  AS k(participant, reservation_id, branch_id) \
             WHERE b.participant = k.participant AND b.reservation_id = k.reservation_id \
               AND b.branch_id = k.branch_id AND b.state || '' = 'held' \
             RETURNING b.reservation_id, b.branch_id",
        )
        .bind(vec![participant; sorted.len()])
        .bind(
            sorted
                .iter()
                .map(|k| k.reservation_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            sorted
                .iter()
                .map(|k| k.branch_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(to.as_str())
        .fetch_all(&mut *conn)
        .await?;
        let moved = keys_of(&rows)?;
        Ok(keys.iter().map(|k| moved.contains(*k)).collect())
    }

    /// One statement: the conditional transition locks the row and returns what Try recorded.
    async fn advance_held(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<Option<BarrierRow>, ResourceError> {
        let row = sqlx::query(concat!(
            "UPDATE tcc_barrier SET state = $4, updated_at = clock_timestamp() \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3 AND state || '' = 'held' \
             RETURNING ",
            barrier_columns!()
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(to.as_str())
        .fetch_optional(&mut *conn)
        .await?;
        row.as_ref().map(barrier_from_row).transpose()
    }

    /// One statement: `GREATEST` keeps a later deadline; the UPDATE locks the row (and waits
    /// for a reclaim or phase change in progress, then re-checks `state`).
    async fn extend_held(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
        expires_at: DateTime<Utc>,
        hold_until: DateTime<Utc>,
    ) -> Result<Option<BarrierRow>, ResourceError> {
        let row = sqlx::query(concat!(
            "UPDATE tcc_barrier SET expires_at = GREATEST(expires_at, $4), \
                    reclaim_after = GREATEST(reclaim_after, $5), updated_at = clock_timestamp() \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3 AND state || '' = 'held' \
             RETURNING ",
            barrier_columns!()
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(expires_at)
        .bind(hold_until)
        .fetch_optional(&mut *conn)
        .await?;
        row.as_ref().map(barrier_from_row).transpose()
    }

    async fn phase(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<Option<BarrierPhase>, ResourceError> {
        let state: Option<String> = sqlx::query_scalar(
            "SELECT state FROM tcc_barrier \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3",
        )
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_optional(&mut *conn)
        .await?;
        state.as_deref().map(BarrierPhase::parse).transpose()
    }

    async fn record_late_try(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
        reason: &str,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE tcc_barrier SET try_answer = 'rejected', try_reason = $4, updated_at = clock_timestamp() \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3",
        )
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(reason)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn set_phase(
        conn: &mut PgConnection,
        participant: &str,
        key: &BranchKey,
        phase: BarrierPhase,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE tcc_barrier SET state = $4, updated_at = clock_timestamp() \
             WHERE participant = $1 AND reservation_id = $2 AND branch_id = $3",
        )
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(phase.as_str())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn orphans_exist(
        conn: &mut PgConnection,
        participant: &str,
    ) -> Result<bool, ResourceError> {
        let exists: bool = sqlx::query_scalar(concat!(
            "SELECT EXISTS (SELECT 1 FROM tcc_barrier o WHERE ",
            orphaned!("o"),
            ")"
        ))
        .bind(participant)
        .fetch_one(&mut *conn)
        .await?;
        Ok(exists)
    }

    /// Without `skip_locked` the call waits for locked rows, so a Try that needs capacity sees
    /// a release in progress through to its end.
    async fn lock_next_orphan(
        conn: &mut PgConnection,
        participant: &str,
        skip_locked: bool,
    ) -> Result<Option<(BranchKey, BarrierRow)>, ResourceError> {
        let query = if skip_locked {
            sqlx::query(concat!(
                "SELECT reservation_id, branch_id, ",
                barrier_columns!(),
                " FROM tcc_barrier \
                 WHERE participant = $1 AND state = 'held' AND reclaim_after <= clock_timestamp() \
                 ORDER BY reclaim_after LIMIT 1 FOR UPDATE SKIP LOCKED"
            ))
        } else {
            sqlx::query(concat!(
                "SELECT reservation_id, branch_id, ",
                barrier_columns!(),
                " FROM tcc_barrier \
                 WHERE participant = $1 AND state = 'held' AND reclaim_after <= clock_timestamp() \
                 ORDER BY reclaim_after LIMIT 1 FOR UPDATE"
            ))
        };
        let row = query.bind(participant).fetch_optional(&mut *conn).await?;
        let Some(row) = row else { return Ok(None) };
        let key = BranchKey {
            reservation_id: row.try_get("reservation_id")?,
            branch_id: row.try_get("branch_id")?,
        };
        Ok(Some((key, barrier_from_row(&row)?)))
    }

    async fn purge_finished(
        conn: &mut PgConnection,
        participant: &str,
        keep: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<BranchKey>, ResourceError> {
        let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
        // The pick is a CTE, evaluated once: as a subquery in USING it can be the inner side
        // of a nested loop, rescanned per outer row, and each rescan's SKIP LOCKED passes over
        // the rows this statement already deleted - the LIMIT would bound nothing. Each row is
        // then found by its whole key, the participant with it (as in `advance_held_batch`).
        let rows: Vec<(String, String)> = sqlx::query_as(
            "WITH v AS MATERIALIZED ( \
                 SELECT participant, reservation_id, branch_id FROM tcc_barrier \
                 WHERE participant = $1 AND state IN ('confirmed', 'cancelled', 'rejected') \
                   AND updated_at < clock_timestamp() - $2 * interval '1 millisecond' \
                   AND (reclaim_after IS NULL OR reclaim_after < clock_timestamp()) \
                 ORDER BY updated_at LIMIT $3 FOR UPDATE SKIP LOCKED) \
             DELETE FROM tcc_barrier b USING v \
             WHERE b.participant = v.participant AND b.reservation_id = v.reservation_id \
               AND b.branch_id = v.branch_id \
             RETURNING b.reservation_id, b.branch_id",
        )
        .bind(participant)
        .bind(keep_ms)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(reservation_id, branch_id)| BranchKey {
                reservation_id,
                branch_id,
            })
            .collect())
    }

    async fn branch_counts(
        conn: &mut PgConnection,
        participant: &str,
    ) -> Result<BranchCounts, ResourceError> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE state = 'held') AS held, \
                    count(*) FILTER (WHERE state = 'confirmed') AS confirmed, \
                    count(*) FILTER (WHERE state = 'cancelled') AS cancelled, \
                    count(*) FILTER (WHERE state = 'hold_lost') AS hold_lost \
             FROM tcc_barrier WHERE participant = $1",
        )
        .bind(participant)
        .fetch_one(&mut *conn)
        .await?;
        Ok(BranchCounts {
            held: row.try_get("held")?,
            confirmed: row.try_get("confirmed")?,
            cancelled: row.try_get("cancelled")?,
            hold_lost: row.try_get("hold_lost")?,
        })
    }
}
