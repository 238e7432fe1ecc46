//! Reference participant `stock-redis`: a flash-sale fast gate for interchangeable units
//! (seed 000). Redis decides Try/Confirm/Cancel with one Lua script each; Postgres keeps the
//! durable record of truth (capacity and every confirmed hold).
//!
//! # Keys (all under a configurable prefix `P`, e.g. `hf:stock-redis:`)
//! - `P a:<res>`, `P h:<res>`, `P c:<res>`, `P cap:<res>`: available, held, confirmed and
//!   capacity of an item (`capacity = available + held + confirmed`);
//! - `P b:<len(reservation_id)>:<reservation_id>:<branch_id>`: the branch record, a hash that
//!   is this participant's barrier: `s` state (`held`, `rejected`, `confirmed`, `cancelled`,
//!   `hold_lost`), `a`/`r` the first Try answer and reason, `u` hold_until (ms), `e` epoch of
//!   the confirm, `n` and `i1..`/`q1..` the items; a finished record expires (see
//!   "Retention of finished records");
//! - `P expiry`: sorted set of held branch records by `expires_at + orphan_grace` (ms);
//! - `P ready`: present once the data set is built; holds its epoch.
//!
//! # Scripts
//! Try checks every item and, only if all fit, decrements the counters, writes the record and
//! the expiry entry: all in one script, so they change together or not at all. Confirm and
//! Cancel move units only through the record's state transition (`held` -> `confirmed` /
//! `cancelled`), so repeats and races never move units twice. A Cancel or Confirm before its
//! Try writes a tombstone (`cancelled` / `hold_lost`); the late Try answers `REJECTED`.
//! Confirm after Cancel answers `CANCELLED`, Cancel after Confirm `CONFIRMED`, unchanged.
//!
//! # Retention of finished records
//! A record that becomes final (`confirmed`, `cancelled`, `rejected`, `hold_lost`) gets a
//! Redis expiry in the same script, so the data set does not grow without bound:
//! - a hold confirmed, cancelled or reclaimed, and a refused Try: at its deadline
//!   (`expires_at + orphan_grace`, the `u` of the record or of the Try) + `retention`;
//! - a tombstone (Cancel or Confirm before any Try, so no deadline is known):
//!   `orphan_grace + retention` from now;
//! - a `confirmed` record restored from the durable record: `retention` from now.
//!
//! A `held` record never expires (the reconciler finishes it). `retention` (default 7 days,
//! [`DEFAULT_RETENTION`]) is meant to be far longer than any retry of the coordinator, so
//! while a record is there every late Try, Confirm or Cancel answers exactly as above. After
//! it expired the branch is unknown to Redis again, and:
//! - a confirmed branch still answers CONFIRMED to Confirm and to Cancel: the durable row in
//!   `stock_redis_confirmed` answers, and the record is restored (for another retention);
//! - any other branch: Confirm answers `HOLD_LOST`, Cancel `CANCELLED` (tombstones, no unit
//!   moves); a Try would be decided anew, and a hold it took carries its old deadline, so the
//!   reconciler returns its units as soon as `expires_at + orphan_grace` has passed.
//!
//! # Durable record
//! Confirm = script (held -> confirmed, returns the items and the epoch it ran under), then
//! `INSERT .. ON CONFLICT DO NOTHING` into `stock_redis_confirmed` under a shared lock of the
//! epoch row and only if the epoch is still current, then the answer. A repeated Confirm
//! re-inserts (a no-op), so an answer CONFIRMED always means a durable row.
//!
//! # Reconciler
//! [`StockRedis::reconcile`] (also run by a background task, and woken at once when a request
//! meets a missing data set) reclaims holds whose `expires_at + orphan_grace` passed by the
//! Redis clock (one script per batch: units back, state `hold_lost`, so each hold is returned
//! exactly once however many reconcilers run), and reports drift of Redis counters against
//! Postgres (capacity, confirmed units).
//!
//! # After Redis loses its data (a restart without persistence, a flush)
//! `P ready` is gone, so every script refuses: Try answers `REJECTED "rebuilding"`, Confirm and
//! Cancel `UNAVAILABLE` (the coordinator retries). The reconciler then rebuilds, serialised by a
//! Postgres advisory lock: it bumps the epoch (waiting for Confirms still writing their durable
//! row; later ones of the old epoch answer `HOLD_LOST`), restores a `confirmed` record for each
//! durable branch (so repeats and a Cancel after Confirm still answer `CONFIRMED`), and sets per
//! item `available = capacity - confirmed - (holds it can still see)`. Holds granted but not
//! confirmed before the loss are gone: their Confirm answers `HOLD_LOST` (the coordinator
//! fails the reservation and refunds). Confirmed units are never resold. Tombstones are lost
//! too: a Try arriving after its Cancel and after the loss may hold; it is reclaimed after
//! `expires_at + orphan_grace`. Only one stock-redis participant per database.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use sqlx::{PgPool, Row};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::ParticipantError;
use super::admin::ResourceCounts;
use crate::participant::{BranchAnswer, BranchKey, ResourceError, TryOutcome};
use crate::proto::participant_server::{Participant, ParticipantServer};
use crate::proto::resource_admin_server::{ResourceAdmin, ResourceAdminServer};
use crate::proto::{
    BranchRequest, BranchResponse, GetResourceRequest, PutResourcesRequest, PutResourcesResponse,
    ResourceStatus, TryRequest, TryResponse, branch, try_response,
};

/// The participant's name (it is also the CLI kind).
pub const NAME: &str = "stock-redis";
/// Default key prefix in Redis.
pub const DEFAULT_PREFIX: &str = "hf:stock-redis:";
/// Default retention of a finished branch record past its deadline (see the module doc).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The reason of a Try refused while the Redis data set is being rebuilt.
pub const REBUILDING: &str = "rebuilding";

