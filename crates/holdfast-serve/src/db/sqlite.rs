//! SQLite pools with holdfast's conventions (feature `sqlite`): WAL, `synchronous = FULL`,
//! and every write of a pool on its one writer, queued in process and group-committed
//! ([`super::SqliteWrite`], `sqlite_write.rs`).

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use super::sqlite_write;
pub use super::sqlite_write::{FirstQuery, SqliteWrite, SqliteWriteAhead};
use super::{ACQUIRE_TIMEOUT, CHECK_IDLE_AFTER, WriteTransaction, pool_options};

/// How long a SQLite writer waits for the write lock before its statement fails with
/// `SQLITE_BUSY` (then the caller treats it as any storage failure: outcome unknown, retry).
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How every SQLite write transaction begins: the database write lock is taken at once and
/// held until commit, so no other writer runs between a read and its conditional UPDATE.
pub(crate) const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// The SQLite pools' writers ([`sqlite_write`]), one per pool opened. The key is the pool's
/// connect options (the same `Arc` for the pool's whole life); a `Weak` so a dropped pool's
/// writer (and its connection) goes at the next lookup.
static SQLITE_WRITERS: Mutex<Vec<(Weak<SqliteConnectOptions>, Arc<sqlite_write::Writer>)>> =
    Mutex::new(Vec::new());

/// The writer `pool`'s writes run on: one connection, one write at a time in arrival order,
/// queued writes committed together (see [`SqliteWrite`]); refused once `pool` is closed.
pub(super) fn sqlite_writer(pool: &SqlitePool) -> Result<Arc<sqlite_write::Writer>, sqlx::Error> {
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
    sqlite_writer(pool)?.begin(ACQUIRE_TIMEOUT, false).await
}

/// Begins a write transaction of `pool` on its writer, as [`begin_sqlite_write`] but sending
/// nothing yet: its `BEGIN IMMEDIATE` or savepoint goes ahead of its first query
/// ([`SqliteWriteAhead::first`]), one hand-off to the writer's thread instead of two.
pub async fn begin_sqlite_write_deferred(
    pool: &SqlitePool,
) -> Result<SqliteWriteAhead, sqlx::Error> {
    let write = sqlite_writer(pool)?.begin(ACQUIRE_TIMEOUT, true).await?;
    Ok(SqliteWriteAhead(write))
}

impl WriteTransaction for SqliteWrite {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        SqliteWrite::commit(self)
    }

    fn rollback(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        SqliteWrite::rollback(self)
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
/// (`journal_size_limit`). Without it the file stays at its high-water mark after a burst of
/// writes, for good.
pub(crate) const SQLITE_WAL_KEEP_BYTES: i64 = 64 * 1024 * 1024;

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
