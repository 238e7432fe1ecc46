//! Recording Reserves on PostgreSQL, one path ([`create`]) for one Reserve or a batch the group
//! commit gathered (`group_commit.rs`): the (owner, holder)s' advisory locks (and the global
//! one under a global hold cap), then one statement inserting each reservation with its
//! branches unless its request id is taken or its holder is at the cap, answering with the
//! rows as inserted; the others are judged by the shared [`admission`].

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::{PgConnection, PgPool};
use uuid::Uuid;

use super::rows::{ReservationRow, millis};
use crate::domain::policy::HoldLimits;
use crate::domain::{NewReservation, RequestId, Reservation};
use crate::store::admission::{AdmissionSql, admission};
use crate::store::{Created, StoreError, WorkLease};

/// Advisory lock key serialising Reserves while a global hold cap is configured.
const GLOBAL_LIMIT_LOCK: i64 = 0x686f_6c64_6661_7374; // "holdfast"

/// A Reserve to record.
#[derive(Clone, Copy)]
pub(super) struct NewRow<'a> {
    pub new: &'a NewReservation,
    pub lease: WorkLease,
    pub limits: HoldLimits,
}

#[async_trait]
impl AdmissionSql for Postgres {
    async fn find_request(
        conn: &mut PgConnection,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<(Option<Uuid>, i64), StoreError> {
        Ok(sqlx::query_as(
            "SELECT (SELECT id FROM reservations WHERE owner = $3 AND holder = $1 AND request_id = $2), \
                    (SELECT count(*) FROM reservations WHERE owner = $3 AND holder = $1 \
                       AND state IN ('TRYING', 'HELD', 'QUEUED') \
                       AND (state <> 'HELD' OR expires_at > clock_timestamp()))",
        )
        .bind(holder)
        .bind(request_id.as_str())
        .bind(owner)
        .fetch_one(&mut *conn)
        .await?)
    }

    async fn count_live(conn: &mut PgConnection) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD', 'QUEUED') \
               AND (state <> 'HELD' OR expires_at > clock_timestamp())",
        )
        .fetch_one(&mut *conn)
        .await?)
    }
}

/// Rounds of inserting what may be inserted and judging the rest before a Reserve is
/// answered "retry" rather than loop: under the holders' locks only time changes the counts,
/// and only downwards, so a second insert takes.
const ROUNDS: usize = 4;

/// Records Reserves - one alone, or a batch of distinct (owner, holder)s the group commit
/// gathered - in one transaction: every (owner, holder)'s lock, in key order so concurrent
/// batches cannot deadlock (and the global one under a global hold cap), then [`admit`].
/// Answers in `rows` order.
pub(super) async fn create(pool: &PgPool, rows: &[NewRow<'_>]) -> Result<Vec<Created>, StoreError> {
    let mut tx = pool.begin().await?;
    // One (owner, holder)'s Reserves run this transaction one at a time, so counting its live
    // holds and inserting are one atomic step. (A statement of its own: the insert's snapshot
    // must see what committed while we waited for the lock.)
    let keys: Vec<String> = rows.iter().map(|r| r.new.limit_key()).collect();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k) FROM ( \
            SELECT DISTINCT hashtextextended(h, 0) AS k FROM UNNEST($1::text[]) AS h ORDER BY k) s",
    )
    .bind(&keys)
    .execute(&mut *tx)
    .await?;
    if rows.iter().any(|r| r.limits.total > 0) {
        // Rare configuration: every Reserve queues on one lock (the group commit runs each
        // alone), and admission is checked before the insert.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(GLOBAL_LIMIT_LOCK)
            .execute(&mut *tx)
            .await?;
    }
    let answers = admit(&mut tx, rows).await?;
    tx.commit().await?;
    Ok(answers)
}

