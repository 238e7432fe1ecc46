//! Opening databases: which one a URL names, PostgreSQL and SQLite pools with holdfast's
//! conventions, and SQLite's clock in SQL. Shared by the coordinator's store, the participants
//! and the benchmark, so none of them reaches into another for it.
//!
//! PostgreSQL TLS is what the URL asks for: `sslmode=require|verify-ca|verify-full` and
//! `sslrootcert` (rustls, the process's one provider). A URL that names no `sslmode` (and no
//! `PGSSLMODE`) connects in plaintext, as it always has: sqlx's default `prefer` would
//! encrypt opportunistically without verifying anyone, which protects nothing and would make
//! every default connection pay a handshake.

use std::future::Future;
use std::ops::DerefMut;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

/// SQLite's clock now, in integer microseconds since the Unix epoch (millisecond resolution,
/// fixed for one statement step): "now" in every SQLite statement. A macro so statements stay
/// `&'static str` (`concat!`).
///
/// Plus the test clock's offset (table `holdfast_clock_offset`, migration `0090` of both SQLite
/// schemas; zero unless the test clock (the server crate's `testing`) moved it). The whole reading is one uncorrelated
/// scalar subquery on that one-row table, which SQLite evaluates once per statement (`Once`)
/// and keeps: measured against the bare expression, a one-row UPDATE or INSERT costs the same
/// (within 0.5 us), a statement that only reads the clock ~4 us more, a comparison per row
/// over 10k rows ~15% more - next to a commit's fsync, nothing.
#[macro_export]
macro_rules! sqlite_now_us {
    () => {
        "(SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us \
         FROM holdfast_clock_offset WHERE id = 0)"
    };
}

/// How long a SQLite writer waits for the write lock before its statement fails with
/// `SQLITE_BUSY` (then the caller treats it as any storage failure: outcome unknown, retry).
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How every SQLite write transaction begins: the database write lock is taken at once and
/// held until commit, so no other writer runs between a read and its conditional UPDATE.
pub const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// How long a caller waits for a pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A pooled connection idle at least this long is checked (one round trip) before it is
/// handed out; one used more recently is handed out as it is.
///
/// sqlx's default checks every connection on every acquire: a round trip to the database (on
/// SQLite, to the connection's thread) before each statement or transaction, on top of the
/// one its release already costs. Under load a connection comes back within milliseconds, so
/// that check almost never finds anything. A connection broken since its last use (database
/// restarted, network cut) then fails its next statement, as it would have failed one in
/// flight; sqlx's release check closes it, so it fails once. HikariCP bypasses its
/// alive-check on the same grounds (500 ms).
pub const CHECK_IDLE_AFTER: Duration = Duration::from_millis(500);

