//! How the SQLite store writes: every write is one closure run whole on the database's writer
//! thread ([`crate::db::SqliteSyncWriter`]), its statements on that thread's synchronous
//! connection, group-committed with the writes queued beside it. [`OnWriter`] is that
//! connection as the shared flows see it (`ReservationSql` and friends); as its statements
//! never wait, one poll runs a flow to its end ([`ready`]).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::db::SyncConnection;
use crate::store::StoreError;

/// SQLite's statements as the shared flows run them: on the writer thread's connection.
pub(crate) struct OnWriter;

/// The connection a write runs on.
pub(crate) type Conn = Arc<SyncConnection>;

/// Runs one statement that returns no rows; answers how many rows it changed.
pub(super) fn exec(
    conn: &SyncConnection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<usize, StoreError> {
    Ok(conn.with(|c| c.prepare_cached(sql)?.execute(params))?)
}

/// Runs a statement and reads its first row, if any.
pub(super) fn optional<T>(
    conn: &SyncConnection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Option<T>, StoreError> {
    use rusqlite::OptionalExtension;
    Ok(conn.with(|c| c.prepare_cached(sql)?.query_row(params, read).optional())?)
}

/// Runs a statement and reads its one row.
pub(super) fn one<T>(
    conn: &SyncConnection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<T, StoreError> {
    Ok(conn.with(|c| c.prepare_cached(sql)?.query_row(params, read))?)
}

/// Runs a statement and reads every row.
pub(super) fn all<T>(
    conn: &SyncConnection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    Ok(conn.with(|c| {
        c.prepare_cached(sql)?
            .query_map(params, read)?
            .collect::<rusqlite::Result<Vec<T>>>()
    })?)
}

/// Runs a flow written over async statements to its end in one poll: on the writer thread
/// every statement is synchronous, so nothing in it waits. One that did would be a bug; it is
/// answered as an internal failure (its savepoint undone) rather than blocking the writer.
pub(super) fn ready<T>(flow: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    let mut flow = std::pin::pin!(flow);
    match flow.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => Err(StoreError::Corrupt(
            "a SQLite write waited on something other than its statements".into(),
        )),
    }
}
