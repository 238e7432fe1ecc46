//! The barrier's SQL on SQLite. Every SDK transaction begins with `BEGIN IMMEDIATE`, so the
//! database write lock is held from the first statement: a read followed by its conditional
//! write is atomic and no row locks are needed. Times are INTEGER microseconds since the Unix
//! epoch, "now" is the database's (`unixepoch('now', 'subsec')`), items are JSON text.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use holdfast_serve::db::SqliteWrite;
use sqlx::{Pool, Row, Sqlite, SqliteConnection};

use super::{
    Backend, BarrierPhase, BarrierRow, BranchCounts, answer_parts, encode_items, parse_try_answer,
};
use crate::{BranchCtx, BranchKey, ResourceError, TryAnswer};

macro_rules! barrier_columns {
    () => {
        "state, try_answer, try_reason, holder, items, expires_at, reclaim_after"
    };
}

fn time(micros: Option<i64>) -> Result<Option<DateTime<Utc>>, ResourceError> {
    micros
        .map(|us| {
            DateTime::<Utc>::from_timestamp_micros(us)
                .ok_or_else(|| ResourceError::Internal(format!("time out of range: {us}")))
        })
        .transpose()
}

fn barrier_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<BarrierRow, ResourceError> {
    let state: String = row.try_get("state")?;
    let answer: Option<String> = row.try_get("try_answer")?;
    let items: String = row.try_get("items")?;
    Ok(BarrierRow {
        phase: BarrierPhase::parse(&state)?,
        try_answer: parse_try_answer(answer.as_deref(), row.try_get("try_reason")?)?,
        holder: row.try_get("holder")?,
        items: serde_json::from_str(&items)
            .map_err(|e| ResourceError::Internal(format!("malformed barrier items: {e}")))?,
        expires_at: time(row.try_get("expires_at")?)?,
        hold_until: time(row.try_get("reclaim_after")?)?,
    })
}

#[async_trait]
impl Backend for Sqlite {
    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError> {
        crate::migrations::run_sqlite(pool).await
    }

    type Write = SqliteWrite;
    type WriteConnection = SqliteWrite;

    async fn begin_write(pool: &Pool<Self>) -> Result<Self::Write, sqlx::Error> {
        // Queued in process on the pool's one writer, not in SQLite's busy handler.
        holdfast_serve::db::begin_sqlite_write(pool).await
    }

    async fn acquire_write(pool: &Pool<Self>) -> Result<Self::WriteConnection, sqlx::Error> {
        // A member of the writer's group commit, not an autocommit statement of its own: a
        // barrier-only participant's calls then share fsyncs.
        holdfast_serve::db::begin_sqlite_write(pool).await
    }

    async fn finish_write(conn: Self::WriteConnection) -> Result<(), sqlx::Error> {
        conn.commit().await
    }