/// A pool's options as holdfast opens them: `max_connections`, [`ACQUIRE_TIMEOUT`], and a
/// connection checked before it is handed out only when idle for `check_idle_after` or more
/// ([`CHECK_IDLE_AFTER`] in every pool holdfast opens).
pub fn pool_options<DB: sqlx::Database>(
    max_connections: u32,
    check_idle_after: Duration,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(move |conn: &mut DB::Connection, meta| {
            Box::pin(async move {
                if meta.idle_for >= check_idle_after {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

pub mod batch;
mod sqlite_write;

pub use sqlite_write::SqliteWrite;

/// The SQLite pools' writers ([`sqlite_write`]), one per pool opened. The key is the pool's
/// connect options (the same `Arc` for the pool's whole life); a `Weak` so a dropped pool's
/// writer (and its connection) goes at the next lookup.
static SQLITE_WRITERS: Mutex<Vec<(Weak<SqliteConnectOptions>, Arc<sqlite_write::Writer>)>> =
    Mutex::new(Vec::new());

/// The writer `pool`'s writes run on: one connection, one write at a time in arrival order,
/// queued writes committed together (see [`SqliteWrite`]); refused once `pool` is closed.
fn sqlite_writer(pool: &SqlitePool) -> Result<Arc<sqlite_write::Writer>, sqlx::Error> {
    if pool.is_closed() {
        return Err(sqlx::Error::PoolClosed);
    }
    let options = pool.connect_options();
    let mut writers = SQLITE_WRITERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, writer)) = writers
        .iter()
        .find(|(owner, _)| std::ptr::eq(owner.as_ptr(), Arc::as_ptr(&options)))
    {
        return Ok(writer.clone());
    }
    // A new pool: the writers of pools dropped since go now (not on every lookup).
    writers.retain(|(owner, _)| owner.strong_count() > 0);
    let writer = Arc::new(sqlite_write::Writer::new((*options).clone()));
    writers.push((Arc::downgrade(&options), writer.clone()));
    Ok(writer)
}

/// Begins a write transaction of `pool` on its writer: `BEGIN IMMEDIATE`, or a savepoint in
/// the group transaction open there ([`SqliteWrite`]); refused once `pool` is closed.
pub async fn begin_sqlite_write(pool: &SqlitePool) -> Result<SqliteWrite, sqlx::Error> {
    sqlite_writer(pool)?.begin(true, ACQUIRE_TIMEOUT).await
}

/// `pool`'s writer for one write statement outside a transaction (autocommit: durable when it
/// returns; an open group is committed first); refused once `pool` is closed.
pub async fn acquire_sqlite_write(pool: &SqlitePool) -> Result<SqliteWrite, sqlx::Error> {
    sqlite_writer(pool)?.begin(false, ACQUIRE_TIMEOUT).await
}

/// A write transaction of either database, as the store and the participant SDK open them:
/// statements run on `&mut *tx`; it ends with [`WriteTransaction::commit`] or
/// [`WriteTransaction::rollback`], and is rolled back when dropped unfinished. PostgreSQL's is
/// sqlx's [`sqlx::Transaction`]; SQLite's a [`SqliteWrite`] (group commit).
pub trait WriteTransaction: DerefMut + Send {
    /// Commits: durable when it returns `Ok`.
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Rolls back.
    fn rollback(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

impl<DB: sqlx::Database> WriteTransaction for sqlx::Transaction<'static, DB> {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        sqlx::Transaction::commit(self)
    }

    fn rollback(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        sqlx::Transaction::rollback(self)
    }
}

impl WriteTransaction for SqliteWrite {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        SqliteWrite::commit(self)
    }

    fn rollback(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        SqliteWrite::rollback(self)
    }
}

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseKind {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `sqlite:` (a file, e.g. `sqlite://./data/holdfast.db`).
    Sqlite,
}

impl DatabaseKind {
    /// The database `url` names, by its scheme; an error names what is supported.
    pub fn of_url(url: &str) -> Result<DatabaseKind, sqlx::Error> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(DatabaseKind::Postgres),
            "sqlite" => Ok(DatabaseKind::Sqlite),
            _ => Err(sqlx::Error::Configuration(
                format!(
                    "unsupported database URL scheme {scheme:?}: use postgres://... or sqlite://..."
                )
                .into(),
            )),
        }
    }
}

/// Creates the database named by `url` if it does not exist yet. (A SQLite file is created
/// when it is opened.)
pub async fn ensure_database(url: &str) -> Result<(), sqlx::Error> {
    if DatabaseKind::of_url(url)? == DatabaseKind::Sqlite {
        return Ok(());
    }
    if !sqlx::Postgres::database_exists(url).await? {
        sqlx::Postgres::create_database(url).await?;
    }
    Ok(())
}

/// A PostgreSQL pool of `max_connections` on `url`, creating the database first if needed.
pub async fn connect_postgres(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    ensure_database(url).await?;
    open_postgres(url, max_connections).await
}

/// A PostgreSQL pool of `max_connections` on `url` (the database must exist; see
/// [`ensure_database`]).
pub async fn open_postgres(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    pool_options(max_connections, CHECK_IDLE_AFTER)
        .connect_with(postgres_options(url)?)
        .await
}

/// What holdfast's sessions tell PostgreSQL's planner a random page read costs, against 1.0
/// for a sequential one (PostgreSQL's default is 4, modelled on spinning disks). Every
/// statement holdfast runs finds a few rows by key, and its working set is in memory, where a
/// random read costs about what a sequential one does: PostgreSQL's documentation suggests
/// 1.1 for such storage. With the default, a statement that looks up rows by a parameter
/// array (the group-committed writes) got a generic plan scanning the whole table while the
/// table was small, kept on that connection however large the table grew, until autovacuum's
/// next ANALYZE (with 1.1 the index wins from a few pages on; a plan made on a one-page table
/// still scans it); and `create`'s batch was planned afresh on almost every call. Set per
/// session (other clients of the server keep its setting), unless the URL's `options` names it.
pub const RANDOM_PAGE_COST: &str = "1.1";

/// `options` with holdfast's planner costs ([`RANDOM_PAGE_COST`]) for each session.
pub fn with_planner_costs(options: PgConnectOptions) -> PgConnectOptions {
    options.options([("random_page_cost", RANDOM_PAGE_COST)])
}

/// The connection options `url` names, TLS included; plaintext unless it (or `PGSSLMODE`)
/// names an `sslmode`; the planner's [`RANDOM_PAGE_COST`] unless it names its own.
pub fn postgres_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let mut options = PgConnectOptions::from_str(url)?;
    let query = url.split_once('?').map_or("", |(_, q)| q);
    if !query.to_ascii_lowercase().contains("random_page_cost") {
        options = with_planner_costs(options);
    }
    let names_mode = query
        .split('&')
        .filter_map(|pair| pair.split('=').next())
        .any(|key| key.eq_ignore_ascii_case("sslmode") || key.eq_ignore_ascii_case("ssl-mode"));
    if names_mode || std::env::var_os("PGSSLMODE").is_some() {
        Ok(options)
    } else {
        Ok(options.ssl_mode(PgSslMode::Disable))
    }
}

