//! The barrier's schema (`tcc_barrier`, its indexes; on SQLite also the test clock's offset row
//! its statements read), embedded from `migrations/{postgres,sqlite}/` of this crate.
//!
//! A participant applies it with [`crate::migrate`] (or [`Backend::migrate`]): tracked in a
//! table of its own, [`MIGRATIONS_TABLE`], so it sits beside the author's own migrations
//! (`sqlx::migrate!`, tracked in `_sqlx_migrations`) without either seeing the other's
//! versions. A service that keeps one migration history for both can merge [`POSTGRES`] /
//! [`SQLITE`] into its own set instead, as holdfast's reference participants do; the barrier's
//! versions (0001, 0008, 0090, 0091) are stable.

use std::sync::LazyLock;

use sqlx::Pool;
#[cfg(feature = "postgres")]
use sqlx::Postgres;
#[cfg(feature = "sqlite")]
use sqlx::Sqlite;
use sqlx::migrate::{MigrateError, Migrator};

use crate::Backend;

/// The table the barrier's applied migrations are tracked in by [`crate::migrate`].
pub const MIGRATIONS_TABLE: &str = "_holdfast_barrier_migrations";

/// The barrier's PostgreSQL migrations, as embedded (sqlx's default tracking table).
#[cfg(feature = "postgres")]
pub static POSTGRES: Migrator = sqlx::migrate!("./migrations/postgres");

/// The barrier's SQLite migrations, as embedded (sqlx's default tracking table).
#[cfg(feature = "sqlite")]
pub static SQLITE: Migrator = sqlx::migrate!("./migrations/sqlite");

fn tracked_apart(embedded: &Migrator) -> Migrator {
    let mut migrator = Migrator::with_migrations(embedded.iter().cloned().collect());
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

#[cfg(feature = "postgres")]
static POSTGRES_APART: LazyLock<Migrator> = LazyLock::new(|| tracked_apart(&POSTGRES));
#[cfg(feature = "sqlite")]
static SQLITE_APART: LazyLock<Migrator> = LazyLock::new(|| tracked_apart(&SQLITE));

#[cfg(feature = "postgres")]
pub(crate) async fn run_postgres(pool: &Pool<Postgres>) -> Result<(), MigrateError> {
    POSTGRES_APART.run(pool).await
}

#[cfg(feature = "sqlite")]
pub(crate) async fn run_sqlite(pool: &Pool<Sqlite>) -> Result<(), MigrateError> {
    SQLITE_APART.run(pool).await
}

/// Applies the barrier's schema to `pool` (idempotent), tracked in [`MIGRATIONS_TABLE`]. On
/// PostgreSQL concurrent starts are serialised by sqlx's advisory lock; SQLite migrations take
/// no lock of their own, so run it once before serving (as the examples do), not from several
/// processes at once.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), MigrateError> {
    DB::migrate(pool).await
}