    async fn lock(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<BarrierRow, ResourceError> {
        let inserted = sqlx::query(
            "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state) \
             VALUES (?1, ?2, ?3, 'trying') ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_optional(&mut *conn)
        .await?;
        if inserted.is_some() {
            return Ok(BarrierRow::trying());
        }
        let row = sqlx::query(concat!(
            "SELECT ",
            barrier_columns!(),
            " FROM tcc_barrier WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3"
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_one(&mut *conn)
        .await?;
        barrier_from_row(&row)
    }

    async fn lock_existing(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<BarrierRow, ResourceError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            barrier_columns!(),
            " FROM tcc_barrier WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3"
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
        conn: &mut SqliteConnection,
        participant: &str,
        branch: &BranchCtx,
        phase: BarrierPhase,
        answer: &TryAnswer,
    ) -> Result<(), ResourceError> {
        let (answer, reason) = answer_parts(answer);
        sqlx::query(concat!(
            "UPDATE tcc_barrier SET state = ?4, try_answer = ?5, try_reason = ?6, holder = ?7, \
                    items = ?8, expires_at = ?9, reclaim_after = ?10, updated_at = ",
            sqlite_now_us!(),
            " WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3"
        ))
        .bind(participant)
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(phase.as_str())
        .bind(answer)
        .bind(reason)
        .bind(&branch.holder)
        .bind(encode_items(&branch.items).to_string())
        .bind(branch.expires_at.timestamp_micros())
        .bind(branch.hold_until.timestamp_micros())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// One statement: the row with its answer (atomic even outside a transaction).
    async fn insert_try(
        conn: &mut SqliteConnection,
        participant: &str,
        branch: &BranchCtx,
        phase: BarrierPhase,
        answer: &TryAnswer,
    ) -> Result<bool, ResourceError> {
        let (answer, reason) = answer_parts(answer);
        let inserted = sqlx::query(
            "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer, \
                                      try_reason, holder, items, expires_at, reclaim_after) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(participant)
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(phase.as_str())
        .bind(answer)
        .bind(reason)
        .bind(&branch.holder)
        .bind(encode_items(&branch.items).to_string())
        .bind(branch.expires_at.timestamp_micros())
        .bind(branch.hold_until.timestamp_micros())
        .fetch_optional(&mut *conn)
        .await?;
        Ok(inserted.is_some())
    }

    /// One statement: the conditional transition, returning what Try recorded.
    async fn advance_held(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<Option<BarrierRow>, ResourceError> {
        let row = sqlx::query(concat!(
            "UPDATE tcc_barrier SET state = ?4, updated_at = ",
            sqlite_now_us!(),
            " WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3 \
              AND state = 'held' RETURNING ",
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

    /// One statement: the two-argument `max` keeps a later deadline.
    async fn extend_held(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
        expires_at: DateTime<Utc>,
        hold_until: DateTime<Utc>,
    ) -> Result<Option<BarrierRow>, ResourceError> {
        let row = sqlx::query(concat!(
            "UPDATE tcc_barrier SET expires_at = max(expires_at, ?4), \
                    reclaim_after = max(reclaim_after, ?5), updated_at = ",
            sqlite_now_us!(),
            " WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3 \
              AND state = 'held' RETURNING ",
            barrier_columns!()
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(expires_at.timestamp_micros())
        .bind(hold_until.timestamp_micros())
        .fetch_optional(&mut *conn)
        .await?;
        row.as_ref().map(barrier_from_row).transpose()
    }

    async fn phase(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<Option<BarrierPhase>, ResourceError> {
        let state: Option<String> = sqlx::query_scalar(
            "SELECT state FROM tcc_barrier \
             WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3",
        )
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_optional(&mut *conn)
        .await?;
        state.as_deref().map(BarrierPhase::parse).transpose()
    }

    async fn record_late_try(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
        reason: &str,
    ) -> Result<(), ResourceError> {
        sqlx::query(concat!(
            "UPDATE tcc_barrier SET try_answer = 'rejected', try_reason = ?4, updated_at = ",
            sqlite_now_us!(),
            " WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3"
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(reason)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn set_phase(
        conn: &mut SqliteConnection,
        participant: &str,
        key: &BranchKey,
        phase: BarrierPhase,
    ) -> Result<(), ResourceError> {
        sqlx::query(concat!(
            "UPDATE tcc_barrier SET state = ?4, updated_at = ",
            sqlite_now_us!(),
            " WHERE participant = ?1 AND reservation_id = ?2 AND branch_id = ?3"
        ))
        .bind(participant)
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(phase.as_str())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn orphans_exist(
        conn: &mut SqliteConnection,
        participant: &str,
    ) -> Result<bool, ResourceError> {
        let exists: bool = sqlx::query_scalar(concat!(
            "SELECT EXISTS (SELECT 1 FROM tcc_barrier \
             WHERE participant = ?1 AND state = 'held' AND reclaim_after <= ",
            sqlite_now_us!(),
            ")"
        ))
        .bind(participant)
        .fetch_one(&mut *conn)
        .await?;
        Ok(exists)
    }

    /// The write lock of `BEGIN IMMEDIATE` excludes every other writer, so nothing is ever
    /// "locked by someone else" here and `skip_locked` changes nothing.
    async fn lock_next_orphan(
        conn: &mut SqliteConnection,
        participant: &str,
        _skip_locked: bool,
    ) -> Result<Option<(BranchKey, BarrierRow)>, ResourceError> {
        let row = sqlx::query(concat!(
            "SELECT reservation_id, branch_id, ",
            barrier_columns!(),
            " FROM tcc_barrier WHERE participant = ?1 AND state = 'held' AND reclaim_after <= ",
            sqlite_now_us!(),
            " ORDER BY reclaim_after LIMIT 1"
        ))
        .bind(participant)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let key = BranchKey {
            reservation_id: row.try_get("reservation_id")?,
            branch_id: row.try_get("branch_id")?,
        };
        Ok(Some((key, barrier_from_row(&row)?)))
    }

    async fn purge_finished(
        conn: &mut SqliteConnection,
        participant: &str,
        keep: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<BranchKey>, ResourceError> {
        let keep_us = i64::try_from(keep.as_micros()).unwrap_or(i64::MAX);
        // Under the write lock (`BEGIN IMMEDIATE`) no other writer runs: nothing to skip.
        let rows: Vec<(String, String)> = sqlx::query_as(concat!(
            "DELETE FROM tcc_barrier WHERE rowid IN ( \
                 SELECT rowid FROM tcc_barrier \
                 WHERE participant = ?1 AND state IN ('confirmed', 'cancelled', 'rejected') \
                   AND updated_at < ",
            sqlite_now_us!(),
            " - ?2 AND (reclaim_after IS NULL OR reclaim_after < ",
            sqlite_now_us!(),
            ") ORDER BY updated_at LIMIT ?3) \
             RETURNING reservation_id, branch_id"
        ))
        .bind(participant)
        .bind(keep_us)
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
        conn: &mut SqliteConnection,
        participant: &str,
    ) -> Result<BranchCounts, ResourceError> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE state = 'held') AS held, \
                    count(*) FILTER (WHERE state = 'confirmed') AS confirmed, \
                    count(*) FILTER (WHERE state = 'cancelled') AS cancelled, \
                    count(*) FILTER (WHERE state = 'hold_lost') AS hold_lost \
             FROM tcc_barrier WHERE participant = ?1",
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
