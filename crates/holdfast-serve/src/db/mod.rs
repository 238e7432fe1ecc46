//! Opening databases: which one a URL names, PostgreSQL and SQLite pools with holdfast's
//! conventions, and SQLite's clock in SQL. Shared by the coordinator's store, the participants
//! and the benchmark, so none of them reaches into another for it.
//!
//! PostgreSQL TLS is what the URL asks for: `sslmode=require|verify-ca|verify-full` and
//! `sslrootcert` (rustls, the process's one provider). A URL that names no `sslmode` (and no
//! `PGSSLMODE`) connects in plaintext, as it always has: sqlx's default `prefer` would
//! encrypt opportunistically without verifying anyone, which protects nothing and would make
//! every default connection pay a handshake.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
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

/// The SQLite pools' writers: one single-connection pool per pool opened, that every write of
/// it runs on ([`sqlite_writer`]). The key is the pool's connect options (the same `Arc` for the
/// pool's whole life); a `Weak` so a dropped pool's writer goes at the next lookup.
static SQLITE_WRITERS: Mutex<Vec<(Weak<SqliteConnectOptions>, SqlitePool)>> =
    Mutex::new(Vec::new());

/// The connection `pool`'s writes run on, one at a time, in arrival order.
///
/// SQLite has one writer per file. Left to SQLite, concurrent `BEGIN IMMEDIATE`s wait in its
/// busy handler, which polls by sleeping 1, 2, 5, ... 100 ms: under load the lock is often
/// free while every waiter sleeps, and an unlucky waiter sleeps again and again (measured on
/// the all-in-one at 32 clients: p99 760 ms, max 2.2 s). Queued here instead - a pool of one
/// connection, whose acquire is fair - each write starts the moment the previous one
/// commits, in order, and waits at most [`ACQUIRE_TIMEOUT`] like any pooled connection. Reads
/// stay on `pool` (WAL: they never wait for the writer). Another process writing the same
/// file is still waited for by the busy handler.
pub fn sqlite_writer(pool: &SqlitePool) -> SqlitePool {
    let options = pool.connect_options();
    let mut writers = SQLITE_WRITERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    writers.retain(|(owner, _)| owner.strong_count() > 0);
    if let Some((_, writer)) = writers
        .iter()
        .find(|(owner, _)| std::ptr::eq(owner.as_ptr(), Arc::as_ptr(&options)))
    {
        return writer.clone();
    }
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        // The connection is in-process: nothing to probe before handing it out again.
        .test_before_acquire(false)
        .connect_lazy_with((*options).clone());
    writers.push((Arc::downgrade(&options), writer.clone()));
    writer
}

/// Begins a write transaction of `pool` ([`SQLITE_BEGIN_WRITE`]) on its writer
/// ([`sqlite_writer`]); refused once `pool` is closed.
pub async fn begin_sqlite_write(
    pool: &SqlitePool,
) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
    if pool.is_closed() {
        return Err(sqlx::Error::PoolClosed);
    }
    sqlite_writer(pool).begin_with(SQLITE_BEGIN_WRITE).await
}

/// A connection of `pool`'s writer ([`sqlite_writer`]) for a write statement outside a
/// transaction; refused once `pool` is closed.
pub async fn acquire_sqlite_write(
    pool: &SqlitePool,
) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>, sqlx::Error> {
    if pool.is_closed() {
        return Err(sqlx::Error::PoolClosed);
    }
    sqlite_writer(pool).acquire().await
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
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(postgres_options(url)?)
        .await
}

/// The connection options `url` names, TLS included; plaintext unless it (or `PGSSLMODE`)
/// names an `sslmode`.
pub fn postgres_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?;
    let query = url.split_once('?').map_or("", |(_, q)| q);
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
/// foreign keys on, busy timeout [`SQLITE_BUSY_TIMEOUT`].
pub async fn open_sqlite(url: &str, max_connections: u32) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(SQLITE_BUSY_TIMEOUT);
    create_parent_dir(options.get_filename())?;
    // Switch the file to WAL on one connection first: changing the journal mode needs an
    // exclusive lock that the busy timeout does not wait for, so a pool opening several
    // connections at once on a new file could fail.
    options.connect().await?.close().await?;
    SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
}

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
mod tests {
    use super::*;

