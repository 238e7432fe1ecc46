//! The all-in-one's SQLite data folder (`./data` by default): the one-writer lock, the
//! coordinator's `holdfast.db`, and a file per participant under `participants/`.
//!
//! SQLite has one writer per file. With every participant in one file, a Reserve+Confirm of
//! seats and stock queued four write transactions on that file's writer beside the
//! coordinator's four on its own; a file each lets the participants write in parallel
//! (`docs/benchmarks/2026-12-03-s16-sqlite-file-per-participant.md`). A folder an earlier holdfast made has the
//! participants in one `participants.db`: [`split_shared_participants_file`] carries it over
//! once, before any participant serves.

use std::path::{Path, PathBuf};

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};
use sqlx::{ConnectOptions, Connection};

use super::AppError;
use crate::db::{self, DatabaseKind};
use crate::participants::Kind;
pub use crate::participants::data_dir::{PARTICIPANTS_DIR, participant_url};
use crate::store::StoreError;

/// The file all participants shared before they had a file each; [`split_shared_participants_file`]
/// renames it to [`SPLIT_FROM`] once it is carried over.
pub(crate) const SHARED_PARTICIPANTS_FILE: &str = "participants.db";

/// What the shared file is renamed to once split: kept, not deleted, so nothing an operator
/// had is lost; it is read again by nothing.
pub(crate) const SPLIT_FROM: &str = "participants.db.split";

/// The one-writer lock's file in the data folder.
const LOCK_FILE: &str = "holdfast.lock";

