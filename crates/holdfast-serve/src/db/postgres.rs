//! PostgreSQL pools with holdfast's conventions (feature `postgres`).
//!
//! TLS is what the URL asks for: `sslmode=require|verify-ca|verify-full` and `sslrootcert`
//! (rustls, the process's one provider), with libpq's trust rules: a verifying mode trusts
//! the `sslrootcert` file alone, or the system roots when none is named (`pg_tls.rs`). A URL that names no `sslmode` (and no `PGSSLMODE`)
//! connects in plaintext, as it always has: sqlx's default `prefer` would encrypt
//! opportunistically without verifying anyone, which protects nothing and would make every
//! default connection pay a handshake.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgSslMode};
use sqlx::{ConnectOptions, Connection};

use super::{CHECK_IDLE_AFTER, ensure_database, pg_tls, pg_tunnel, pool_options};

/// A connection to the maintenance database of the server `url` names (`postgres`, or
/// `template1` when `url` names `postgres`, as `createdb` picks it), opened as every other
/// connection is ([`postgres_options`]); and the name of the database `url` names.
pub async fn connect_maintenance(url: &str) -> Result<(PgConnection, String), sqlx::Error> {
    let options = postgres_options(url)?;
    let database = options
        .get_database()
        .unwrap_or(options.get_username())
        .to_owned();
    let maintenance = if database == "postgres" {
        "template1"
    } else {
        "postgres"
    };
    Ok((options.database(maintenance).connect().await?, database))
}

/// `name` quoted as a PostgreSQL identifier.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates the PostgreSQL database `url` names unless it exists.
///
/// Replicas starting together on a new database all find it missing and all create it: the
/// losers' `CREATE DATABASE` fails because the winner's is there now, which is what they
/// wanted, so that failure is success ([`created_meanwhile`]).
pub(super) async fn create_if_missing(url: &str) -> Result<(), sqlx::Error> {
    let (mut conn, database) = connect_maintenance(url).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&database)
            .fetch_one(&mut conn)
            .await?;
    if !exists {
        let create = format!("CREATE DATABASE {}", quote_identifier(&database));
        match sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut conn)
            .await
        {
            Err(error) if !created_meanwhile(&error) => return Err(error),
            _ => {}
        }
    }
    conn.close().await
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
    postgres_pool_options(max_connections, CHECK_IDLE_AFTER)
        .connect_with(postgres_options(url)?)
        .await
}

/// [`pool_options`] for PostgreSQL: besides, a new connection is kept only if its server
/// accepts writes (`SHOW transaction_read_only` is `off`, what libpq's
/// `target_session_attrs=read-write` checks). Behind a proxy or a Service that follows the
/// primary (HAProxy on Patroni's REST check, CloudNativePG's `-rw` Service), a connection
/// opened while the routing still points at a node that was just demoted, or at a standby,
/// would otherwise stay in the pool and fail every write with `25006` until the pool retired
/// it. A refused connection is dialled again with the pool's backoff within the acquire
/// timeout (a failover's window), then fails as a timed-out pool: transient either way.
/// PostgreSQL demotes a primary only by restarting it, which ends every connection it had.
pub fn postgres_pool_options(
    max_connections: u32,
    check_idle_after: std::time::Duration,
) -> sqlx::postgres::PgPoolOptions {
    pool_options(max_connections, check_idle_after).after_connect(|conn, _| {
        Box::pin(async move {
            let read_only: String = sqlx::query_scalar("SHOW transaction_read_only")
                .fetch_one(&mut *conn)
                .await?;
            if read_only == "off" {
                Ok(())
            } else {
                Err(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the server does not accept writes (a standby, or a primary being demoted): \
                     not kept; dialling the primary again",
                )))
            }
        })
    })
}

/// What holdfast's sessions tell PostgreSQL's planner a random page read costs, against 1.0
/// for a sequential one (PostgreSQL's default is 4, modelled on spinning disks). Every
/// statement holdfast runs finds a few rows by key, and its working set is in memory, where a
/// random read costs about what a sequential one does: PostgreSQL's documentation suggests
/// 1.1 for such storage. With the default, a statement that looks up rows by a parameter
/// array (the group-committed writes) gets a generic plan scanning the whole table while the
/// table is small, and keeps it on that connection however large the table grows, until
/// autovacuum's next ANALYZE (with 1.1 the index wins from a few pages on; a plan made on a
/// one-page table still scans it), and a batch's generic plan loses to a custom one on almost
/// every call. Set per
/// session (other clients of the server keep its setting), unless the URL's `options` names it.
pub(crate) const RANDOM_PAGE_COST: &str = "1.1";

/// `options` with holdfast's planner costs ([`RANDOM_PAGE_COST`]) for each session.
pub fn with_planner_costs(options: PgConnectOptions) -> PgConnectOptions {
    options.options([("random_page_cost", RANDOM_PAGE_COST)])
}

/// The connection options `url` names, TLS included; plaintext unless it (or `PGSSLMODE`)
/// names an `sslmode`; the planner's [`RANDOM_PAGE_COST`] unless it names its own.
///
/// A mode that verifies the server (`verify-ca`, `verify-full`, `require` with a root file)
/// is done by holdfast with libpq's trust rules: the options then point sqlx at a relay of
/// this process (a private Unix socket) that verifies each connection (`pg_tls.rs`), run on
/// the Tokio runtime they were made on: use them while that runtime runs tasks (holdfast's
/// pools live on the runtime that opened them). Unusable `sslrootcert`,
/// `sslcert` or `sslkey` files are refused here, naming the parameter.
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
    if !(names_mode || std::env::var_os("PGSSLMODE").is_some()) {
        return Ok(options.ssl_mode(PgSslMode::Disable));
    }
    match pg_tls::verified_tls(url, &options)? {
        Some(trust) => {
            let relay = pg_tunnel::start(trust, options.get_host(), options.get_port())?;
            Ok(options.socket(relay).ssl_mode(PgSslMode::Disable))
        }
        None => Ok(options),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn postgres_tls_is_what_the_url_asks_for() {
        let base = "postgres://u@127.0.0.1:5432/db";
        let options = |url: &str| postgres_options(url).unwrap();
        // Verifying modes go through holdfast's relay; sqlx itself then speaks plaintext to it.
        let verified = options(&format!("{base}?sslmode=verify-full"));
        assert!(verified.get_socket().is_some());
        assert!(matches!(verified.get_ssl_mode(), PgSslMode::Disable));
        let required = options(&format!("{base}?application_name=x&sslmode=require"));
        assert!(matches!(required.get_ssl_mode(), PgSslMode::Require));
        assert!(required.get_socket().is_none());
        // Naming no mode keeps the plaintext default (unless the environment names one).
        if std::env::var_os("PGSSLMODE").is_none() {
            assert!(matches!(options(base).get_ssl_mode(), PgSslMode::Disable));
        }
    }

    #[test]
    fn an_unreadable_sslrootcert_is_refused_naming_the_parameter() {
        let url =
            "postgres://u@127.0.0.1:5432/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem";
        let err = postgres_options(url).unwrap_err().to_string();
        assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");
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