const MAX_ID_BYTES: usize = 128;
const MAX_ITEMS: usize = 64;
const RECLAIM_BATCH: usize = 1000;
const RESTORE_CONCURRENCY: usize = 256;
/// Advisory lock key serialising rebuilds ("hfsr").
const REBUILD_LOCK: i64 = 0x6866_7372;

/// Try. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index,
/// KEYS[4..3+n] = available counters, KEYS[4+n..3+2n] = held counters (items sorted).
/// ARGV[1] = hold_until (ms), ARGV[2] = n, ARGV[3..2+n] = resources, ARGV[3+n..2+2n] = quantities,
/// ARGV[3+2n] = retention (ms): a refused Try's record expires at hold_until + retention.
/// Returns {answer, reason}, answer `held` or `rejected`.
const TRY_LUA: &str = r#"
local rec = KEYS[1]
local function refuse(reason)
  redis.call('HSET', rec, 's', 'rejected', 'a', 'rejected', 'r', reason)
  redis.call('PEXPIREAT', rec, string.format('%d', tonumber(ARGV[1]) + tonumber(ARGV[#ARGV])))
  return {'rejected', reason}
end
local s = redis.call('HGET', rec, 's')
if s then
  local a = redis.call('HGET', rec, 'a')
  if a then return {a, redis.call('HGET', rec, 'r') or ''} end
  local reason = 'branch was cancelled before its Try'
  if s == 'hold_lost' then reason = 'branch was confirmed before its Try; nothing is held' end
  redis.call('HSET', rec, 'a', 'rejected', 'r', reason)
  return {'rejected', reason}
end
if not redis.call('GET', KEYS[2]) then return refuse('rebuilding') end
local n = tonumber(ARGV[2])
for i = 1, n do
  local avail = redis.call('GET', KEYS[3 + i])
  local want = tonumber(ARGV[2 + n + i])
  local reason = nil
  if not avail then
    reason = 'item ' .. ARGV[2 + i] .. ' does not exist'
  elseif tonumber(avail) < want then
    reason = 'insufficient stock of ' .. ARGV[2 + i] .. ': ' .. ARGV[2 + n + i] .. ' requested, ' .. avail .. ' available'
  end
  if reason then return refuse(reason) end
end
local fields = {'s', 'held', 'a', 'held', 'r', '', 'u', ARGV[1], 'n', ARGV[2]}
for i = 1, n do
  local q = ARGV[2 + n + i]
  redis.call('DECRBY', KEYS[3 + i], q)
  redis.call('INCRBY', KEYS[3 + n + i], q)
  fields[#fields + 1] = 'i' .. i
  fields[#fields + 1] = ARGV[2 + i]
  fields[#fields + 1] = 'q' .. i
  fields[#fields + 1] = q
end
redis.call('HSET', rec, unpack(fields))
redis.call('ZADD', KEYS[3], ARGV[1], rec)
return {'held', ''}
"#;

/// Confirm. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index.
/// ARGV[1] = key prefix (item counters are `<prefix>h:<res>`, `<prefix>c:<res>`), ARGV[2] =
/// retention (ms), ARGV[3] = a tombstone's time to live (ms).
/// Returns {outcome, epoch, res1, q1, ...}; outcome `confirmed` (with the items to make
/// durable and the epoch of the confirm), `cancelled`, `hold_lost`, `missing` (no record: a
/// `hold_lost` tombstone was written) or `rebuilding`.
const CONFIRM_LUA: &str = r#"
local epoch = redis.call('GET', KEYS[2])
if not epoch then return {'rebuilding', ''} end
local rec = KEYS[1]
local s = redis.call('HGET', rec, 's')
if not s then
  redis.call('HSET', rec, 's', 'hold_lost')
  redis.call('PEXPIRE', rec, ARGV[3])
  return {'missing', epoch}
end
local n = tonumber(redis.call('HGET', rec, 'n') or '0')
if s == 'held' then
  for i = 1, n do
    local res = redis.call('HGET', rec, 'i' .. i)
    local q = redis.call('HGET', rec, 'q' .. i)
    redis.call('DECRBY', ARGV[1] .. 'h:' .. res, q)
    redis.call('INCRBY', ARGV[1] .. 'c:' .. res, q)
  end
  redis.call('HSET', rec, 's', 'confirmed', 'e', epoch)
  redis.call('ZREM', KEYS[3], rec)
  local u = tonumber(redis.call('HGET', rec, 'u') or '0')
  redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[2])))
  s = 'confirmed'
end
if s == 'confirmed' then
  local out = {'confirmed', redis.call('HGET', rec, 'e') or epoch}
  for i = 1, n do
    out[#out + 1] = redis.call('HGET', rec, 'i' .. i)
    out[#out + 1] = redis.call('HGET', rec, 'q' .. i)
  end
  return out
end
if s == 'rejected' or s == 'hold_lost' then return {'hold_lost', epoch} end
return {'cancelled', epoch}
"#;

/// Cancel. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index.
/// ARGV[1] = key prefix, ARGV[2] = retention (ms), ARGV[3] = a tombstone's time to live (ms).
/// Returns {outcome, epoch}: `cancelled`, `confirmed` (refused), `tombstone` (no record: a
/// `cancelled` tombstone was written) or `rebuilding`.
const CANCEL_LUA: &str = r#"
local epoch = redis.call('GET', KEYS[2])
if not epoch then return {'rebuilding', ''} end
local rec = KEYS[1]
local s = redis.call('HGET', rec, 's')
if not s then
  redis.call('HSET', rec, 's', 'cancelled')
  redis.call('PEXPIRE', rec, ARGV[3])
  return {'tombstone', epoch}
end
if s == 'rejected' then
  redis.call('HSET', rec, 's', 'cancelled')
  return {'cancelled', epoch}
end
if s == 'held' then
  local n = tonumber(redis.call('HGET', rec, 'n') or '0')
  for i = 1, n do
    local res = redis.call('HGET', rec, 'i' .. i)
    local q = redis.call('HGET', rec, 'q' .. i)
    redis.call('INCRBY', ARGV[1] .. 'a:' .. res, q)
    redis.call('DECRBY', ARGV[1] .. 'h:' .. res, q)
  end
  redis.call('HSET', rec, 's', 'cancelled')
  redis.call('ZREM', KEYS[3], rec)
  local u = tonumber(redis.call('HGET', rec, 'u') or '0')
  redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[2])))
  return {'cancelled', epoch}
end
if s == 'confirmed' then return {'confirmed', epoch} end
return {'cancelled', epoch}
"#;

/// Orphan reclaim. KEYS[1] = expiry index. ARGV[1] = key prefix, ARGV[2] = batch size,
/// ARGV[3] = retention (ms). Releases held records whose hold_until is before the Redis clock
/// (state `hold_lost`, units back to available, expiring at hold_until + retention). Returns
/// how many were released.
const RECLAIM_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now), 'LIMIT', 0, tonumber(ARGV[2]))
local count = 0
for _, rec in ipairs(due) do
  redis.call('ZREM', KEYS[1], rec)
  if redis.call('HGET', rec, 's') == 'held' then
    local n = tonumber(redis.call('HGET', rec, 'n') or '0')
    for i = 1, n do
      local res = redis.call('HGET', rec, 'i' .. i)
      local q = redis.call('HGET', rec, 'q' .. i)
      redis.call('INCRBY', ARGV[1] .. 'a:' .. res, q)
      redis.call('DECRBY', ARGV[1] .. 'h:' .. res, q)
    end
    redis.call('HSET', rec, 's', 'hold_lost')
    local u = tonumber(redis.call('HGET', rec, 'u') or '0')
    redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[3])))
    count = count + 1
  end