/// Under the holders' locks: one statement inserts each reservation with its branches unless
/// its request id is taken or its holder is at the cap (checked by the statement's snapshot,
/// taken after the locks were granted), answering with the rows as inserted. Those it did not
/// insert are judged by [`admission`], by a later clock: a repeat of a recorded request, or a
/// holder at a cap, is answered so; a hold that lapsed in between, or a rejected reservation
/// with this request id discarded meanwhile (`Store::discard`), leaves nothing to refuse, so
/// they go round again. Under a global cap every row is judged before it is inserted (the
/// statement counts per holder only). Answers in `rows` order.
async fn admit(tx: &mut PgConnection, rows: &[NewRow<'_>]) -> Result<Vec<Created>, StoreError> {
    let capped = rows.iter().any(|r| r.limits.total > 0);
    let mut answers: Vec<Option<Created>> = rows.iter().map(|_| None).collect();
    let mut pending: Vec<usize> = (0..rows.len()).collect();
    for round in 0..ROUNDS {
        if capped || round > 0 {
            let mut still = Vec::with_capacity(pending.len());
            for i in pending {
                match admission::<Postgres>(&mut *tx, rows[i].new, rows[i].limits).await? {
                    Some(answer) => answers[i] = Some(answer),
                    None => still.push(i),
                }
            }
            pending = still;
        }
        if pending.is_empty() {
            break;
        }
        let round_rows: Vec<NewRow<'_>> = pending.iter().map(|&i| rows[i]).collect();
        let mut inserted = insert_rows(tx, &round_rows).await?;
        pending.retain(|&i| match inserted.remove(&rows[i].new.id) {
            Some(r) => {
                answers[i] = Some(Created::New(r));
                false
            }
            None => true,
        });
    }
    answers
        .into_iter()
        .zip(rows)
        .map(|(answer, row)| {
            answer.ok_or_else(|| {
                StoreError::Contended(format!(
                    "reservation of holder {:?} neither inserted nor refused",
                    row.new.holder
                ))
            })
        })
        .collect()
}

/// The one statement of [`admit`]: the reservations it inserted, by id.
async fn insert_rows(
    tx: &mut PgConnection,
    rows: &[NewRow<'_>],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let r = ReserveColumns::of(rows)?;
    let b = BranchColumns::of(rows);
    let written = sqlx::query_as::<_, ReservationRow>(INSERT_ROWS)
        .bind(&r.ids)
        .bind(&r.request_ids)
        .bind(&r.holders)
        .bind(&r.tokens)
        .bind(&r.ttls)
        .bind(&r.labels)
        .bind(&r.owners)
        .bind(&r.leases)
        .bind(&r.caps)
        .bind(&b.reservations)
        .bind(&b.positions)
        .bind(&b.ids)
        .bind(&b.participants)
        .bind(&b.resources)
        .bind(&b.quantities)
        .bind(&b.starts)
        .bind(&b.ends)
        .bind(&r.principals)
        .bind(&r.key_ids)
        .fetch_all(&mut *tx)
        .await?;
    let mut inserted: HashMap<Uuid, Reservation> = HashMap::with_capacity(written.len());
    for row in written {
        let r = row.into_domain()?;
        inserted.insert(r.id, r);
    }
    Ok(inserted)
}

/// The reservations of [`insert_rows`] as parallel arrays, for `UNNEST`.
struct ReserveColumns<'a> {
    ids: Vec<Uuid>,
    request_ids: Vec<&'a str>,
    holders: Vec<&'a str>,
    tokens: Vec<&'a [u8]>,
    ttls: Vec<i64>,
    labels: Vec<String>,
    owners: Vec<Uuid>,
    leases: Vec<i64>,
    caps: Vec<i64>,
    principals: Vec<&'a str>,
    key_ids: Vec<Option<&'a str>>,
}

impl<'a> ReserveColumns<'a> {
    fn of(rows: &[NewRow<'a>]) -> Result<Self, StoreError> {
        let n = rows.len();
        let mut c = ReserveColumns {
            ids: Vec::with_capacity(n),
            request_ids: Vec::with_capacity(n),
            holders: rows.iter().map(|r| r.new.holder.as_str()).collect(),
            tokens: Vec::with_capacity(n),
            ttls: Vec::with_capacity(n),
            labels: Vec::with_capacity(n),
            owners: Vec::with_capacity(n),
            leases: Vec::with_capacity(n),
            caps: Vec::with_capacity(n),
            principals: rows.iter().map(|r| r.new.owner.as_str()).collect(),
            key_ids: rows.iter().map(|r| r.new.token.key_id.as_deref()).collect(),
        };
        for job in rows {
            c.ids.push(job.new.id);
            c.request_ids.push(job.new.request_id.as_str());
            c.tokens.push(job.new.token.digest.as_slice());
            c.ttls
                .push(i64::try_from(job.new.ttl.as_millis()).unwrap_or(i64::MAX));
            c.labels.push(
                serde_json::to_string(&job.new.labels)
                    .map_err(|e| StoreError::Corrupt(format!("labels: {e}")))?,
            );
            c.owners.push(job.lease.owner);
            c.leases.push(millis(job.lease.duration));
            c.caps.push(i64::from(job.limits.per_holder));
        }
        Ok(c)
    }
}

/// The branches of [`insert_rows`]' reservations as parallel arrays, for `UNNEST`.
#[derive(Default)]
struct BranchColumns<'a> {
    reservations: Vec<Uuid>,
    positions: Vec<i32>,
    ids: Vec<Uuid>,
    participants: Vec<&'a str>,
    resources: Vec<&'a str>,
    quantities: Vec<i64>,
    starts: Vec<Option<DateTime<Utc>>>,
    ends: Vec<Option<DateTime<Utc>>>,
}

impl<'a> BranchColumns<'a> {
    fn of(rows: &[NewRow<'a>]) -> Self {
        let mut c = BranchColumns::default();
        for job in rows {
            // One participant-level branch id per participant, shared by its holds.
            let mut branch_ids: HashMap<&str, Uuid> = HashMap::new();
            for (i, h) in job.new.holds.iter().enumerate() {
                c.reservations.push(job.new.id);
                c.positions.push(i32::try_from(i).unwrap_or(i32::MAX));
                c.ids.push(
                    *branch_ids
                        .entry(&h.participant)
                        .or_insert_with(Uuid::new_v4),
                );
                c.participants.push(h.participant.as_str());
                c.resources.push(h.resource.as_str());
                c.quantities.push(h.quantity);
                c.starts.push(h.during.map(|d| d.start));
                c.ends.push(h.during.map(|d| d.end));
            }
        }
        c
    }
}

// Each row's admission is checked by this statement's snapshot, taken after every holder
// lock was granted. A taken request id is the unique key's conflict alone: a lookup of it
// here as well was planned, on a young table, as a walk of every row of the owner
// (`tests/store` `plans::a_reserves_record_walks_no_owner_index_on_a_young_table`).
const INSERT_ROWS: &str = concat!(
    "WITH i AS ( \
            SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::bigint[], \
                                 $6::text[], $7::uuid[], $8::bigint[], $9::bigint[], \
                                 $18::text[], $19::text[]) \
                AS i(id, request_id, holder, token_digest, ttl_ms, labels, lease_owner, lease_ms, \
                     cap, owner, token_key_id)), \
         w AS ( \
            INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, \
                                      token_key_id, ttl_ms, expires_at, labels, lease_owner, \
                                      lease_until) \
            SELECT i.id, i.request_id, i.holder, i.owner, 'TRYING', i.token_digest, \
                   i.token_key_id, i.ttl_ms, \
                   clock_timestamp() + i.ttl_ms * interval '1 millisecond', i.labels::jsonb, \
                   i.lease_owner, clock_timestamp() + i.lease_ms * interval '1 millisecond' \
            FROM i \
            WHERE (SELECT count(*) FROM reservations r \
                     WHERE r.owner = i.owner AND r.holder = i.holder \
                     AND r.state IN ('TRYING', 'HELD', 'QUEUED') \
                     AND (r.state <> 'HELD' OR r.expires_at > clock_timestamp())) < i.cap \
            ON CONFLICT (owner, holder, request_id) DO NOTHING \
            RETURNING ",
    reservation_columns!(),
    "), ins AS ( \
            INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                                  quantity, during_start, during_end, state) \
            SELECT u.reservation_id, u.position, u.branch_id, u.participant, u.resource, \
                   u.quantity, u.during_start, u.during_end, 'PENDING' \
            FROM UNNEST($10::uuid[], $11::int[], $12::uuid[], $13::text[], $14::text[], \
                        $15::bigint[], $16::timestamptz[], $17::timestamptz[]) \
                AS u(reservation_id, position, branch_id, participant, resource, quantity, \
                     during_start, during_end) \
            JOIN w ON w.id = u.reservation_id \
            RETURNING *) \
         SELECT w.*, b.* FROM w CROSS JOIN LATERAL (SELECT ",
    branch_arrays!(),
    " FROM (SELECT * FROM ins WHERE ins.reservation_id = w.id ORDER BY position) br) b"
);
