//! PostgreSQL's statements for the waitlists (SPEC 11): [`WaitlistSql`] for the shared flows
//! of `store/waitlist.rs`, and the reads and sweeps of [`QueueStore`].

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgConnection;
use uuid::Uuid;

use super::PgStore;
use super::rows::millis;
use crate::domain::waitlist::{
    QUEUE_WAIT_ENDED, QueueKey, QueuePage, QueuePlace, QueuedReservation,
};
use crate::domain::{Hold, Interval, Reservation};
use crate::store::sql::ReservationSql;
use crate::store::waitlist::{self, JoinQueue, Joined, QueueHead, QueueStore, WaitlistSql};
use crate::store::{StoreError, WorkLease};

/// The advisory lock key text of a queue (`hashtextextended` of it), apart from the holders'.
fn lock_text(key: &QueueKey) -> String {
    format!(
        "queue\u{1f}{}\u{1f}{}\u{1f}{}",
        key.participant,
        key.resource,
        key.slot()
    )
}

fn interval(start: Option<DateTime<Utc>>, end: Option<DateTime<Utc>>) -> Option<Interval> {
    Some(Interval {
        start: start?,
        end: end?,
    })
}

#[async_trait]
impl WaitlistSql for Postgres {
    async fn lock_queues(conn: &mut PgConnection, keys: &[QueueKey]) -> Result<(), StoreError> {
        let texts: Vec<String> = keys.iter().map(lock_text).collect();
        sqlx::query(
            "SELECT pg_advisory_xact_lock(k) FROM ( \
                SELECT DISTINCT hashtextextended(t, 0) AS k FROM UNNEST($1::text[]) AS t \
                ORDER BY k) s",
        )
        .bind(&texts)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn queue_length(
        conn: &mut PgConnection,
        key: &QueueKey,
        id: Uuid,
    ) -> Result<(i64, bool), StoreError> {
        Ok(sqlx::query_as(
            "SELECT count(*), coalesce(bool_or(reservation_id = $4), false) FROM queue_entries \
             WHERE participant = $1 AND resource = $2 AND slot = $3",
        )
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(id)
        .fetch_one(&mut *conn)
        .await?)
    }

    async fn mark_queued(
        conn: &mut PgConnection,
        id: Uuid,
        release: bool,
        wait: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE reservations SET \
                 state = CASE WHEN $2 THEN 'CANCELLING' ELSE 'QUEUED' END, \
                 release_outcome = CASE WHEN $2 THEN 'QUEUED' END, \
                 queued_at = coalesce(queued_at, clock_timestamp()), \
                 queue_until = coalesce(queue_until, \
                                        clock_timestamp() + $3 * interval '1 millisecond'), \
                 lease_owner = CASE WHEN $2 THEN lease_owner END, \
                 lease_until = CASE WHEN $2 THEN lease_until END, \
                 version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'TRYING'",
        )
        .bind(id)
        .bind(release)
        .bind(millis(wait))
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_queue_entry(
        conn: &mut PgConnection,
        id: Uuid,
        hold: &Hold,
    ) -> Result<(), StoreError> {
        let key = QueueKey::of(hold);
        sqlx::query(
            "INSERT INTO queue_entries (participant, resource, slot, during_start, during_end, \
                                        reservation_id, quantity) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (reservation_id, participant, resource, slot) DO NOTHING",
        )
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(hold.during.map(|d| d.start))
        .bind(hold.during.map(|d| d.end))
        .bind(id)
        .bind(hold.quantity)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn mark_offered(
        conn: &mut PgConnection,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<i32>, StoreError> {
        Ok(sqlx::query_scalar(
            "UPDATE reservations SET state = 'TRYING', release_outcome = NULL, \
                 generation = generation + 1, \
                 expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond', \
                 lease_owner = $2, lease_until = clock_timestamp() + $3 * interval '1 millisecond', \
                 version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'QUEUED' AND queue_until > clock_timestamp() \
             RETURNING generation",
        )
        .bind(id)
        .bind(lease.owner)
        .bind(millis(lease.duration))
        .fetch_optional(&mut *conn)
        .await?)
    }
}

/// A queue entry as `queue_place` and `list_queue` read it.
#[derive(sqlx::FromRow)]
struct EntryRow {
    seq: i64,
    participant: String,
    resource: String,
    during_start: Option<DateTime<Utc>>,
    during_end: Option<DateTime<Utc>>,
    reservation_id: Uuid,
    holder: String,
    quantity: i64,
    queued_at: DateTime<Utc>,
    /// When the reservation first joined a queue: its wait counts from then.
    first_queued_at: Option<DateTime<Utc>>,
    queue_until: Option<DateTime<Utc>>,
}

/// `SELECT` of [`EntryRow`]s; append the WHERE clause.
macro_rules! select_entries {
    () => {
        "SELECT q.seq, q.participant, q.resource, q.during_start, q.during_end, \
         q.reservation_id, r.holder, q.quantity, q.queued_at, r.queued_at AS first_queued_at, \
         r.queue_until \
         FROM queue_entries q JOIN reservations r ON r.id = q.reservation_id "
    };
}

/// How many entries of `key`'s queue come before `seq`, and `seq` itself: its position.
async fn position(conn: &mut PgConnection, key: &QueueKey, seq: i64) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM queue_entries \
         WHERE participant = $1 AND resource = $2 AND slot = $3 AND seq <= $4",
    )
    .bind(&key.participant)
    .bind(&key.resource)
    .bind(key.slot())
    .bind(seq)
    .fetch_one(&mut *conn)
    .await?)
}

