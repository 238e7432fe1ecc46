//! The event log on SQLite ([`crate::store::events`]): reading events (numbered at insert: one
//! writer commits in order) with their reservation's branches, and the sinks' cursors and
//! leases, written through the one writer. Triggers append the events (migration
//! `0012_events.sql`).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::SqliteStore;
use super::recovery::write_one;
use super::rows::{ReservationRow, micros, time_of};
use crate::domain::{Event, EventType};
use crate::store::events::{EventLog, EventPage, SinkState, stored_type};
use crate::store::sql::ReservationSql;
use crate::store::{StoreError, WorkLease};

/// An event's own columns; the reservation's are read as a [`ReservationRow`] beside them.
#[derive(sqlx::FromRow)]
struct EventRow {
    sequence: i64,
    event_id: Uuid,
    event_type: String,
    occurred_at: i64,
    from_queue: bool,
    #[sqlx(flatten)]
    reservation: ReservationRow,
}

/// The events after `?1` (owner `?2` unless NULL), at most `?3`, each with the branches of the
/// generation it was written in. The digest column is 32 zero bytes: an event never carries a
/// reservation's token check.
const EVENTS_AFTER: &str = concat!(
    "SELECT sequence, event_id, type AS event_type, occurred_at, \
        (from_queue OR (type = 'RESERVATION_HELD' AND generation > 0)) AS from_queue, \
        reservation_id AS id, request_id, holder, state, release_outcome, owner, \
        zeroblob(32) AS token_digest, NULL AS token_key_id, ttl_ms, created_at, expires_at, \
        extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, \
        late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, \
        payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation, \
        0 AS lapsed, ",
    branches_json!("events.reservation_id", "events.generation"),
    " FROM events WHERE sequence > ?1 AND (?2 IS NULL OR owner = ?2) \
     ORDER BY sequence LIMIT ?3"
);

/// The sink columns [`SinkState`] is read from.
type SinkRow = (String, i64, Option<i64>, bool, Option<String>);

fn sink_state(
    (name, delivered_through, failing_since, paused, last_error): SinkRow,
) -> Result<SinkState, StoreError> {
    Ok(SinkState {
        name,
        delivered_through,
        failing_since: failing_since.map(time_of).transpose()?,
        paused,
        last_error,
    })
}

/// The columns [`SinkRow`] reads (a macro: queries are `&'static str`).
macro_rules! sink_columns {
    () => {
        "name, delivered_through, failing_since, paused, last_error"
    };
}

/// Runs one statement answering at most one sink row in a write transaction of its own.
async fn write_sink<'q>(
    pool: &SqlitePool,
    statement: sqlx::query::QueryAs<'q, Sqlite, SinkRow, sqlx::sqlite::SqliteArguments>,
) -> Result<Option<SinkState>, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let row = statement.fetch_optional(&mut *tx).await?;
    tx.commit().await?;
    row.map(sink_state).transpose()
}

impl EventRow {
    fn into_domain(self) -> Result<Event, StoreError> {
        let event_type = stored_type(self.sequence, &self.event_type)?;
        let reservation = self.reservation.into_domain()?;
        Ok(Event {
            sequence: self.sequence,
            event_id: self.event_id,
            event_type,
            occurred_at: time_of(self.occurred_at)?,
            owner: reservation.owner.clone(),
            reservation,
            from_queue: self.from_queue,
        })
    }
}

async fn events_after(pool: &SqlitePool, page: &EventPage<'_>) -> Result<Vec<Event>, StoreError> {
    sqlx::query_as::<_, EventRow>(EVENTS_AFTER)
        .bind(page.after)
        .bind(page.owner)
        .bind(i64::from(page.limit))
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(EventRow::into_domain)
        .collect()
}

#[async_trait]
impl EventLog for SqliteStore {
    async fn events_after(&self, page: &EventPage<'_>) -> Result<Vec<Event>, StoreError> {
        events_after(&self.pool, page).await
    }