end
return count
"#;

/// Demotes a confirm of a lost epoch. KEYS[1] = branch record. ARGV[1] = the old epoch.
/// Returns 1 if the record was `confirmed` under that epoch and is now `hold_lost`.
const DEMOTE_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 's') == 'confirmed' and redis.call('HGET', KEYS[1], 'e') == ARGV[1] then
  redis.call('HSET', KEYS[1], 's', 'hold_lost')
  return 1
end
return 0
"#;

/// Restores a durable confirmed branch. KEYS[1] = branch record, KEYS[2] = expiry index.
/// ARGV[1] = epoch, ARGV[2] = n, then resource, quantity per item, then the retention (ms)
/// from now. Returns 1 if written.
const RESTORE_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 's') == 'confirmed' then return 0 end
redis.call('DEL', KEYS[1])
local n = tonumber(ARGV[2])
local fields = {'s', 'confirmed', 'a', 'held', 'r', '', 'e', ARGV[1], 'n', ARGV[2]}
for i = 1, n do
  fields[#fields + 1] = 'i' .. i
  fields[#fields + 1] = ARGV[1 + 2 * i]
  fields[#fields + 1] = 'q' .. i
  fields[#fields + 1] = ARGV[2 + 2 * i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIRE', KEYS[1], ARGV[#ARGV])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
"#;

/// Finishes a rebuild. KEYS[1] = ready marker, KEYS[2] = expiry index.
/// ARGV[1] = new epoch, ARGV[2] = key prefix, ARGV[3] = n, then per item resource, capacity,
/// durable confirmed units. Sets every item's counters from the durable record and the holds
/// still visible, then the marker. Returns -1 if the marker already existed, else n.
const FINISH_LUA: &str = r#"
if redis.call('GET', KEYS[1]) then return -1 end
local held = {}
for _, rec in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if redis.call('HGET', rec, 's') == 'held' then
    local n = tonumber(redis.call('HGET', rec, 'n') or '0')
    for i = 1, n do
      local res = redis.call('HGET', rec, 'i' .. i)
      held[res] = (held[res] or 0) + tonumber(redis.call('HGET', rec, 'q' .. i))
    end
  else
    redis.call('ZREM', KEYS[2], rec)
  end
end
local n = tonumber(ARGV[3])
for i = 1, n do
  local res = ARGV[1 + 3 * i]
  local cap = tonumber(ARGV[2 + 3 * i])
  local conf = tonumber(ARGV[3 + 3 * i])
  local h = held[res] or 0
  redis.call('SET', ARGV[2] .. 'cap:' .. res, cap)
  redis.call('SET', ARGV[2] .. 'c:' .. res, conf)
  redis.call('SET', ARGV[2] .. 'h:' .. res, h)
  redis.call('SET', ARGV[2] .. 'a:' .. res, cap - conf - h)
end
redis.call('SET', KEYS[1], ARGV[1])
return n
"#;

/// Creates or resizes items, all or nothing. KEYS[1] = ready marker. ARGV[1] = key prefix,
/// ARGV[2] = n, then resource, capacity per item. Returns {'ok'}, {'rebuilding'} or
/// {'refused', resource, held, confirmed} when a capacity is below what is held and confirmed.
const PUT_LUA: &str = r#"
if not redis.call('GET', KEYS[1]) then return {'rebuilding'} end
local n = tonumber(ARGV[2])
local cur = {}
for i = 1, n do
  local res = ARGV[1 + 2 * i]
  local h = tonumber(redis.call('GET', ARGV[1] .. 'h:' .. res) or '0')
  local c = tonumber(redis.call('GET', ARGV[1] .. 'c:' .. res) or '0')
  if h + c > tonumber(ARGV[2 + 2 * i]) then return {'refused', res, tostring(h), tostring(c)} end
  cur[i] = {h, c}
end
for i = 1, n do
  local res = ARGV[1 + 2 * i]
  local cap = tonumber(ARGV[2 + 2 * i])
  redis.call('SET', ARGV[1] .. 'cap:' .. res, cap)
  redis.call('SET', ARGV[1] .. 'h:' .. res, cur[i][1])
  redis.call('SET', ARGV[1] .. 'c:' .. res, cur[i][2])
  redis.call('SET', ARGV[1] .. 'a:' .. res, cap - cur[i][1] - cur[i][2])
end
return {'ok'}
"#;

static TRY: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(TRY_LUA));
static CONFIRM: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CONFIRM_LUA));
static CANCEL: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CANCEL_LUA));
static RECLAIM: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RECLAIM_LUA));
static DEMOTE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DEMOTE_LUA));
static RESTORE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RESTORE_LUA));
static FINISH: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(FINISH_LUA));
static PUT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(PUT_LUA));

