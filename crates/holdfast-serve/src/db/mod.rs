//! Opening databases: which one a URL names, PostgreSQL and SQLite pools with holdfast's
//! conventions (`postgres.rs`, `sqlite.rs`: each behind the crate feature of that name, both on
//! by default, so a participant on one database builds without the other's driver), and
//! SQLite's clock in SQL. Shared by the coordinator's store, the participants and the
//! benchmark, so none of them reaches into another for it.

use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;

use sqlx::Connection;

/// SQLite's clock now, in integer microseconds since the Unix epoch (millisecond resolution,
/// fixed for one statement step): "now" in every SQLite statement. A macro so statements stay
/// `&'static str` (`concat!`).
///
/// Plus the test clock's offset (table `holdfast_clock_offset`, migration `0090` of both SQLite
/// schemas; zero unless the test clock (the server crate's `testing`) moved it). The whole reading is one uncorrelated
/// scalar subquery on that one-row table, which SQLite evaluates once per statement (`Once`)
/// and keeps: beside a commit's fsync its cost is nothing.
#[macro_export]
macro_rules! sqlite_now_us {
    () => {
        "(SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us \
         FROM holdfast_clock_offset WHERE id = 0)"
    };
}

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
#[cfg(feature = "postgres")]
mod pg_tls;
#[cfg(feature = "postgres")]
mod pg_tunnel;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_write;

#[cfg(feature = "postgres")]
pub use postgres::*;
#[cfg(feature = "sqlite")]
pub use sqlite::*;

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
    match DatabaseKind::of_url(url)? {
        DatabaseKind::Sqlite => Ok(()),
        #[cfg(feature = "postgres")]
        DatabaseKind::Postgres => postgres::create_if_missing(url).await,
        #[cfg(not(feature = "postgres"))]
        DatabaseKind::Postgres => Err(sqlx::Error::Configuration(
            "this build has no PostgreSQL support (feature `postgres`)".into(),
        )),
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod deferred_tests;
#[cfg(all(test, feature = "sqlite"))]
mod tests;