    async fn latest_sequence(&self) -> Result<i64, StoreError> {
        // AUTOINCREMENT's high-water mark: it never goes back, even when the log is purged.
        Ok(
            sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0),
        )
    }

    async fn before_last(&self, owner: Option<&str>, n: u32) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(CASE WHEN count(*) = ?2 THEN min(sequence) - 1 END, 0) FROM ( \
                SELECT sequence FROM events WHERE (?1 IS NULL OR owner = ?1) \
                ORDER BY sequence DESC LIMIT ?2) newest",
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
            "SELECT sequence, type FROM events WHERE sequence > ?1 ORDER BY sequence LIMIT ?2",
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
        let statement = sqlx::query_as(concat!(
            "INSERT INTO event_sinks AS s (name, lease_owner, lease_until) VALUES (?1, ?2, ",
            sqlite_now_us!(),
            " + ?3) ON CONFLICT (name) DO UPDATE SET lease_owner = excluded.lease_owner, \
                 lease_until = excluded.lease_until \
             WHERE s.lease_owner IS NULL OR s.lease_owner = ?2 OR s.lease_until < ",
            sqlite_now_us!(),
            " RETURNING ",
            sink_columns!()
        ));
        write_sink(
            &self.pool,
            statement
                .bind(name)
                .bind(lease.owner)
                .bind(micros(lease.duration)),
        )
        .await
    }

    async fn record_delivered(
        &self,
        name: &str,
        lease_owner: Uuid,
        through: i64,
    ) -> Result<bool, StoreError> {
        let statement = sqlx::query(
            "UPDATE event_sinks SET delivered_through = max(delivered_through, ?3), \
                 failing_since = NULL, last_error = NULL \
             WHERE name = ?1 AND lease_owner = ?2",
        );
        let statement = statement.bind(name).bind(lease_owner).bind(through);
        Ok(write_one(&self.pool, statement).await? == 1)
    }

    async fn record_sink_failure(
        &self,
        name: &str,
        lease_owner: Uuid,
        error: &str,
        give_up: Duration,
    ) -> Result<Option<SinkState>, StoreError> {
        let statement = sqlx::query_as(concat!(
            "UPDATE event_sinks SET failing_since = coalesce(failing_since, ",
            sqlite_now_us!(),
            "), last_error = ?3, paused = paused OR coalesce(failing_since, ",
            sqlite_now_us!(),
            ") <= ",
            sqlite_now_us!(),
            " - ?4 WHERE name = ?1 AND lease_owner = ?2 RETURNING ",
            sink_columns!()
        ));
        let statement = statement
            .bind(name)
            .bind(lease_owner)
            .bind(error)
            .bind(micros(give_up));
        write_sink(&self.pool, statement).await
    }

    async fn resume_sink(&self, name: &str) -> Result<bool, StoreError> {
        let statement = sqlx::query(
            "UPDATE event_sinks SET paused = 0, failing_since = NULL, last_error = NULL \
             WHERE name = ?1",
        );
        Ok(write_one(&self.pool, statement.bind(name)).await? == 1)
    }

    async fn release_sink(&self, name: &str, lease_owner: Uuid) -> Result<bool, StoreError> {
        let statement = sqlx::query(
            "UPDATE event_sinks SET lease_owner = NULL, lease_until = NULL \
             WHERE name = ?1 AND lease_owner = ?2",
        );
        Ok(write_one(&self.pool, statement.bind(name).bind(lease_owner)).await? == 1)
    }

    async fn sinks(&self) -> Result<Vec<SinkState>, StoreError> {
        let rows: Vec<SinkRow> = sqlx::query_as(concat!(
            "SELECT ",
            sink_columns!(),
            " FROM event_sinks ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(sink_state).collect()
    }

    async fn sink_lag(&self, name: &str) -> Result<Duration, StoreError> {
        let oldest: Option<i64> = sqlx::query_scalar(concat!(
            "SELECT ",
            sqlite_now_us!(),
            " - occurred_at FROM events WHERE sequence > coalesce( \
                 (SELECT delivered_through FROM event_sinks WHERE name = ?1), 0) \
             ORDER BY sequence LIMIT 1"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(Duration::from_micros(
            u64::try_from(oldest.unwrap_or(0)).unwrap_or(0),
        ))
    }

    async fn purge_events(&self, keep: Duration, limit: u32) -> Result<u64, StoreError> {
        let statement = sqlx::query(concat!(
            "DELETE FROM events WHERE sequence IN ( \
                SELECT sequence FROM ( \
                    SELECT sequence, occurred_at FROM events \
                    WHERE sequence <= (SELECT coalesce(min(delivered_through), 9223372036854775807) \
                                       FROM event_sinks WHERE NOT paused AND lease_until > ",
            sqlite_now_us!(),
            " - ?1) ORDER BY sequence LIMIT ?2) \
                WHERE occurred_at < ",
            sqlite_now_us!(),
            " - ?1)"
        ));
        write_one(
            &self.pool,
            statement.bind(micros(keep)).bind(i64::from(limit)),
        )
        .await
    }
}
