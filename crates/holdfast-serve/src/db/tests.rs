//! The SQLite helpers against real files: the writer queue and its group commit.

use std::str::FromStr;
use std::sync::Arc;

use super::sqlite::sqlite_writer;
use super::*;
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// A SQLite file of its own under the temp dir, with a busy timeout of zero: any write that
/// has to wait for SQLite's lock fails at once with "database is locked".
pub(super) async fn impatient_pool(name: &str) -> (SqlitePool, std::path::PathBuf) {
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

/// Closes `pool` and removes its folder.
pub(super) async fn remove(pool: SqlitePool, dir: std::path::PathBuf) {
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes a row `seen` on `conn`.
async fn insert(conn: &mut sqlx::SqliteConnection, seen: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO t (seen) VALUES (?1)")
        .bind(seen)
        .execute(conn)
        .await
        .map(|_| ())
}

/// A write transaction of `pool` begun, with a row `seen` written in it.
async fn begun(pool: &SqlitePool, seen: i64) -> SqliteWrite {
    let mut write = begin_sqlite_write(pool).await.unwrap();
    insert(&mut write, seen).await.unwrap();
    write
}

/// One whole write of row `seen`: begun, inserted, committed; the first error.
async fn write_row(pool: SqlitePool, seen: i64) -> Result<(), sqlx::Error> {
    let mut write = begin_sqlite_write(&pool).await?;
    insert(&mut write, seen).await?;
    write.commit().await
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
                insert(&mut tx, n).await?;
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
    // Writes that queued committed together: fewer COMMITs than writes.
    assert!(sqlite_writer(&pool).unwrap().commits() < 64);
    remove(pool, dir).await;
}

/// Every connection of a pool `open_sqlite` makes cuts the WAL file back to
/// `SQLITE_WAL_KEEP_BYTES` when the log starts over (SQLite's default keeps its high-water
/// mark: -1).
#[tokio::test]
async fn sqlite_pools_cut_the_wal_back_when_it_starts_over() {
    let (pool, dir) = impatient_pool("wal-limit").await;
    pool.close().await;
    let url = format!("sqlite://{}", dir.join("t.db").display());
    let pool = open_sqlite(&url, 2).await.unwrap();
    let (mut a, mut b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    for conn in [&mut a, &mut b] {
        let limit: i64 = sqlx::query_scalar("PRAGMA journal_size_limit")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        assert_eq!(limit, SQLITE_WAL_KEEP_BYTES);
    }
    drop((a, b));
    remove(pool, dir).await;
}

/// ... and it does: a write transaction larger than the cap grows the WAL past it; once a
/// checkpoint has copied it into the database, the next write starts the log over and the file
/// is cut back to the cap (with SQLite's default it would stay at its high-water mark).
#[tokio::test]
async fn a_sqlite_wal_grown_past_the_cap_is_cut_back_once_it_starts_over() {
    let (pool, dir) = impatient_pool("wal-cut").await;
    pool.close().await;
    let url = format!("sqlite://{}", dir.join("t.db").display());
    let pool = open_sqlite(&url, 1).await.unwrap();
    let wal = dir.join("t.db-wal");
    let past_the_cap = usize::try_from(SQLITE_WAL_KEEP_BYTES).unwrap() + 8 * 1024 * 1024;
    let mut write = begin_sqlite_write(&pool).await.unwrap();
    sqlx::query("CREATE TABLE big (b BLOB NOT NULL)")
        .execute(&mut *write)
        .await
        .unwrap();
    sqlx::query("INSERT INTO big (b) VALUES (zeroblob(?1))")
        .bind(i64::try_from(past_the_cap).unwrap())
        .execute(&mut *write)
        .await
        .unwrap();
    write.commit().await.unwrap();
    let grown = std::fs::metadata(&wal).unwrap().len();
    assert!(
        grown > SQLITE_WAL_KEEP_BYTES as u64,
        "the WAL is {grown} bytes"
    );

    // Everything copied into the database (nobody reads: the checkpoint completes) ...
    let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(busy, 0);
    // ... so the next write starts the log over, and cuts the file back.
    let mut write = begin_sqlite_write(&pool).await.unwrap();
    sqlx::query("DELETE FROM big")
        .execute(&mut *write)
        .await
        .unwrap();
    write.commit().await.unwrap();
    let after = std::fs::metadata(&wal).unwrap().len();
    assert!(
        after <= SQLITE_WAL_KEEP_BYTES as u64,
        "the WAL stayed at {after} bytes (it had grown to {grown})"
    );
    remove(pool, dir).await;
}

#[tokio::test]
async fn each_sqlite_pool_has_one_writer_of_its_own_and_a_closed_pool_writes_nothing() {
    let (a, dir_a) = impatient_pool("a").await;
    let (b, dir_b) = impatient_pool("b").await;
    assert!(Arc::ptr_eq(
        &sqlite_writer(&a).unwrap(),
        &sqlite_writer(&a).unwrap()
    ));
    assert!(!Arc::ptr_eq(
        &sqlite_writer(&a).unwrap(),
        &sqlite_writer(&b).unwrap()
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

/// Waits until `n` writes are queued for `pool`'s writer (they queue at once; the bound
/// only turns a hang into a failure).
pub(super) async fn until_queued(pool: &SqlitePool, n: usize) {
    let writer = sqlite_writer(pool).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while writer.queued() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} writes queued",
            writer.queued()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(super) async fn rows(pool: &SqlitePool) -> Vec<i64> {
    sqlx::query_scalar("SELECT seen FROM t ORDER BY seen")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Commits `first` (holding the writer while `members` queued behind it), then checks the
/// members' answers: the second failed on its NOT NULL insert, every other one succeeded.
pub(super) async fn only_the_second_member_failed(
    first: SqliteWrite,
    members: Vec<tokio::task::JoinHandle<Result<(), sqlx::Error>>>,
) {
    let first = tokio::spawn(first.commit());
    let mut answers = Vec::new();
    for member in members {
        answers.push(member.await.unwrap().map_err(|e| e.to_string()));
    }
    first.await.unwrap().unwrap();
    assert!(
        answers[1].as_ref().is_err_and(|e| e.contains("NOT NULL")),
        "{answers:?}"
    );
    for (i, answer) in answers.iter().enumerate() {
        if i != 1 {
            assert!(answer.is_ok(), "member {}: {answer:?}", i + 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_commit_together_and_a_members_failure_stays_its_own() {
    let (pool, dir) = impatient_pool("group").await;
    let writer = sqlite_writer(&pool).unwrap();
    let commits_before = writer.commits();
    // The first write holds the writer while six more queue behind it.
    let first = begun(&pool, 0).await;
    let members: Vec<_> = (1..=6_i64)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut tx = begin_sqlite_write(&pool).await?;
                insert(&mut tx, i).await?;
                match i {
                    // A statement fails after the member's own insert: `?` drops the write
                    // unfinished.
                    2 => {
                        sqlx::query("INSERT INTO t (seen) VALUES (NULL)")
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await
                    }
                    // Rolls back on purpose.
                    4 => tx.rollback().await,
                    _ => tx.commit().await,
                }
            })
        })
        .collect();
    until_queued(&pool, 6).await;
    only_the_second_member_failed(first, members).await;
    // One COMMIT for the seven; the failed and the rolled-back members left nothing.
    assert_eq!(writer.commits() - commits_before, 1);
    assert_eq!(rows(&pool).await, vec![0, 1, 3, 5, 6]);
    remove(pool, dir).await;
}

/// A write whose task becomes ready while the only member is committing (here: one yield
/// later) joins its group: one COMMIT for both; without the gathering each committed alone.
#[tokio::test]
async fn a_write_ready_while_the_group_ends_joins_it() {
    let (pool, dir) = impatient_pool("gather").await;
    let writer = sqlite_writer(&pool).unwrap();
    let commits_before = writer.commits();
    let first = begun(&pool, 0).await;
    let second = tokio::spawn({
        let pool = pool.clone();
        async move {
            tokio::task::yield_now().await;
            write_row(pool, 1).await
        }
    });
    first.commit().await.unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(writer.commits() - commits_before, 1);
    assert_eq!(rows(&pool).await, vec![0, 1]);
    remove(pool, dir).await;
}

/// Adds a table whose foreign key is checked only by the COMMIT (deferred): a row of it naming
/// no parent is written without error, and fails the transaction's COMMIT.
async fn deferred_foreign_key(pool: &SqlitePool) {
    sqlx::query("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// How many members besides the first the failed group has, and which of them breaks it.
const FAILED_GROUP: i64 = 16;
const BREAKS_IT: i64 = 8;

/// A group of real concurrent writers whose COMMIT fails: one member leaves a deferred foreign
/// key violated, which only the COMMIT finds, after every member's own part succeeded. Every
/// member - the opener, the joiners that handed the group on, the one that ran the COMMIT - is
/// answered with that COMMIT's error, and nothing of any of them is in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_fails_every_member_and_writes_nothing() {
    let (pool, dir) = impatient_pool("failed").await;
    deferred_foreign_key(&pool).await;
    let writer = sqlite_writer(&pool).unwrap();
    let commits_before = writer.commits();
    // The first write holds the writer until every other one is queued: one group of all.
    let first = begun(&pool, 0).await;
    let members: Vec<_> = (1..=FAILED_GROUP)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut tx = begin_sqlite_write(&pool).await?;
                insert(&mut tx, i).await?;
                if i == BREAKS_IT {
                    sqlx::query("INSERT INTO child (parent) VALUES (99)")
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            })
        })
        .collect();
    until_queued(&pool, usize::try_from(FAILED_GROUP).unwrap()).await;
    let mut answers = vec![first.commit().await];
    for member in members {
        answers.push(member.await.unwrap());
    }
    for (i, answer) in answers.iter().enumerate() {
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.to_string().contains("FOREIGN KEY")),
            "member {i} of the failed group: {answer:?}"
        );
    }
    assert_eq!(writer.commits(), commits_before, "no COMMIT succeeded");
    assert!(rows(&pool).await.is_empty());
    let children: i64 = sqlx::query_scalar("SELECT count(*) FROM child")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(children, 0);
    // The writer is clean for the next write.
    let next = begun(&pool, 7).await;
    next.commit().await.unwrap();
    assert_eq!(rows(&pool).await, vec![7]);
    remove(pool, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_unfinished_is_undone_before_the_next() {
    let (pool, dir) = impatient_pool("dropped").await;
    // Alone: the whole transaction goes.
    let alone = begun(&pool, 1).await;
    drop(alone);
    let tx = begun(&pool, 3).await;
    tx.commit().await.unwrap();
    // A task cancelled while it holds the writer inside a group: the group commits without
    // its part, and nobody waits for it.
    let first = begun(&pool, 4).await;
    let (inside_tx, inside) = tokio::sync::oneshot::channel();
    let cancelled = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut tx = begin_sqlite_write(&pool).await.unwrap();
            insert(&mut tx, 5).await.unwrap();
            let _ = inside_tx.send(());
            std::future::pending::<()>().await;
            drop(tx);
        })
    };
    until_queued(&pool, 1).await;
    let first = tokio::spawn(first.commit());
    inside.await.unwrap();
    cancelled.abort();
    tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the group committed without the cancelled member")
        .unwrap()
        .unwrap();
    assert_eq!(rows(&pool).await, vec![3, 4]);
    remove(pool, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_unfinished_frees_sqlites_lock_for_other_connections() {
    let (pool, dir) = impatient_pool("lock").await;
    let dropped = begun(&pool, 1).await;
    drop(dropped);
    // Another connection to the file (as the test clock, a migration or another process
    // opens), willing to wait 2 s for the write lock: the dropped write's transaction must
    // not keep it until the writer's next write.
    let mut other =
        SqliteConnectOptions::from_str(&format!("sqlite://{}", dir.join("t.db").display()))
            .unwrap()
            .busy_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
    sqlx::query("INSERT INTO t (seen) VALUES (2)")
        .execute(&mut other)
        .await
        .unwrap();
    other.close().await.unwrap();
    assert_eq!(rows(&pool).await, vec![2]);
    remove(pool, dir).await;
}

/// The race a hand-off can lose: a finishing write sees one queued and leaves the group open
/// for it, then that write gives up before it ever has the writer. The clean-up commits the
/// group; nobody waits forever.
#[tokio::test]
async fn a_group_handed_to_a_write_that_gives_up_is_still_committed() {
    let (pool, dir) = impatient_pool("gave-up").await;
    let writer = sqlite_writer(&pool).unwrap();
    let commits_before = writer.commits();
    let first = begun(&pool, 1).await;
    let waiting = tokio::spawn(write_row(pool.clone(), 2));
    until_queued(&pool, 1).await;
    // One poll of the commit on this one-thread runtime: it hands the open group to the queued
    // write and waits, before that write's task can run.
    let mut commit = Box::pin(first.commit());
    let polled = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(commit.as_mut(), cx))
    })
    .await;
    assert!(polled.is_pending(), "handed on, waiting for the group");
    waiting.abort();
    tokio::time::timeout(Duration::from_secs(10), commit)
        .await
        .expect("the group was committed without the write that gave up")
        .unwrap();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert_eq!(writer.commits() - commits_before, 1);
    assert_eq!(rows(&pool).await, vec![1]);
    remove(pool, dir).await;
}

/// Writers that leave while they are being begun (dropped after their first poll, as a
/// caller's deadline drops them): every writer that stays commits, and one that left wrote its
/// row or nothing. Before a write's opening ran to its end in a task of its own, a member cut
/// off while its savepoint was in flight failed its whole group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_that_leave_while_beginning_fail_no_other_write() {
    let (pool, dir) = impatient_pool("leaving").await;
    const WRITERS: i64 = 40;
    for burst in 0..20 {
        let start = Arc::new(tokio::sync::Barrier::new(WRITERS as usize));
        let tasks: Vec<_> = (0..WRITERS)
            .map(|i| {
                let (pool, start, seen) = (pool.clone(), start.clone(), burst * 100 + i);
                tokio::spawn(async move {
                    start.wait().await;
                    let write = async {
                        let mut write = begin_sqlite_write(&pool).await?;
                        insert(&mut write, seen).await?;
                        write.commit().await
                    };
                    if i % 2 == 1 {
                        let _ = tokio::time::timeout(Duration::ZERO, write).await;
                        Ok(())
                    } else {
                        write.await
                    }
                })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            let answer = task.await.unwrap();
            assert!(answer.is_ok(), "burst {burst}, writer {i}: {answer:?}");
        }
        let written = rows(&pool).await;
        for i in (0..WRITERS).step_by(2) {
            assert!(written.contains(&(burst * 100 + i)), "burst {burst}: {i}");
        }
    }
    remove(pool, dir).await;
}