/// Errors of the stock-redis participant; mapped to [`Status`] in one place (`From` below).
#[derive(Debug, thiserror::Error)]
pub enum StockRedisError {
    /// A request field is missing or malformed.
    #[error("{field} {message}")]
    InvalidArgument {
        /// The offending field (`items[2].quantity`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A named resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Refused in the current state; nothing changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The Redis data set is being rebuilt; retry shortly.
    #[error("the Redis data set is being rebuilt")]
    Rebuilding,
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Postgres failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the schema failed.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A broken invariant in stored data.
    #[error("internal: {0}")]
    Internal(String),
}

impl StockRedisError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<StockRedisError> for Status {
    fn from(err: StockRedisError) -> Self {
        match err {
            StockRedisError::InvalidArgument { field, message } => {
                ResourceError::invalid(field, message).into()
            }
            StockRedisError::NotFound(m) => Status::not_found(m),
            StockRedisError::FailedPrecondition(m) => Status::failed_precondition(m),
            StockRedisError::Rebuilding => {
                Status::unavailable("the Redis data set is being rebuilt; retry")
            }
            StockRedisError::Database(e) => ResourceError::Database(e).into(),
            StockRedisError::Redis(e) => {
                tracing::warn!(error = %e, "redis failure");
                Status::unavailable("redis temporarily unavailable; retry")
            }
            err @ (StockRedisError::Migrate(_) | StockRedisError::Internal(_)) => {
                tracing::error!(error = %err, "internal failure");
                Status::internal("internal error")
            }
        }
    }
}

/// How to run the stock-redis participant.
#[derive(Clone, Debug)]
pub struct StockRedisSettings {
    /// Redis URL, e.g. `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// Prefix of every key this participant owns.
    pub key_prefix: String,
    /// How long after `expires_at` an unreleased hold is kept before the reconciler may
    /// reclaim it (default one hour).
    pub orphan_grace: Duration,
    /// How long a finished branch record stays in Redis past its deadline (see the module
    /// doc; default 7 days).
    pub retention: Duration,
    /// How often the background reconciler runs.
    pub reconcile_every: Duration,
}

impl StockRedisSettings {
    /// Settings with the default prefix, grace, retention and a one-second reconciler period.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Self {
            redis_url: redis_url.into(),
            key_prefix: DEFAULT_PREFIX.to_owned(),
            orphan_grace: crate::participant::DEFAULT_ORPHAN_GRACE,
            retention: DEFAULT_RETENTION,
            reconcile_every: Duration::from_secs(1),
        }
    }
}

/// What one [`StockRedis::reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Whether the Redis data set was missing and was rebuilt from the durable record.
    pub rebuilt: bool,
    /// Holds past `expires_at + orphan_grace` whose units were returned.
    pub reclaimed: usize,
    /// Differences between Redis and the durable record, for people (also logged).
    pub drift: Vec<String>,
}

/// The stock-redis participant: `tcc.v1.Participant` + `tcc.v1.ResourceAdmin` over Redis
/// with a durable Postgres record. Cheap to clone.
#[derive(Clone)]
pub struct StockRedis {
    inner: Arc<Inner>,
}

struct Inner {
    redis: ConnectionManager,
    pool: PgPool,
    prefix: String,
    grace_ms: i64,
    /// Retention of a finished record past its deadline (ms).
    retention_ms: i64,
    /// Time to live of a tombstone: `orphan_grace + retention` (ms).
    tombstone_ms: i64,
    wake: tokio::sync::Notify,
}