    /// A SQLite file of its own under the temp dir, with a busy timeout of zero: any write that
    /// has to wait for SQLite's lock fails at once with "database is locked".
    async fn impatient_pool(name: &str) -> (SqlitePool, std::path::PathBuf) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("holdfast-db-{name}-{}-{nanos}", std::process::id()));
        let url = format!("sqlite://{}", dir.join("t.db").display());
        open_sqlite(&url, 1).await.unwrap().close().await; // the file, in WAL mode
        let impatient = SqliteConnectOptions::from_str(&url)
            .unwrap()
            .busy_timeout(Duration::ZERO);
        let pool = SqlitePoolOptions::new()
            .max_connections(16)
            .connect_with(impatient)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (seen INTEGER NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        (pool, dir)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_sqlite_writes_queue_in_process_not_in_the_busy_handler() {
        let (pool, dir) = impatient_pool("queue").await;
        // 64 writers at once, each holding the write lock across a read and a yield. Left to
        // SQLite (a pool of 16 connections, no busy timeout) most would fail "database is
        // locked"; queued on the writer, every one commits.
        let writers: Vec<_> = (0..64)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut tx = begin_sqlite_write(&pool).await?;
                    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
                        .fetch_one(&mut *tx)
                        .await?;
                    tokio::task::yield_now().await;
                    // What it saw under the lock: the rows of every writer before it.
                    sqlx::query("INSERT INTO t (seen) VALUES (?1)")
                        .bind(n)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await
                })
            })
            .collect();
        let mut failed = Vec::new();
        for writer in writers {
            if let Err(e) = writer.await.unwrap() {
                failed.push(e.to_string());
            }
        }
        assert!(
            failed.is_empty(),
            "{} writes failed: {:?}",
            failed.len(),
            failed.first()
        );
        let seen: Vec<i64> = sqlx::query_scalar("SELECT seen FROM t ORDER BY seen")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(seen, (0..64).collect::<Vec<i64>>(), "one writer at a time");
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn each_sqlite_pool_has_one_writer_of_its_own_and_a_closed_pool_writes_nothing() {
        let (a, dir_a) = impatient_pool("a").await;
        let (b, dir_b) = impatient_pool("b").await;
        let writer = sqlite_writer(&a);
        assert!(std::ptr::eq(
            Arc::as_ptr(&writer.connect_options()),
            Arc::as_ptr(&sqlite_writer(&a).connect_options())
        ));
        assert_eq!(writer.options().get_max_connections(), 1);
        assert!(!std::ptr::eq(
            Arc::as_ptr(&writer.connect_options()),
            Arc::as_ptr(&sqlite_writer(&b).connect_options())
        ));
        a.close().await;
        assert!(matches!(
            begin_sqlite_write(&a).await,
            Err(sqlx::Error::PoolClosed)
        ));
        b.close().await;
        let _ = (
            std::fs::remove_dir_all(dir_a),
            std::fs::remove_dir_all(dir_b),
        );
    }

    #[test]
    fn postgres_tls_is_what_the_url_asks_for() {
        let base = "postgres://u@127.0.0.1:5432/db";
        let mode = |url: &str| postgres_options(url).unwrap().get_ssl_mode();
        assert!(matches!(
            mode(&format!("{base}?sslmode=verify-full")),
            PgSslMode::VerifyFull
        ));
        assert!(matches!(
            mode(&format!("{base}?application_name=x&sslmode=require")),
            PgSslMode::Require
        ));
        // Naming no mode keeps the plaintext default (unless the environment names one).
        if std::env::var_os("PGSSLMODE").is_none() {
            assert!(matches!(mode(base), PgSslMode::Disable));
        }
    }
}
