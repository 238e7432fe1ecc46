//! PostgreSQL pools with holdfast's conventions (feature `postgres`).
//!
//! TLS is what the URL asks for: `sslmode=require|verify-ca|verify-full` and `sslrootcert`
//! (rustls, the process's one provider). A URL that names no `sslmode` (and no `PGSSLMODE`)
//! connects in plaintext, as it always has: sqlx's default `prefer` would encrypt
//! opportunistically without verifying anyone, which protects nothing and would make every
//! default connection pay a handshake.

use std::str::FromStr;

use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgSslMode};

use super::{CHECK_IDLE_AFTER, ensure_database, pool_options};

/// Creates the PostgreSQL database `url` names unless it exists.
///
/// Replicas starting together on a new database all find it missing and all create it: the
/// losers' `CREATE DATABASE` fails because the winner's is there now, which is what they
/// wanted, so that failure is success ([`created_meanwhile`]).
pub(super) async fn create_if_missing(url: &str) -> Result<(), sqlx::Error> {
    if sqlx::Postgres::database_exists(url).await? {
        return Ok(());
    }
    match sqlx::Postgres::create_database(url).await {
        Err(error) if !created_meanwhile(&error) => Err(error),
        _ => Ok(()),
    }
}

/// Whether a `CREATE DATABASE` failed only because another session created the same database
/// first: `duplicate_database` (42P04) once the other committed, or `unique_violation` (23505
/// on `pg_database`'s name index) when both inserted their catalog rows at once.
fn created_meanwhile(error: &sqlx::Error) -> bool {
    const DUPLICATE_DATABASE: &str = "42P04";
    const UNIQUE_VIOLATION: &str = "23505";
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == DUPLICATE_DATABASE || code == UNIQUE_VIOLATION)
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn postgres_sessions_plan_for_memory_unless_the_url_says_otherwise() {
        let base = "postgres://u@127.0.0.1:5432/db";
        let options = |url: &str| {
            postgres_options(url)
                .unwrap()
                .get_options()
                .map(str::to_owned)
        };
        assert_eq!(
            options(base).as_deref(),
            Some("-c random_page_cost=1.1"),
            "holdfast's own planner cost"
        );
        let theirs = format!("{base}?options=-c%20random_page_cost%3D3");
        assert_eq!(options(&theirs).as_deref(), Some("-c random_page_cost=3"));
    }
}