/// The ready marker and an item's capacity, available, held and confirmed counters.
type CountsReply = (
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// A validated Try.
struct TryArgs {
    key: BranchKey,
    hold_until_ms: i64,
    items: Vec<(String, i64)>,
}

impl StockRedis {
    /// Applies the participants' schema and connects to Redis. The data set is built by the
    /// first [`reconcile`](Self::reconcile) (done by [`run`](Self::run)).
    pub async fn connect(
        settings: &StockRedisSettings,
        pool: PgPool,
    ) -> Result<Self, StockRedisError> {
        super::MIGRATOR.run(&pool).await?;
        let client = redis::Client::open(settings.redis_url.as_str())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let redis = ConnectionManager::new_with_config(client, config).await?;
        let grace_ms = i64::try_from(settings.orphan_grace.as_millis())
            .map_err(|_| StockRedisError::Internal("orphan grace out of range".to_owned()))?;
        let retention_ms = i64::try_from(settings.retention.as_millis())
            .ok()
            .filter(|ms| *ms > 0)
            .ok_or_else(|| StockRedisError::Internal("retention out of range".to_owned()))?;
        let tombstone_ms = grace_ms
            .checked_add(retention_ms)
            .ok_or_else(|| StockRedisError::Internal("retention out of range".to_owned()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                redis,
                pool,
                prefix: settings.key_prefix.clone(),
                grace_ms,
                retention_ms,
                tombstone_ms,
                wake: tokio::sync::Notify::new(),
            }),
        })
    }

    fn conn(&self) -> ConnectionManager {
        self.inner.redis.clone()
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.inner.prefix)
    }

    fn record_key(&self, key: &BranchKey) -> String {
        format!(
            "{}b:{}:{}:{}",
            self.inner.prefix,
            key.reservation_id.len(),
            key.reservation_id,
            key.branch_id
        )
    }

    /// Try: holds every item or none (one script).
    async fn try_branch(&self, args: TryArgs) -> Result<TryOutcome, StockRedisError> {
        let mut inv = TRY.prepare_invoke();
        inv.key(self.record_key(&args.key))
            .key(self.key("ready"))
            .key(self.key("expiry"));
        for (res, _) in &args.items {
            inv.key(self.key(&format!("a:{res}")));
        }
        for (res, _) in &args.items {
            inv.key(self.key(&format!("h:{res}")));
        }
        inv.arg(args.hold_until_ms).arg(args.items.len());
        for (res, _) in &args.items {
            inv.arg(res);
        }
        for (_, q) in &args.items {
            inv.arg(*q);
        }
        inv.arg(self.inner.retention_ms);
        let (answer, reason): (String, String) = inv.invoke_async(&mut self.conn()).await?;
        match answer.as_str() {
            "held" => Ok(TryOutcome::Held),
            "rejected" => {
                if reason == REBUILDING {
                    self.inner.wake.notify_one();
                }
                Ok(TryOutcome::Rejected(reason))
            }
            other => Err(StockRedisError::Internal(format!("try answered {other:?}"))),
        }
    }

    /// Confirm: the script moves the hold to confirmed, then the durable row is written,
    /// then the answer.
    async fn confirm_branch(&self, key: &BranchKey) -> Result<BranchAnswer, StockRedisError> {
        let rec = self.record_key(key);
        let out: Vec<String> = CONFIRM
            .key(&rec)
            .key(self.key("ready"))
            .key(self.key("expiry"))
            .arg(&self.inner.prefix)
            .arg(self.inner.retention_ms)
            .arg(self.inner.tombstone_ms)
            .invoke_async(&mut self.conn())
            .await?;
        let (outcome, epoch) = match out.as_slice() {
            [o, e, ..] => (o.as_str(), e.as_str()),
            _ => return Err(StockRedisError::Internal("short confirm answer".to_owned())),
        };
        match outcome {
            "rebuilding" => {
                self.inner.wake.notify_one();
                Err(StockRedisError::Rebuilding)
            }
            "cancelled" => Ok(BranchAnswer::Cancelled),
            "hold_lost" => Ok(BranchAnswer::HoldLost),
            "missing" => self.confirm_missing(key, &rec, epoch).await,
            "confirmed" => {
                let epoch: i64 = epoch
                    .parse()
                    .map_err(|_| StockRedisError::Internal(format!("bad epoch {epoch:?}")))?;
                let mut items = Vec::new();
                for pair in out[2..].chunks(2) {
                    let [res, q] = pair else {
                        return Err(StockRedisError::Internal("odd item list".to_owned()));
                    };
                    let q: i64 = q
                        .parse()
                        .map_err(|_| StockRedisError::Internal(format!("bad quantity {q:?}")))?;
                    items.push((res.clone(), q));
                }
                if self.make_durable(key, epoch, &items).await? {
                    Ok(BranchAnswer::Confirmed)
                } else {
                    // The epoch changed: Redis lost this confirm; the rebuild did not count it.
                    let _: i64 = DEMOTE
                        .key(&rec)
                        .arg(epoch)
                        .invoke_async(&mut self.conn())
                        .await?;
                    tracing::warn!(
                        reservation_id = %key.reservation_id,
                        branch_id = %key.branch_id,
                        "confirm lost with the Redis data set; answering HOLD_LOST"
                    );
                    Ok(BranchAnswer::HoldLost)
                }
            }
            other => Err(StockRedisError::Internal(format!(
                "confirm answered {other:?}"
            ))),
        }
    }

    /// Writes the durable rows of a confirmed branch if `epoch` is still current; answers
    /// whether the branch is durably confirmed.
    async fn make_durable(
        &self,
        key: &BranchKey,
        epoch: i64,
        items: &[(String, i64)],
    ) -> Result<bool, StockRedisError> {
        let mut tx = self.inner.pool.begin().await?;
        let current: i64 =
            sqlx::query_scalar("SELECT epoch FROM stock_redis_epoch WHERE id FOR SHARE")
                .fetch_one(&mut *tx)
                .await?;
        if current != epoch {
            let durable = self.is_durable(&mut tx, key).await?;
            tx.commit().await?;
            return Ok(durable);
        }
        let (resources, quantities): (Vec<&str>, Vec<i64>) =
            items.iter().map(|(r, q)| (r.as_str(), *q)).unzip();
        sqlx::query(
            "INSERT INTO stock_redis_confirmed (reservation_id, branch_id, resource, quantity) \
             SELECT $1, $2, r, q FROM unnest($3::text[], $4::bigint[]) AS t(r, q) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .bind(&resources)
        .bind(&quantities)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn is_durable(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &BranchKey,
    ) -> Result<bool, StockRedisError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM stock_redis_confirmed \
             WHERE reservation_id = $1 AND branch_id = $2)",
        )
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_one(conn)
        .await?)
    }

    /// Confirm found no record (it wrote a `hold_lost` tombstone). If the durable record says
    /// confirmed (a record past its retention, or lost without a rebuild), restore it and
    /// answer so.
    async fn confirm_missing(
        &self,
        key: &BranchKey,
        rec: &str,
        epoch: &str,
    ) -> Result<BranchAnswer, StockRedisError> {
        Ok(if self.restore_if_durable(key, rec, epoch).await? {
            BranchAnswer::Confirmed
        } else {
            BranchAnswer::HoldLost
        })
    }

    /// Restores the `confirmed` record of a branch the durable record holds; answers whether
    /// it did.
    async fn restore_if_durable(
        &self,
        key: &BranchKey,
        rec: &str,
        epoch: &str,
    ) -> Result<bool, StockRedisError> {
        let rows = sqlx::query(
            "SELECT resource, quantity FROM stock_redis_confirmed \
             WHERE reservation_id = $1 AND branch_id = $2 ORDER BY resource",
        )
        .bind(&key.reservation_id)
        .bind(&key.branch_id)
        .fetch_all(&self.inner.pool)
        .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        let mut items = Vec::with_capacity(rows.len());
        for row in rows {
            items.push((row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?));
        }
        self.restore(rec, epoch, &items).await?;
        Ok(true)
    }

    async fn restore(
        &self,
        rec: &str,
        epoch: &str,
        items: &[(String, i64)],
    ) -> Result<(), StockRedisError> {
        let mut inv = RESTORE.prepare_invoke();
        inv.key(rec)
            .key(self.key("expiry"))
            .arg(epoch)
            .arg(items.len());
        for (res, q) in items {
            inv.arg(res).arg(*q);
        }
        inv.arg(self.inner.retention_ms);
        let _: i64 = inv.invoke_async(&mut self.conn()).await?;
        Ok(())
    }

    /// Cancel: releases the hold through its state transition; a tombstone before its Try.
    /// A branch without a record (its record expired after the retention) that the durable
    /// record holds as confirmed answers CONFIRMED, as a Cancel after Confirm always does.
    async fn cancel_branch(&self, key: &BranchKey) -> Result<BranchAnswer, StockRedisError> {
        let rec = self.record_key(key);
        let out: Vec<String> = CANCEL
            .key(&rec)
            .key(self.key("ready"))
            .key(self.key("expiry"))
            .arg(&self.inner.prefix)
            .arg(self.inner.retention_ms)
            .arg(self.inner.tombstone_ms)
            .invoke_async(&mut self.conn())
            .await?;
        let [outcome, epoch] = out.as_slice() else {
            return Err(StockRedisError::Internal(format!(
                "cancel answered {out:?}"
            )));
        };
        match outcome.as_str() {
            "cancelled" => Ok(BranchAnswer::Cancelled),
            "confirmed" => Ok(BranchAnswer::Confirmed),
            "tombstone" => Ok(if self.restore_if_durable(key, &rec, epoch).await? {
                BranchAnswer::Confirmed
            } else {
                BranchAnswer::Cancelled
            }),
            "rebuilding" => {
                self.inner.wake.notify_one();
                Err(StockRedisError::Rebuilding)
            }
            other => Err(StockRedisError::Internal(format!(
                "cancel answered {other:?}"
            ))),
        }
    }

    /// One reconciler pass: rebuilds the Redis data set if it is missing, returns the units
    /// of holds past `expires_at + orphan_grace` (each exactly once, however many passes run
    /// concurrently), and reports drift between Redis and the durable record.
    pub async fn reconcile(&self) -> Result<ReconcileReport, StockRedisError> {
        let mut report = ReconcileReport::default();
        let ready: Option<String> = redis::cmd("GET")
            .arg(self.key("ready"))
            .query_async(&mut self.conn())
            .await?;
        if ready.is_none() {
            report.rebuilt = self.rebuild().await?;
        }
        loop {
            let n: usize = RECLAIM
                .key(self.key("expiry"))
                .arg(&self.inner.prefix)
                .arg(RECLAIM_BATCH)
                .arg(self.inner.retention_ms)
                .invoke_async(&mut self.conn())
                .await?;
            report.reclaimed += n;
            if n < RECLAIM_BATCH {
                break;
            }
        }
        if report.reclaimed > 0 {
            tracing::warn!(
                participant = NAME,
                reclaimed = report.reclaimed,
                "reclaimed orphaned holds past expires_at + orphan_grace"
            );
        }
        if !report.rebuilt {
            report.drift = self.drift().await?;
            for d in &report.drift {
                tracing::warn!(participant = NAME, "drift: {d}");
            }
        }
        Ok(report)
    }

    /// Compares Redis capacity and confirmed counters with the durable record. A Confirm in
    /// flight (script done, row not yet written) shows briefly as confirmed drift.
    async fn drift(&self) -> Result<Vec<String>, StockRedisError> {
        let rows = sqlx::query(
            "SELECT i.resource, i.capacity, \
                    COALESCE((SELECT sum(quantity) FROM stock_redis_confirmed c \
                              WHERE c.resource = i.resource), 0)::bigint AS confirmed \
             FROM stock_redis_item i ORDER BY i.resource",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        let mut drift = Vec::new();
        for row in rows {
            let resource: String = row.try_get(0)?;
            let capacity: i64 = row.try_get(1)?;
            let confirmed: i64 = row.try_get(2)?;
            let (cap, conf): (Option<i64>, Option<i64>) = redis::cmd("MGET")
                .arg(self.key(&format!("cap:{resource}")))
                .arg(self.key(&format!("c:{resource}")))
                .query_async(&mut self.conn())
                .await?;
            if cap != Some(capacity) {
                drift.push(format!(
                    "{resource}: capacity {capacity} durable, {cap:?} in Redis"
                ));
            }
            if conf != Some(confirmed) {
                drift.push(format!(
                    "{resource}: confirmed {confirmed} durable, {conf:?} in Redis"
                ));
            }
        }
        Ok(drift)
    }

    /// Rebuilds the Redis data set from the durable record (see the module doc). Returns
    /// false when another rebuild finished first.
    async fn rebuild(&self) -> Result<bool, StockRedisError> {
        // Transaction-scoped, so a cancelled or failed rebuild releases it.
        let mut lock = self.inner.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(REBUILD_LOCK)
            .execute(&mut *lock)
            .await?;
        let ready: Option<String> = redis::cmd("GET")
            .arg(self.key("ready"))
            .query_async(&mut self.conn())
            .await?;
        if ready.is_some() {
            lock.commit().await?;
            return Ok(false);
        }
        tracing::warn!(
            participant = NAME,
            "Redis data set missing; rebuilding from the durable record"
        );
        // Bumping the epoch waits for Confirms writing under the old one; later ones refuse.
        let mut tx = self.inner.pool.begin().await?;
        let epoch: i64 = sqlx::query_scalar(
            "UPDATE stock_redis_epoch SET epoch = epoch + 1 WHERE id RETURNING epoch",
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let items = sqlx::query(
            "SELECT i.resource, i.capacity, \
                    COALESCE((SELECT sum(quantity) FROM stock_redis_confirmed c \
                              WHERE c.resource = i.resource), 0)::bigint AS confirmed \
             FROM stock_redis_item i ORDER BY i.resource",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        let rows = sqlx::query(
            "SELECT reservation_id, branch_id, resource, quantity FROM stock_redis_confirmed \
             ORDER BY reservation_id, branch_id, resource",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        let mut branches: BTreeMap<(String, String), Vec<(String, i64)>> = BTreeMap::new();
        for row in rows {
            branches
                .entry((row.try_get(0)?, row.try_get(1)?))
                .or_default()
                .push((row.try_get(2)?, row.try_get(3)?));
        }
        let epoch_s = epoch.to_string();
        let branches: Vec<_> = branches.into_iter().collect();
        for chunk in branches.chunks(RESTORE_CONCURRENCY) {
            let restores = chunk.iter().map(|((reservation_id, branch_id), items)| {
                let rec = self.record_key(&BranchKey {
                    reservation_id: reservation_id.clone(),
                    branch_id: branch_id.clone(),
                });
                let epoch_s = &epoch_s;
                async move { self.restore(&rec, epoch_s, items).await }
            });
            futures_util::future::try_join_all(restores).await?;
        }
        let mut inv = FINISH.prepare_invoke();
        inv.key(self.key("ready"))
            .key(self.key("expiry"))
            .arg(epoch)
            .arg(&self.inner.prefix)
            .arg(items.len());
        for row in &items {
            inv.arg(row.try_get::<String, _>(0)?)
                .arg(row.try_get::<i64, _>(1)?)
                .arg(row.try_get::<i64, _>(2)?);
        }
        let finished: i64 = inv.invoke_async(&mut self.conn()).await?;
        lock.commit().await?;
        tracing::warn!(
            participant = NAME,
            epoch,
            items = finished,
            confirmed_branches = branches.len(),
            "Redis data set rebuilt"
        );
        Ok(finished >= 0)
    }

    /// Spawns the background reconciler: a pass every `every`, and at once when a request
    /// met a missing data set. Failures are logged and retried.
    pub fn spawn_reconciler(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = this.inner.wake.notified() => {}
                }
                if let Err(err) = this.reconcile().await {
                    tracing::warn!(participant = NAME, error = %err, "reconcile failed");
                }
            }
        })
    }

    /// Counts of one resource, read atomically from Redis.
    pub async fn counts(&self, resource: &str) -> Result<ResourceCounts, StockRedisError> {
        let (ready, cap, a, h, c): CountsReply = redis::cmd("MGET")
            .arg(self.key("ready"))
            .arg(self.key(&format!("cap:{resource}")))
            .arg(self.key(&format!("a:{resource}")))
            .arg(self.key(&format!("h:{resource}")))
            .arg(self.key(&format!("c:{resource}")))
            .query_async(&mut self.conn())
            .await?;
        if ready.is_none() {
            self.inner.wake.notify_one();
            return Err(StockRedisError::Rebuilding);
        }
        match (cap, a, h, c) {
            (Some(capacity), Some(available), Some(held), Some(confirmed)) => Ok(ResourceCounts {
                resource: resource.to_owned(),
                capacity,
                available,
                held,
                confirmed,
            }),
            _ => Err(StockRedisError::NotFound(format!(
                "resource {resource:?} does not exist"
            ))),
        }
    }

    /// Creates or resizes resources: durably in Postgres (row locks held) and in Redis (one
    /// all-or-nothing script), then commits.
    pub async fn put_resources(
        &self,
        specs: Vec<(String, i64)>,
    ) -> Result<Vec<ResourceCounts>, StockRedisError> {
        if specs.is_empty() {
            return Err(StockRedisError::invalid("resources", "must not be empty"));
        }
        let mut sorted = Vec::with_capacity(specs.len());
        for (i, (resource, capacity)) in specs.into_iter().enumerate() {
            check_id(&format!("resources[{i}].resource"), &resource)?;
            if capacity < 0 {
                return Err(StockRedisError::invalid(
                    format!("resources[{i}].capacity"),
                    "must be >= 0",
                ));
            }
            sorted.push((resource, capacity, i));
        }
        sorted.sort();
        if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(StockRedisError::invalid(
                format!("resources[{}].resource", w[1].2),
                format!("duplicates resources[{}]", w[0].2),
            ));
        }
        let mut tx = self.inner.pool.begin().await?;
        for (resource, capacity, _) in &sorted {
            sqlx::query(
                "INSERT INTO stock_redis_item (resource, capacity) VALUES ($1, $2) \
                 ON CONFLICT (resource) DO UPDATE SET capacity = EXCLUDED.capacity",
            )
            .bind(resource)
            .bind(capacity)
            .execute(&mut *tx)
            .await?;
        }
        let mut inv = PUT.prepare_invoke();
        inv.key(self.key("ready"))
            .arg(&self.inner.prefix)
            .arg(sorted.len());
        for (resource, capacity, _) in &sorted {
            inv.arg(resource).arg(*capacity);
        }
        let out: Vec<String> = inv.invoke_async(&mut self.conn()).await?;
        match out.as_slice() {
            [ok] if ok == "ok" => {}
            [r] if r == "rebuilding" => {
                self.inner.wake.notify_one();
                return Err(StockRedisError::Rebuilding);
            }
            [refused, res, held, confirmed] if refused == "refused" => {
                let capacity = sorted.iter().find(|s| &s.0 == res).map_or(0, |s| s.1);
                return Err(StockRedisError::FailedPrecondition(format!(
                    "cannot resize {res} to {capacity}: {held} held and {confirmed} confirmed"
                )));
            }
            other => {
                return Err(StockRedisError::Internal(format!("put answered {other:?}")));
            }
        }
        // If this commit fails Redis is ahead; the reconciler reports the capacity drift.
        tx.commit().await?;
        let mut out = Vec::with_capacity(sorted.len());
        for (resource, _, _) in &sorted {
            out.push(self.counts(resource).await?);
        }
        Ok(out)
    }

    /// Applies the schema, builds the data set if needed, runs the reconciler, and serves
    /// `tcc.v1.Participant` + `tcc.v1.ResourceAdmin` on `listener` until `shutdown`.
    pub async fn run(
        self,
        reconcile_every: Duration,
        listener: impl Into<crate::server::Listener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ParticipantError> {
        self.reconcile().await?;
        let reconciler = self.spawn_reconciler(reconcile_every);
        let routes = Routes::new(ParticipantServer::new(self.clone()))
            .add_service(ResourceAdminServer::new(self));
        tracing::info!(participant = NAME, "participant serving");
        let result = crate::server::serve(
            listener,
            routes,
            &["tcc.v1.Participant", "tcc.v1.ResourceAdmin"],
            shutdown,
        )
        .await;
        reconciler.abort();
        Ok(result?)
    }
}