#[async_trait]
impl QueueStore for PgStore {
    async fn join_queue(&self, job: &JoinQueue<'_>) -> Result<Joined, StoreError> {
        waitlist::join_queue::<Postgres>(&self.pool, job).await
    }

    async fn begin_offer(
        &self,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<Reservation>, StoreError> {
        waitlist::begin_offer::<Postgres>(&self.pool, id, lease).await
    }

    async fn lease_queue(&self, key: &QueueKey, lease: WorkLease) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO queue_offer_leases AS l (participant, resource, slot, lease_owner, \
                                                  lease_until) \
             VALUES ($1, $2, $3, $4, clock_timestamp() + $5 * interval '1 millisecond') \
             ON CONFLICT (participant, resource, slot) DO UPDATE \
                 SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until \
                 WHERE l.lease_owner = EXCLUDED.lease_owner OR l.lease_until <= clock_timestamp()",
        )
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(lease.owner)
        .bind(millis(lease.duration))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn queue_heads(&self, key: &QueueKey, limit: u32) -> Result<Vec<QueueHead>, StoreError> {
        let rows: Vec<(Uuid, i64, DateTime<Utc>)> = sqlx::query_as(
            "SELECT q.reservation_id, q.quantity, q.queued_at \
             FROM queue_entries q JOIN reservations r ON r.id = q.reservation_id \
             WHERE q.participant = $1 AND q.resource = $2 AND q.slot = $3 \
               AND r.state = 'QUEUED' AND r.queue_until > clock_timestamp() \
             ORDER BY q.seq LIMIT $4",
        )
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, quantity, since)| QueueHead {
                id,
                quantity,
                since,
            })
            .collect())
    }

    async fn queues(&self) -> Result<Vec<(QueueKey, i64)>, StoreError> {
        type Row = (
            String,
            String,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
            i64,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT participant, resource, min(during_start), min(during_end), count(*) \
             FROM queue_entries GROUP BY participant, resource, slot \
             ORDER BY participant, resource, slot",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(participant, resource, start, end, n)| {
                let during = interval(start, end);
                (
                    QueueKey {
                        participant,
                        resource,
                        during,
                    },
                    n,
                )
            })
            .collect())
    }

    async fn end_waits(&self, limit: u32) -> Result<Vec<Reservation>, StoreError> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "UPDATE reservations SET state = 'REJECTED', rejection_reason = $2, \
                 rejection_participant = (SELECT q.participant FROM queue_entries q \
                     WHERE q.reservation_id = reservations.id ORDER BY q.seq LIMIT 1), \
                 rejection_resource = (SELECT q.resource FROM queue_entries q \
                     WHERE q.reservation_id = reservations.id ORDER BY q.seq LIMIT 1), \
                 version = version + 1, updated_at = clock_timestamp() \
             WHERE id IN (SELECT id FROM reservations \
                          WHERE state = 'QUEUED' AND queue_until <= clock_timestamp() \
                          ORDER BY queue_until LIMIT $1 FOR UPDATE SKIP LOCKED) \
               AND state = 'QUEUED' \
             RETURNING id",
        )
        .bind(i64::from(limit))
        .bind(QUEUE_WAIT_ENDED)
        .fetch_all(&self.pool)
        .await?;
        let mut conn = self.pool.acquire().await?;
        let mut ended = Vec::with_capacity(ids.len());
        for id in ids {
            ended.push(Postgres::load_existing(&mut conn, id).await?);
        }
        Ok(ended)
    }

    async fn queue_place(&self, id: Uuid) -> Result<Option<QueuePlace>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let row: Option<EntryRow> = sqlx::query_as(concat!(
            select_entries!(),
            "WHERE q.reservation_id = $1 ORDER BY q.seq LIMIT 1"
        ))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let key = QueueKey {
            participant: row.participant,
            resource: row.resource,
            during: interval(row.during_start, row.during_end),
        };
        let position = position(&mut conn, &key, row.seq).await?;
        let since = row.first_queued_at.unwrap_or(row.queued_at);
        Ok(Some(QueuePlace {
            position,
            since,
            until: row.queue_until.unwrap_or(since),
            key,
        }))
    }

    async fn list_queue(
        &self,
        key: &QueueKey,
        after: i64,
        limit: u32,
    ) -> Result<QueuePage, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let rows: Vec<EntryRow> = sqlx::query_as(concat!(
            select_entries!(),
            "WHERE q.participant = $1 AND q.resource = $2 AND q.slot = $3 AND q.seq > $4 \
             ORDER BY q.seq LIMIT $5"
        ))
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
        let before = position(&mut conn, key, after).await?;
        let length = position(&mut conn, key, i64::MAX).await?;
        let entries = rows
            .into_iter()
            .zip(1..)
            .map(|(row, k)| QueuedReservation {
                seq: row.seq,
                position: before + k,
                reservation_id: row.reservation_id,
                holder: row.holder,
                quantity: row.quantity,
                since: row.queued_at,
                until: row.queue_until.unwrap_or(row.queued_at),
            })
            .collect();
        Ok(QueuePage { entries, length })
    }
}
