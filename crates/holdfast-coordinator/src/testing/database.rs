//! The movable clock inside each database: PostgreSQL's shadow clock functions (schema
//! [`SCHEMA`], found through the `search_path` a test-mode pool is opened with) and the offset
//! row of both backends, with the only statements that write it.
//!
//! PostgreSQL: `now()`, `clock_timestamp()`, `statement_timestamp()` and
//! `transaction_timestamp()` are shadowed by functions of the same names that add the offset;
//! a pool opened with `search_path = public, holdfast_test_clock, pg_catalog` resolves the
//! unqualified calls of every statement to them. Pools opened without it (every pool outside
//! test mode) never see the schema, so their statements are unchanged. SQLite: every clock
//! read is `db::sqlite_now_us!`, which adds the one offset row (migration `0090`).

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::{ConnectOptions, Connection};

use super::TestingError;
use crate::db;

/// The schema of PostgreSQL's shadow clock.
pub const SCHEMA: &str = "holdfast_test_clock";

/// The `search_path` of a test-mode PostgreSQL pool: the shadow clock after `public` and
/// before `pg_catalog`.
pub const SEARCH_PATH: &str = "public, holdfast_test_clock, pg_catalog";

/// Creates the shadow clock (idempotent; serialised by an advisory lock, so concurrent
/// openers of one database do not race on `CREATE OR REPLACE`).
const INSTALL: &[&str] = &[
    "SELECT pg_advisory_xact_lock(hashtext('holdfast_test_clock'))",
    "CREATE SCHEMA IF NOT EXISTS holdfast_test_clock",
    "CREATE TABLE IF NOT EXISTS holdfast_test_clock.clock_offset ( \
         id boolean PRIMARY KEY DEFAULT true CHECK (id), \
         v interval NOT NULL CHECK (v >= interval '0'))",
    "INSERT INTO holdfast_test_clock.clock_offset (id, v) VALUES (true, interval '0') \
     ON CONFLICT (id) DO NOTHING",
    "CREATE OR REPLACE FUNCTION holdfast_test_clock.clock_timestamp() RETURNS timestamptz \
     LANGUAGE sql VOLATILE AS $$ SELECT pg_catalog.clock_timestamp() \
     + (SELECT v FROM holdfast_test_clock.clock_offset) $$",
    "CREATE OR REPLACE FUNCTION holdfast_test_clock.now() RETURNS timestamptz \
     LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() \
     + (SELECT v FROM holdfast_test_clock.clock_offset) $$",
    "CREATE OR REPLACE FUNCTION holdfast_test_clock.statement_timestamp() RETURNS timestamptz \
     LANGUAGE sql STABLE AS $$ SELECT pg_catalog.statement_timestamp() \
     + (SELECT v FROM holdfast_test_clock.clock_offset) $$",
    "CREATE OR REPLACE FUNCTION holdfast_test_clock.transaction_timestamp() RETURNS timestamptz \
     LANGUAGE sql STABLE AS $$ SELECT pg_catalog.transaction_timestamp() \
     + (SELECT v FROM holdfast_test_clock.clock_offset) $$",
];

/// A database whose clock a [`super::TestClock`] moves: how to reach it for a move.
#[derive(Clone, Debug)]
pub(super) enum ClockDatabase {
    Postgres(PgConnectOptions),
    Sqlite(SqliteConnectOptions),
}

impl ClockDatabase {
    /// What identifies the database (two opens of one database are one registration).
    pub(super) fn key(&self) -> String {
        match self {
            ClockDatabase::Postgres(o) => format!(
                "postgres {}:{}/{}",
                o.get_host(),
                o.get_port(),
                o.get_database().unwrap_or_default()
            ),
            ClockDatabase::Sqlite(o) => format!("sqlite {}", o.get_filename().display()),
        }
    }