/// Connects with `settings` and serves until `shutdown` (what `holdfast participant
/// stock-redis` runs).
pub async fn serve(
    settings: StockRedisSettings,
    pool: PgPool,
    listener: impl Into<crate::server::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ParticipantError> {
    let participant = StockRedis::connect(&settings, pool).await?;
    participant
        .run(settings.reconcile_every, listener, shutdown)
        .await
}

fn check_id(field: &str, value: &str) -> Result<(), StockRedisError> {
    if value.is_empty() {
        return Err(StockRedisError::invalid(field, "is required"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(StockRedisError::invalid(
            field,
            format!("must be at most {MAX_ID_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn branch_key(reservation_id: String, branch_id: String) -> Result<BranchKey, StockRedisError> {
    check_id("reservation_id", &reservation_id)?;
    check_id("branch_id", &branch_id)?;
    Ok(BranchKey {
        reservation_id,
        branch_id,
    })
}

impl StockRedis {
    /// Validates a wire Try: ids, items (1..=64, named, quantity >= 1, no slot, no
    /// duplicates), expires_at; sorts items by resource.
    fn try_args(&self, req: TryRequest) -> Result<TryArgs, StockRedisError> {
        let key = branch_key(req.reservation_id, req.branch_id)?;
        check_id("holder", &req.holder)?;
        let ts = req
            .expires_at
            .ok_or_else(|| StockRedisError::invalid("expires_at", "is required"))?;
        let invalid = || StockRedisError::invalid("expires_at", "is not a valid timestamp");
        if !(0..1_000_000_000).contains(&ts.nanos) {
            return Err(invalid());
        }
        let hold_until_ms = ts
            .seconds
            .checked_mul(1000)
            .and_then(|ms| ms.checked_add(i64::from(ts.nanos / 1_000_000)))
            .and_then(|ms| ms.checked_add(self.inner.grace_ms))
            .ok_or_else(invalid)?;
        if req.items.is_empty() {
            return Err(StockRedisError::invalid("items", "must not be empty"));
        }
        if req.items.len() > MAX_ITEMS {
            return Err(StockRedisError::invalid(
                "items",
                format!("must hold at most {MAX_ITEMS} items"),
            ));
        }
        let mut items = Vec::with_capacity(req.items.len());
        for (i, hold) in req.items.into_iter().enumerate() {
            check_id(&format!("items[{i}].resource"), &hold.resource)?;
            if hold.quantity < 1 {
                return Err(StockRedisError::invalid(
                    format!("items[{i}].quantity"),
                    "must be >= 1",
                ));
            }
            if hold.during.is_some() {
                return Err(StockRedisError::invalid(
                    format!("items[{i}].during"),
                    "must be empty for stock",
                ));
            }
            items.push((hold.resource, hold.quantity, i));
        }
        items.sort();
        if let Some(w) = items.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(StockRedisError::invalid(
                format!("items[{}]", w[1].2),
                format!("duplicates items[{}]", w[0].2),
            ));
        }
        Ok(TryArgs {
            key,
            hold_until_ms,
            items: items.into_iter().map(|(r, q, _)| (r, q)).collect(),
        })
    }
}

fn branch_response(answer: BranchAnswer) -> Response<BranchResponse> {
    let state = match answer {
        BranchAnswer::Confirmed => branch::State::Confirmed,
        BranchAnswer::Cancelled => branch::State::Cancelled,
        BranchAnswer::HoldLost => branch::State::HoldLost,
    };
    Response::new(BranchResponse {
        state: state as i32,
    })
}

#[tonic::async_trait]
impl Participant for StockRedis {
    async fn r#try(&self, request: Request<TryRequest>) -> Result<Response<TryResponse>, Status> {
        let args = self.try_args(request.into_inner())?;
        let (outcome, reason) = match self.try_branch(args).await? {
            TryOutcome::Held => (try_response::Outcome::Held, String::new()),
            TryOutcome::Rejected(reason) => (try_response::Outcome::Rejected, reason),
        };
        Ok(Response::new(TryResponse {
            outcome: outcome as i32,
            reason,
        }))
    }

    async fn confirm(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let req = request.into_inner();
        let key = branch_key(req.reservation_id, req.branch_id)?;
        Ok(branch_response(self.confirm_branch(&key).await?))
    }

    async fn cancel(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let req = request.into_inner();
        let key = branch_key(req.reservation_id, req.branch_id)?;
        Ok(branch_response(self.cancel_branch(&key).await?))
    }
}

#[tonic::async_trait]
impl ResourceAdmin for StockRedis {
    async fn put_resources(
        &self,
        request: Request<PutResourcesRequest>,
    ) -> Result<Response<PutResourcesResponse>, Status> {
        let specs = request
            .into_inner()
            .resources
            .into_iter()
            .map(|s| (s.resource, s.capacity))
            .collect();
        let counts = StockRedis::put_resources(self, specs).await?;
        Ok(Response::new(PutResourcesResponse {
            resources: counts.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_resource(
        &self,
        request: Request<GetResourceRequest>,
    ) -> Result<Response<ResourceStatus>, Status> {
        let resource = request.into_inner().resource;
        check_id("resource", &resource)?;
        Ok(Response::new(self.counts(&resource).await?.into()))
    }
}