/// Opens (creating it and its directory if needed) the SQLite file named by `url`
/// (`sqlite://path/to/file.db`, `sqlite:file.db`) with a pool of `max_connections`: WAL
/// journal, `synchronous = FULL` (a committed decision survives power loss, as in PostgreSQL),
/// foreign keys on, busy timeout [`SQLITE_BUSY_TIMEOUT`], and the WAL file cut back to
/// [`SQLITE_WAL_KEEP_BYTES`] whenever a checkpoint lets it start over.
pub async fn open_sqlite(url: &str, max_connections: u32) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .pragma("journal_size_limit", SQLITE_WAL_KEEP_BYTES.to_string());
    create_parent_dir(options.get_filename())?;
    // Switch the file to WAL on one connection first: changing the journal mode needs an
    // exclusive lock that the busy timeout does not wait for, so a pool opening several
    // connections at once on a new file could fail.
    options.connect().await?.close().await?;
    pool_options(max_connections, CHECK_IDLE_AFTER)
        .connect_with(options)
        .await
}

/// How much of a SQLite WAL file is kept once a checkpoint lets the log start over
/// (`journal_size_limit`). Without it the file stays at its high-water mark: a burst of writes
/// left the all-in-one's `participants.db-wal` at 360 MB for good (BENCHMARKS.md).
pub const SQLITE_WAL_KEEP_BYTES: i64 = 64 * 1024 * 1024;

/// The folder a SQLite database file lives in (`./data` for `sqlite://./data/holdfast.db`).
pub fn sqlite_dir(url: &str) -> Result<std::path::PathBuf, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?;
    Ok(match options.get_filename().parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    })
}

/// Creates the directory a database file lives in.
fn create_parent_dir(file: &Path) -> Result<(), sqlx::Error> {
    // sqlx names in-memory databases `file:...`; they have no directory.
    if file.to_string_lossy().starts_with("file:") {
        return Ok(());
    }
    if let Some(dir) = file.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
