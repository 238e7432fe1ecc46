//! The event log on PostgreSQL ([`crate::store::events`]): reading events below the horizon
//! with their reservation's branches, and the sinks' cursors and leases. Triggers append and
//! number the events (migrations `0012_events.sql`, `0013_event_sequence_by_transaction.sql`,
//! `0015_events_per_statement.sql`).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use super::rows::{ReservationRow, millis};
use crate::domain::{Branch, Event, EventType};
use crate::store::events::{EventLog, EventPage, SinkState, stored_type};
use crate::store::{StoreError, WorkLease};

/// An event row: its own columns and the reservation's as the change left them, named as
/// [`ReservationRow`] reads them, with the branches of that generation when `reads_branches`
/// (the first event of its generation in the page; the others share what it read).
#[derive(sqlx::FromRow)]
struct EventRow {
    sequence: i64,
    event_id: Uuid,
    event_type: String,
    occurred_at: DateTime<Utc>,
    from_queue: bool,
    reads_branches: bool,
    #[sqlx(flatten)]
    reservation: ReservationRow,
}

/// The branches of each reservation generation a page has read so far.
type BranchesRead = HashMap<(Uuid, i32), Vec<Branch>>;

impl EventRow {
    fn into_domain(mut self, read: &mut BranchesRead) -> Result<Event, StoreError> {
        let event_type = stored_type(self.sequence, &self.event_type)?;
        let generation = self.reservation.generation_key();
        let branches = if self.reads_branches {
            let branches = self.reservation.take_branches()?;
            read.insert(generation, branches.clone());
            branches
        } else {
            // The statement reads them for the generation's first event, ordered before it.
            read.get(&generation).cloned().ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "event {}: its generation's branches were not read before it",
                    self.sequence
                ))
            })?
        };
        let reservation = self.reservation.into_domain_with(branches)?;
        Ok(Event {
            sequence: self.sequence,
            event_id: self.event_id,
            event_type,
            occurred_at: self.occurred_at,
            owner: reservation.owner.clone(),
            reservation,
            from_queue: self.from_queue,
        })
    }
}

/// The sink columns [`SinkState`] is read from.
type SinkRow = (String, i64, Option<DateTime<Utc>>, bool, Option<String>);

fn sink_state((name, delivered_through, failing_since, paused, last_error): SinkRow) -> SinkState {
    SinkState {
        name,
        delivered_through,
        failing_since,
        paused,
        last_error,
    }
}

/// The readable events (below the horizon, `0013_event_sequence_by_transaction.sql`) after
/// `$1` (owner `$2` unless NULL), at most `$3`. The digest column is 32 zero
/// bytes: an event never carries a reservation's token check.
///
/// The page is taken first (`MATERIALIZED`: the `$3` events, in order), then the first event of
/// each reservation generation in it reads that generation's branches through the branches'
/// primary key, beside it (`branches_of!`, only where `reads_branches`); the later events of
/// the generation share them (a reservation's events are four on its way to CONFIRMED). Every
/// read is bounded by the page, whatever the tables' statistics. Reading the branches once per
/// generation in a set of their own and joining them back to the events was no cheaper: on a
/// log never analyzed the planner, expecting one row on each side, compared every event with
/// every generation of the page (249,500 comparisons for a 500-event page), 5.2 ms against
/// 3.4 ms for a sink's 400-event page (`tests/store` `plans_events`).
pub const EVENTS_AFTER: &str = concat!(
    "WITH page AS MATERIALIZED ( \
        SELECT * FROM events \
        WHERE sequence > $1 AND sequence < holdfast_event_horizon() \
          AND ($2::text IS NULL OR owner = $2) \
        ORDER BY sequence LIMIT $3) \
     SELECT e.sequence, e.event_id, e.type AS event_type, e.occurred_at, \
        (e.from_queue OR (e.type = 'RESERVATION_HELD' AND e.generation > 0)) AS from_queue, \
        e.reads_branches, \
        e.reservation_id AS id, e.request_id, e.holder, e.state, \
        e.release_outcome, e.owner, decode(repeat('00', 32), 'hex') AS token_digest, \
        NULL::text AS token_key_id, e.ttl_ms, e.created_at, e.expires_at, e.extensions_used, \
        e.labels, e.rejection_participant, e.rejection_resource, e.rejection_reason, \
        e.late_payment_honored, e.version, e.payment_participant, e.payment_ref, \
        e.payment_amount_minor, e.payment_currency, e.refund_id, e.refund_state, \
        e.refund_reason, e.refund_failure, e.generation, false AS lapsed, b.* \
     FROM (SELECT *, row_number() OVER ( \
                PARTITION BY reservation_id, generation ORDER BY sequence) = 1 \
                AS reads_branches \
           FROM page) e",
    branches_of!("e.reservation_id", "e.generation", "e.reads_branches"),
    "ORDER BY e.sequence"
);

/// The columns [`SinkRow`] reads (a macro: queries are `&'static str`).
macro_rules! sink_columns {
    () => {
        "name, delivered_through, failing_since, paused, last_error"
    };
}