    /// The offset the database's clock runs at now, in microseconds.
    pub(super) async fn offset_us(&self) -> Result<i64, TestingError> {
        Ok(match self {
            ClockDatabase::Postgres(o) => {
                let mut conn = o.connect().await?;
                let v: i64 = sqlx::query_scalar(
                    "SELECT (extract(epoch FROM v) * 1000000)::bigint \
                     FROM holdfast_test_clock.clock_offset",
                )
                .fetch_one(&mut conn)
                .await?;
                conn.close().await?;
                v
            }
            ClockDatabase::Sqlite(o) => {
                let mut conn = o.connect().await?;
                let v: i64 =
                    sqlx::query_scalar("SELECT offset_us FROM holdfast_clock_offset WHERE id = 0")
                        .fetch_one(&mut conn)
                        .await?;
                conn.close().await?;
                v
            }
        })
    }

    /// Moves the database's offset to `offset_us` unless it is there or beyond already (the
    /// clock never moves back).
    pub(super) async fn move_to(&self, offset_us: i64) -> Result<(), TestingError> {
        match self {
            ClockDatabase::Postgres(o) => {
                let mut conn = o.connect().await?;
                sqlx::query(
                    "UPDATE holdfast_test_clock.clock_offset \
                     SET v = greatest(v, make_interval(secs => $1::float8 / 1000000))",
                )
                .bind(offset_us)
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
            ClockDatabase::Sqlite(o) => {
                let mut conn = o.connect().await?;
                sqlx::query(
                    "UPDATE holdfast_clock_offset SET offset_us = max(offset_us, ?1) WHERE id = 0",
                )
                .bind(offset_us)
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
        }
        Ok(())
    }

    /// The database's clock now (offset included).
    pub(super) async fn now(&self) -> Result<chrono::DateTime<chrono::Utc>, TestingError> {
        Ok(match self {
            ClockDatabase::Postgres(o) => {
                let mut conn = o.connect().await?;
                let now = sqlx::query_scalar("SELECT holdfast_test_clock.clock_timestamp()")
                    .fetch_one(&mut conn)
                    .await?;
                conn.close().await?;
                now
            }
            ClockDatabase::Sqlite(o) => {
                let mut conn = o.connect().await?;
                let us: i64 = sqlx::query_scalar(concat!("SELECT ", sqlite_now_us!()))
                    .fetch_one(&mut conn)
                    .await?;
                conn.close().await?;
                chrono::DateTime::from_timestamp_micros(us)
                    .ok_or_else(|| TestingError::Clock(format!("{us} µs is no time")))?
            }
        })
    }
}

/// Opens a PostgreSQL pool of `max_connections` on `url` (creating the database if needed)
/// whose statements read the shadow clock; returns it with its registration.
pub(super) async fn open_postgres(
    url: &str,
    max_connections: u32,
) -> Result<(PgPool, ClockDatabase), TestingError> {
    db::ensure_database(url).await?;
    let options = db::postgres_options(url)?;
    let mut conn = options.connect().await?;
    let mut tx = conn.begin().await?;
    for statement in INSTALL {
        sqlx::query(*statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    conn.close().await?;
    let clocked = options.clone().options([("search_path", SEARCH_PATH)]);
    let pool = db::postgres_pool_options(max_connections, db::CHECK_IDLE_AFTER)
        .connect_with(clocked)
        .await?;
    Ok((pool, ClockDatabase::Postgres(options)))
}

/// Opens a SQLite pool on `url` as [`db::open_sqlite`] does; the offset row comes with the
/// migrations the caller runs before registering it.
pub(super) async fn open_sqlite(
    url: &str,
    max_connections: u32,
) -> Result<(SqlitePool, ClockDatabase), TestingError> {
    let pool = db::open_sqlite(url, max_connections).await?;
    let options = SqliteConnectOptions::from_str(url)?.busy_timeout(db::SQLITE_BUSY_TIMEOUT);
    Ok((pool, ClockDatabase::Sqlite(options)))
}
