//! SQLite's statements for the waitlists (SPEC 11): `store/postgres/waitlist.rs` in SQLite's
//! dialect. Every write goes through the one writer (`begin_write`), whose write lock stands in
//! for PostgreSQL's advisory and row locks.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::SqliteConnection;
use uuid::Uuid;

use super::SqliteStore;
use super::rows::{micros, micros_of, time_of};
use crate::domain::waitlist::{
    QUEUE_WAIT_ENDED, QueueKey, QueuePage, QueuePlace, QueuedReservation,
};
use crate::domain::{Hold, Interval, Reservation};
use crate::store::sql::ReservationSql;
use crate::store::waitlist::{self, JoinQueue, Joined, QueueHead, QueueStore, WaitlistSql};
use crate::store::{StoreError, WorkLease};

fn interval(start: Option<i64>, end: Option<i64>) -> Result<Option<Interval>, StoreError> {
    Ok(match (start, end) {
        (Some(s), Some(e)) => Some(Interval {
            start: time_of(s)?,
            end: time_of(e)?,
        }),
        _ => None,
    })
}

#[async_trait]
impl WaitlistSql for Sqlite {
    async fn lock_queues(_: &mut SqliteConnection, _: &[QueueKey]) -> Result<(), StoreError> {
        // The write transaction holds the database write lock already.
        Ok(())
    }

    async fn queue_length(
        conn: &mut SqliteConnection,
        key: &QueueKey,
        id: Uuid,
    ) -> Result<(i64, bool), StoreError> {
        Ok(sqlx::query_as(
            "SELECT count(*), coalesce(max(reservation_id = ?4), 0) FROM queue_entries \
             WHERE participant = ?1 AND resource = ?2 AND slot = ?3",
        )
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(id)
        .fetch_one(&mut *conn)
        .await?)
    }