#[async_trait]
impl EventLog for PgStore {
    async fn events_after(&self, page: &EventPage<'_>) -> Result<Vec<Event>, StoreError> {
        let mut read = BranchesRead::new();
        sqlx::query_as::<_, EventRow>(EVENTS_AFTER)
            .bind(page.after)
            .bind(page.owner)
            .bind(i64::from(page.limit))
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|row| row.into_domain(&mut read))
            .collect()
    }

    async fn latest_sequence(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(max(sequence), 0) FROM events \
             WHERE sequence < holdfast_event_horizon()",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    async fn before_last(&self, owner: Option<&str>, n: u32) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(CASE WHEN count(*) = $2 THEN min(sequence) - 1 END, 0) FROM ( \
                SELECT sequence FROM events \
                WHERE sequence < holdfast_event_horizon() AND ($1::text IS NULL OR owner = $1) \
                ORDER BY sequence DESC LIMIT $2) newest",
        )
        .bind(owner)
        .bind(i64::from(n))
        .fetch_one(&self.pool)
        .await?)
    }

    async fn appended_after(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, EventType)>, StoreError> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT sequence, type FROM events \
             WHERE sequence > $1 AND sequence < holdfast_event_horizon() \
             ORDER BY sequence LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(sequence, name)| Ok((sequence, stored_type(sequence, &name)?)))
            .collect()
    }

    async fn lease_sink(
        &self,
        name: &str,
        lease: WorkLease,
    ) -> Result<Option<SinkState>, StoreError> {
        let row: Option<SinkRow> = sqlx::query_as(concat!(
            "INSERT INTO event_sinks AS s (name, lease_owner, lease_until) \
             VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond') \
             ON CONFLICT (name) DO UPDATE SET lease_owner = EXCLUDED.lease_owner, \
                 lease_until = EXCLUDED.lease_until \
             WHERE s.lease_owner IS NULL OR s.lease_owner = $2 \
                OR s.lease_until < clock_timestamp() \
             RETURNING ",
            sink_columns!()
        ))
        .bind(name)
        .bind(lease.owner)
        .bind(millis(lease.duration))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(sink_state))
    }

    async fn record_delivered(
        &self,
        name: &str,
        lease_owner: Uuid,
        through: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE event_sinks SET delivered_through = greatest(delivered_through, $3), \
                 failing_since = NULL, last_error = NULL \
             WHERE name = $1 AND lease_owner = $2",
        )
        .bind(name)
        .bind(lease_owner)
        .bind(through)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn record_sink_failure(
        &self,
        name: &str,
        lease_owner: Uuid,
        error: &str,
        give_up: Duration,
    ) -> Result<Option<SinkState>, StoreError> {
        let row: Option<SinkRow> = sqlx::query_as(concat!(
            "UPDATE event_sinks SET failing_since = coalesce(failing_since, clock_timestamp()), \
                 last_error = $3, \
                 paused = paused OR coalesce(failing_since, clock_timestamp()) \
                     <= clock_timestamp() - $4 * interval '1 millisecond' \
             WHERE name = $1 AND lease_owner = $2 \
             RETURNING ",
            sink_columns!()
        ))
        .bind(name)
        .bind(lease_owner)
        .bind(error)
        .bind(millis(give_up))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(sink_state))
    }

    async fn resume_sink(&self, name: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE event_sinks SET paused = false, failing_since = NULL, last_error = NULL \
             WHERE name = $1",
        )
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_sink(&self, name: &str, lease_owner: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE event_sinks SET lease_owner = NULL, lease_until = NULL \
             WHERE name = $1 AND lease_owner = $2",
        )
        .bind(name)
        .bind(lease_owner)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn sinks(&self) -> Result<Vec<SinkState>, StoreError> {
        let rows: Vec<SinkRow> = sqlx::query_as(concat!(
            "SELECT ",
            sink_columns!(),
            " FROM event_sinks ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(sink_state).collect())
    }

    async fn sink_lag(&self, name: &str) -> Result<Duration, StoreError> {
        let seconds: f64 = sqlx::query_scalar(
            "SELECT coalesce(extract(epoch FROM clock_timestamp() - \
                 (SELECT occurred_at FROM events \
                  WHERE sequence > coalesce((SELECT delivered_through FROM event_sinks \
                                             WHERE name = $1), 0) \
                  ORDER BY sequence LIMIT 1))::float8, 0)",
        )
        .bind(name)
        .fetch_one(&self.pool)
        .await?;
        Ok(Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or_default())
    }

    async fn purge_events(&self, keep: Duration, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM events WHERE sequence IN ( \
                SELECT sequence FROM ( \
                    SELECT sequence, occurred_at FROM events \
                    WHERE sequence <= (SELECT coalesce(min(delivered_through), 9223372036854775807) \
                                       FROM event_sinks WHERE NOT paused \
                                         AND lease_until > clock_timestamp() - $1 * interval '1 millisecond') \
                    ORDER BY sequence LIMIT $2) oldest \
                WHERE occurred_at < clock_timestamp() - $1 * interval '1 millisecond')",
        )
        .bind(millis(keep))
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
