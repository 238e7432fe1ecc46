//! The barrier table's SQL: one row per (participant, reservation, branch) recording the
//! branch's phase and the first Try answer. Every function runs on the caller's transaction,
//! so the barrier changes commit or roll back together with the business change.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgConnection, Row};

use super::{BranchCtx, BranchKey, Item, ResourceError, Slot, TryOutcome};

/// A branch's phase at this participant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Row inserted by the current transaction: no call for this branch was recorded before.
    Trying,
    Held,
    Rejected,
    Confirmed,
    Cancelled,
    HoldLost,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Trying => "trying",
            Phase::Held => "held",
            Phase::Rejected => "rejected",
            Phase::Confirmed => "confirmed",
            Phase::Cancelled => "cancelled",
            Phase::HoldLost => "hold_lost",
        }
    }

    fn parse(s: &str) -> Result<Self, ResourceError> {
        Ok(match s {
            "trying" => Phase::Trying,
            "held" => Phase::Held,
            "rejected" => Phase::Rejected,
            "confirmed" => Phase::Confirmed,
            "cancelled" => Phase::Cancelled,
            "hold_lost" => Phase::HoldLost,
            other => {
                return Err(ResourceError::Internal(format!(
                    "unknown barrier state {other:?}"
                )));
            }
        })
    }
}

/// A locked barrier row.
#[derive(Debug)]
pub(crate) struct Barrier {
    pub phase: Phase,
    pub try_answer: Option<TryOutcome>,
    holder: String,
    items: Value,
    expires_at: Option<DateTime<Utc>>,
    hold_until: Option<DateTime<Utc>>,
}

impl Barrier {
    /// The branch as its Try recorded it, for Confirm/Cancel/reclaim business calls.
    pub fn ctx(&self, key: &BranchKey) -> Result<BranchCtx, ResourceError> {
        let epoch = DateTime::<Utc>::UNIX_EPOCH;
        Ok(BranchCtx {
            key: key.clone(),
            holder: self.holder.clone(),
            items: decode_items(&self.items)?,
            expires_at: self.expires_at.unwrap_or(epoch),
            hold_until: self.hold_until.unwrap_or(epoch),
        })
    }
}

/// The barrier columns every reader needs (a macro so queries stay static strings).
macro_rules! barrier_columns {
    () => {
        "state, try_answer, try_reason, holder, items, expires_at, reclaim_after"
    };
}

fn barrier_from_row(row: &sqlx::postgres::PgRow) -> Result<Barrier, ResourceError> {
    let state: String = row.try_get("state")?;
    let answer: Option<String> = row.try_get("try_answer")?;
    let reason: String = row.try_get("try_reason")?;
    let try_answer = match answer.as_deref() {
        None => None,
        Some("held") => Some(TryOutcome::Held),
        Some("rejected") => Some(TryOutcome::Rejected(reason)),
        Some(other) => {
            return Err(ResourceError::Internal(format!(
                "unknown barrier try_answer {other:?}"
            )));
        }
    };
    Ok(Barrier {
        phase: Phase::parse(&state)?,
        try_answer,
        holder: row.try_get("holder")?,
        items: row.try_get("items")?,
        expires_at: row.try_get("expires_at")?,
        hold_until: row.try_get("reclaim_after")?,
    })
}

/// Locks the branch's barrier row, creating it in phase `Trying` when absent.
///
/// A concurrent call for the same branch blocks here until the other transaction ends, which
/// serialises all calls of one branch. `ON CONFLICT DO NOTHING` waits for a concurrent
/// uncommitted insert and then sees its outcome, so two first calls cannot both insert.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    participant: &str,
    key: &BranchKey,
) -> Result<Barrier, ResourceError> {
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
        return Ok(Barrier {
            phase: Phase::Trying,
            try_answer: None,
            holder: String::new(),
            items: Value::Array(Vec::new()),
            expires_at: None,
            hold_until: None,
        });
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

/// Like [`lock`], for calls that usually find the row (Confirm, Cancel): one locking read in
/// the common case, the insert only when the branch was never seen.
pub(crate) async fn lock_existing(
    conn: &mut PgConnection,
    participant: &str,
    key: &BranchKey,
) -> Result<Barrier, ResourceError> {
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
        None => lock(conn, participant, key).await,
    }
}

/// Records the Try's answer and the branch's new phase, with what Confirm/Cancel need later.
pub(crate) async fn record_try(
    conn: &mut PgConnection,
    participant: &str,
    branch: &BranchCtx,
    phase: Phase,
    answer: &TryOutcome,
) -> Result<(), ResourceError> {
    let (answer, reason) = match answer {
        TryOutcome::Held => ("held", ""),
        TryOutcome::Rejected(reason) => ("rejected", reason.as_str()),
    };
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

/// Records a rejection for a Try that arrived after the branch was already decided without
/// one (Cancel or Confirm first), so repeats of the late Try answer the same.
pub(crate) async fn record_late_try(
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

/// Moves the branch to `phase`.
pub(crate) async fn set_phase(
    conn: &mut PgConnection,
    participant: &str,
    key: &BranchKey,
    phase: Phase,
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

/// Whether any hold of this participant is past `expires_at + orphan_grace` (cheap: partial
/// index).
pub(crate) async fn orphans_exist(
    conn: &mut PgConnection,
    participant: &str,
) -> Result<bool, ResourceError> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM tcc_barrier \
         WHERE participant = $1 AND state = 'held' AND reclaim_after <= clock_timestamp())",
    )
    .bind(participant)
    .fetch_one(&mut *conn)
    .await?;
    Ok(exists)
}

/// Locks one orphaned held branch. With `skip_locked`, rows another transaction holds are
/// skipped (background sweeps never queue behind each other); without it the call waits for
/// them, so a Try that needs capacity sees a release in progress through to its end.
pub(crate) async fn lock_next_orphan(
    conn: &mut PgConnection,
    participant: &str,
    skip_locked: bool,
) -> Result<Option<(BranchKey, Barrier)>, ResourceError> {
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

fn encode_items(items: &[Item]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|item| {
                let during = item.during.map(|slot| {
                    json!({
                        "start_micros": slot.start.timestamp_micros(),
                        "end_micros": slot.end.timestamp_micros(),
                    })
                });
                json!({ "resource": item.resource, "quantity": item.quantity, "during": during })
            })
            .collect(),
    )
}

fn decode_items(value: &Value) -> Result<Vec<Item>, ResourceError> {
    let bad = || ResourceError::Internal("malformed items in barrier row".to_owned());
    let micros = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_i64)
            .and_then(DateTime::<Utc>::from_timestamp_micros)
            .ok_or_else(bad)
    };
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|v| {
            let during = match v.get("during") {
                None | Some(Value::Null) => None,
                Some(d) => Some(Slot {
                    start: micros(d, "start_micros")?,
                    end: micros(d, "end_micros")?,
                }),
            };
            Ok(Item {
                resource: v
                    .get("resource")
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?
                    .to_owned(),
                quantity: v.get("quantity").and_then(Value::as_i64).ok_or_else(bad)?,
                during,
            })
        })
        .collect()
}

/// How many branches of one participant are in each live phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BranchCounts {
    /// Branches holding.
    pub held: i64,
    /// Branches confirmed.
    pub confirmed: i64,
    /// Branches cancelled (including Cancel before Try).
    pub cancelled: i64,
    /// Branches whose hold was lost or reclaimed.
    pub hold_lost: i64,
}

/// Counts `participant`'s branches by phase, from the barrier table.
pub async fn branch_counts(
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