    async fn mark_queued(
        conn: &mut SqliteConnection,
        id: Uuid,
        release: bool,
        wait: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(concat!(
            "UPDATE reservations SET \
                 state = CASE WHEN ?2 THEN 'CANCELLING' ELSE 'QUEUED' END, \
                 release_outcome = CASE WHEN ?2 THEN 'QUEUED' END, \
                 queued_at = coalesce(queued_at, ",
            sqlite_now_us!(),
            "), queue_until = coalesce(queue_until, ",
            sqlite_now_us!(),
            " + ?3), \
                 lease_owner = CASE WHEN ?2 THEN lease_owner END, \
                 lease_until = CASE WHEN ?2 THEN lease_until END, \
                 version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'TRYING'"
        ))
        .bind(id)
        .bind(release)
        .bind(micros(wait))
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_queue_entry(
        conn: &mut SqliteConnection,
        id: Uuid,
        hold: &Hold,
    ) -> Result<(), StoreError> {
        let key = QueueKey::of(hold);
        sqlx::query(concat!(
            "INSERT INTO queue_entries (participant, resource, slot, during_start, during_end, \
                                        reservation_id, quantity, queued_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ",
            sqlite_now_us!(),
            ") ON CONFLICT (reservation_id, participant, resource, slot) DO NOTHING"
        ))
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(hold.during.map(|d| micros_of(d.start)))
        .bind(hold.during.map(|d| micros_of(d.end)))
        .bind(id)
        .bind(hold.quantity)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn mark_offered(
        conn: &mut SqliteConnection,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<i32>, StoreError> {
        Ok(sqlx::query_scalar(concat!(
            "UPDATE reservations SET state = 'TRYING', release_outcome = NULL, \
                 generation = generation + 1, expires_at = ",
            sqlite_now_us!(),
            " + ttl_ms * 1000, lease_owner = ?2, lease_until = ",
            sqlite_now_us!(),
            " + ?3, version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'QUEUED' AND queue_until > ",
            sqlite_now_us!(),
            " RETURNING generation"
        ))
        .bind(id)
        .bind(lease.owner)
        .bind(micros(lease.duration))
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
    during_start: Option<i64>,
    during_end: Option<i64>,
    reservation_id: Uuid,
    holder: String,
    quantity: i64,
    queued_at: i64,
    /// When the reservation first joined a queue: its wait counts from then.
    first_queued_at: Option<i64>,
    queue_until: Option<i64>,
}

impl EntryRow {
    fn key(&self) -> Result<QueueKey, StoreError> {
        Ok(QueueKey {
            participant: self.participant.clone(),
            resource: self.resource.clone(),
            during: interval(self.during_start, self.during_end)?,
        })
    }
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
async fn position(
    conn: &mut SqliteConnection,
    key: &QueueKey,
    seq: i64,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM queue_entries \
         WHERE participant = ?1 AND resource = ?2 AND slot = ?3 AND seq <= ?4",
    )
    .bind(&key.participant)
    .bind(&key.resource)
    .bind(key.slot())
    .bind(seq)
    .fetch_one(&mut *conn)
    .await?)
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn join_queue(&self, job: &JoinQueue<'_>) -> Result<Joined, StoreError> {
        waitlist::join_queue::<Sqlite>(&self.pool, job).await
    }

    async fn begin_offer(
        &self,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<Reservation>, StoreError> {
        waitlist::begin_offer::<Sqlite>(&self.pool, id, lease).await
    }

    async fn lease_queue(&self, key: &QueueKey, lease: WorkLease) -> Result<bool, StoreError> {
        let mut tx = Sqlite::begin_write(&self.pool).await?;
        let done = sqlx::query(concat!(
            "INSERT INTO queue_offer_leases AS l (participant, resource, slot, lease_owner, \
                                                  lease_until) VALUES (?1, ?2, ?3, ?4, ",
            sqlite_now_us!(),
            " + ?5) ON CONFLICT (participant, resource, slot) DO UPDATE \
                 SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until \
                 WHERE l.lease_owner = excluded.lease_owner OR l.lease_until <= ",
            sqlite_now_us!()
        ))
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(lease.owner)
        .bind(micros(lease.duration))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn queue_heads(&self, key: &QueueKey, limit: u32) -> Result<Vec<QueueHead>, StoreError> {
        let rows: Vec<(Uuid, i64, i64)> = sqlx::query_as(concat!(
            "SELECT q.reservation_id, q.quantity, q.queued_at \
             FROM queue_entries q JOIN reservations r ON r.id = q.reservation_id \
             WHERE q.participant = ?1 AND q.resource = ?2 AND q.slot = ?3 \
               AND r.state = 'QUEUED' AND r.queue_until > ",
            sqlite_now_us!(),
            " ORDER BY q.seq LIMIT ?4"
        ))
        .bind(&key.participant)
        .bind(&key.resource)
        .bind(key.slot())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, quantity, since)| {
                Ok(QueueHead {
                    id,
                    quantity,
                    since: time_of(since)?,
                })
            })
            .collect()
    }

    async fn queues(&self) -> Result<Vec<(QueueKey, i64)>, StoreError> {
        let rows: Vec<(String, String, Option<i64>, Option<i64>, i64)> = sqlx::query_as(
            "SELECT participant, resource, min(during_start), min(during_end), count(*) \
             FROM queue_entries GROUP BY participant, resource, slot \
             ORDER BY participant, resource, slot",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(participant, resource, start, end, n)| {
                Ok((
                    QueueKey {
                        participant,
                        resource,
                        during: interval(start, end)?,
                    },
                    n,
                ))
            })
            .collect()
    }

    async fn end_waits(&self, limit: u32) -> Result<Vec<Reservation>, StoreError> {
        let mut tx = Sqlite::begin_write(&self.pool).await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(concat!(
            "UPDATE reservations SET state = 'REJECTED', rejection_reason = ?2, \
                 rejection_participant = (SELECT q.participant FROM queue_entries q \
                     WHERE q.reservation_id = reservations.id ORDER BY q.seq LIMIT 1), \
                 rejection_resource = (SELECT q.resource FROM queue_entries q \
                     WHERE q.reservation_id = reservations.id ORDER BY q.seq LIMIT 1), \
                 version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id IN (SELECT id FROM reservations WHERE state = 'QUEUED' AND queue_until <= ",
            sqlite_now_us!(),
            " ORDER BY queue_until LIMIT ?1) RETURNING id"
        ))
        .bind(i64::from(limit))
        .bind(QUEUE_WAIT_ENDED)
        .fetch_all(&mut *tx)
        .await?;
        let mut ended = Vec::with_capacity(ids.len());
        for id in ids {
            ended.push(Sqlite::load_existing(&mut tx, id).await?);
        }
        tx.commit().await?;
        Ok(ended)
    }

    async fn queue_place(&self, id: Uuid) -> Result<Option<QueuePlace>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let row: Option<EntryRow> = sqlx::query_as(concat!(
            select_entries!(),
            "WHERE q.reservation_id = ?1 ORDER BY q.seq LIMIT 1"
        ))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let key = row.key()?;
        let position = position(&mut conn, &key, row.seq).await?;
        let since = time_of(row.first_queued_at.unwrap_or(row.queued_at))?;
        Ok(Some(QueuePlace {
            position,
            since,
            until: row.queue_until.map(time_of).transpose()?.unwrap_or(since),
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
            "WHERE q.participant = ?1 AND q.resource = ?2 AND q.slot = ?3 AND q.seq > ?4 \
             ORDER BY q.seq LIMIT ?5"
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
        let mut entries = Vec::with_capacity(rows.len());
        for (row, k) in rows.into_iter().zip(1..) {
            let since = time_of(row.queued_at)?;
            entries.push(QueuedReservation {
                seq: row.seq,
                position: before + k,
                reservation_id: row.reservation_id,
                holder: row.holder,
                quantity: row.quantity,
                since,
                until: row.queue_until.map(time_of).transpose()?.unwrap_or(since),
            });
        }
        Ok(QueuePage { entries, length })
    }
}