/// One writer per folder: for a `sqlite:` URL, takes an exclusive lock on `holdfast.lock`
/// beside the database file (creating the folder), held as long as the returned file lives.
/// A second process on the same folder fails at once, naming the folder and the lock.
/// PostgreSQL URLs need no lock (`Ok(None)`).
pub(crate) fn lock_data_dir(database_url: &str) -> Result<Option<std::fs::File>, AppError> {
    if DatabaseKind::of_url(database_url)? != DatabaseKind::Sqlite {
        return Ok(None);
    }
    let dir = db::sqlite_dir(database_url).map_err(StoreError::from)?;
    std::fs::create_dir_all(&dir).map_err(|e| {
        AppError::Config(format!(
            "cannot create the data folder {}: {e}",
            dir.display()
        ))
    })?;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| AppError::Config(format!("cannot open the lock {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(AppError::Config(format!(
            "another holdfast is already using {} (lock {} held); stop it or use another folder",
            dir.display(),
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(AppError::Config(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}

/// The data folder of a `sqlite:` URL when it does not exist yet (this start will make it);
/// `None` for one that exists and for PostgreSQL.
pub(crate) fn missing_folder(database_url: &str) -> Result<Option<PathBuf>, AppError> {
    if DatabaseKind::of_url(database_url)? != DatabaseKind::Sqlite {
        return Ok(None);
    }
    let dir = db::sqlite_dir(database_url).map_err(StoreError::from)?;
    Ok((!dir.exists()).then_some(dir))
}

/// Removes `dir`, a data folder this start made, if nothing but the lock and the fresh token
/// secret was written in it (a start that failed before opening a database: no token was
/// ever derived from that secret); otherwise leaves it as it is. Call after the lock is
/// released.
pub(crate) fn remove_if_unwritten(dir: &Path) {
    let made_at_start = [LOCK_FILE, crate::config::auth::TOKEN_SECRET_FILE];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    if names.iter().any(|n| !made_at_start.iter().any(|m| n == m)) {
        return;
    }
    for name in made_at_start {
        let _ = std::fs::remove_file(dir.join(name));
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::debug!("leaving the data folder {}: {e}", dir.display());
    }
}

/// Where the copies are made before they become [`PARTICIPANTS_DIR`].
const STAGING_DIR: &str = "participants.splitting";

/// Carries a folder with the older layout over to a file per participant, once: when
/// `participants.db` is there, each of `kinds` gets a consistent copy of it (`VACUUM INTO`)
/// without the other participants' barrier rows, made in `participants.splitting/`; then the
/// shared file is renamed [`SPLIT_FROM`] (with its `-wal`/`-shm`, if any) and the staging
/// folder becomes `participants/`. Returns whether it split.
///
/// Safe to repeat after a crash at any step: copies are only made in the staging folder
/// (emptied first), and a staging folder beside `participants.db.split` but no
/// `participants/` is a split that only lacks its last rename. A folder with both
/// `participants.db` and `participants/` (an older binary run after a newer one) is refused:
/// which one holds the data is for the operator to say, not for a start to overwrite.
pub(crate) async fn split_shared_participants_file(
    database_url: &str,
    kinds: &[Kind],
) -> Result<bool, AppError> {
    let dir = db::sqlite_dir(database_url).map_err(StoreError::from)?;
    let (shared, staging, target) = (
        dir.join(SHARED_PARTICIPANTS_FILE),
        dir.join(STAGING_DIR),
        dir.join(PARTICIPANTS_DIR),
    );
    let failed = |step: &str, e: &dyn std::fmt::Display| {
        AppError::Config(format!(
            "carrying {} over to a file per participant: {step}: {e}",
            shared.display()
        ))
    };
    if !shared.exists() {
        if staging.exists() && !target.exists() && dir.join(SPLIT_FROM).exists() {
            std::fs::rename(&staging, &target).map_err(|e| failed("finishing", &e))?;
            sync_dir(&dir).map_err(|e| failed("syncing the data folder", &e))?;
            return Ok(true);
        }
        return Ok(false);
    }
    if target.exists() {
        return Err(AppError::Config(format!(
            "{} and {} are both there: an older holdfast (one file for all participants) ran on this folder after a newer one. Move away the one whose data you do not want, then start again",
            shared.display(),
            target.display()
        )));
    }
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| failed("emptying an unfinished copy", &e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| failed("creating its folder", &e))?;
    let mut from = open(&shared, SqliteJournalMode::Wal)
        .await
        .map_err(|e| failed("opening it", &e))?;
    for &kind in kinds {
        let copy = staging.join(format!("{}.db", kind.name()));
        sqlx::query("VACUUM INTO ?")
            .bind(copy.to_string_lossy().into_owned())
            .execute(&mut from)
            .await
            .map_err(|e| failed(&format!("copying it for {}", kind.name()), &e))?;
        keep_only(&copy, kind)
            .await
            .map_err(|e| failed(&format!("keeping only {}'s barrier rows", kind.name()), &e))?;
    }
    // The copies' names in the staging folder, durable before anything is renamed.
    sync_dir(&staging).map_err(|e| failed("syncing the copies' folder", &e))?;
    // Everything in the main file, so the file kept as SPLIT_FROM is whole on its own.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut from)
        .await
        .map_err(|e| failed("checkpointing it", &e))?;
    from.close().await.map_err(|e| failed("closing it", &e))?;
    // Once the main file is renamed the split has happened (the copies are complete); only
    // the staging folder's rename is left, which a restart finishes.
    for suffix in ["", "-wal", "-shm"] {
        let old = dir.join(format!("{SHARED_PARTICIPANTS_FILE}{suffix}"));
        if old.exists() {
            std::fs::rename(&old, dir.join(format!("{SPLIT_FROM}{suffix}")))
                .map_err(|e| failed("renaming it", &e))?;
        }
    }
    std::fs::rename(&staging, &target).map_err(|e| failed("finishing", &e))?;
    // The renames durable before any participant writes to its new file: renames lost to a
    // power cut after that would bring back `participants.db`, and the next start would split
    // it again over those writes.
    sync_dir(&dir).map_err(|e| failed("syncing the data folder", &e))?;
    Ok(true)
}

/// Makes the entries of folder `dir` (files created or renamed in it) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// One connection to an existing file (never creating it).
async fn open(file: &Path, journal: SqliteJournalMode) -> Result<SqliteConnection, sqlx::Error> {
    SqliteConnectOptions::new()
        .filename(file)
        .journal_mode(journal)
        .connect()
        .await
}

/// Deletes from the copy at `file` the barrier rows of every participant but `kind` (each
/// participant's business tables are its own: the others' stay, unread). In rollback-journal
/// mode, so closing it leaves no `-wal` beside the copy; the pool that opens it later turns
/// WAL on again.
async fn keep_only(file: &Path, kind: Kind) -> Result<(), sqlx::Error> {
    let mut copy = open(file, SqliteJournalMode::Delete).await?;
    sqlx::query("DELETE FROM tcc_barrier WHERE participant <> ?")
        .bind(kind.name())
        .execute(&mut copy)
        .await?;
    copy.close().await
}
