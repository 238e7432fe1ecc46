//! Deferred SQLite writes against real files: the opening sent ahead of the first query, and
//! what a member's failure, rollback or drop undoes in a group.

use super::sqlite::sqlite_writer;
use super::tests::{impatient_pool, remove, rows};
use super::*;
use sqlx::sqlite::SqlitePool;

/// Writes the rows of `seen` as one deferred write's first query, one INSERT each; `None`
/// writes NULL (refused: the column is NOT NULL).
const INSERT_TWO: FirstQuery = crate::sqlite_first_query!(
    "INSERT INTO t (seen) VALUES (?1); INSERT INTO t (seen) VALUES (?2)"
);

/// A deferred write of `pool` whose first query inserts `a` and `b`; what it answered.
async fn first_two(
    pool: &SqlitePool,
    a: Option<i64>,
    b: Option<i64>,
) -> Result<SqliteWrite, sqlx::Error> {
    let mut ahead = begin_sqlite_write_deferred(pool).await?;
    let (sql, conn) = ahead.first(INSERT_TWO);
    let ran = sqlx::query(sql).bind(a).bind(b).execute(conn).await;
    ahead.opened(ran).map(|(_, write)| write)
}

/// Alone, a deferred write opens its own transaction with its first query (`BEGIN
/// IMMEDIATE` ahead of it) and commits it; a second one after it does the same.
#[tokio::test]
async fn a_deferred_write_alone_opens_with_its_first_query() {
    let (pool, dir) = impatient_pool("deferred-alone").await;
    let writer = sqlite_writer(&pool).unwrap();
    let commits_before = writer.commits();
    for (a, b, commit) in [(1, 2, true), (3, 4, false), (5, 6, true)] {
        let write = first_two(&pool, Some(a), Some(b)).await.unwrap();
        let ended = if commit {
            write.commit().await
        } else {
            write.rollback().await
        };
        ended.unwrap();
    }
    assert_eq!(writer.commits() - commits_before, 2);
    assert_eq!(rows(&pool).await, vec![1, 2, 5, 6]);
    remove(pool, dir).await;
}

/// Deferred members of one group: one whose first query fails after its first INSERT ran
/// undoes exactly its own part (its savepoint ran ahead of it), one that rolls back likewise,
/// one dropped before it sent anything leaves nothing to undo; the others commit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_members_undo_only_their_own_part() {
    let (pool, dir) = impatient_pool("deferred-group").await;
    let writer = sqlite_writer(&pool).unwrap();
    let commits_before = writer.commits();
    let mut first = begin_sqlite_write(&pool).await.unwrap();
    sqlx::query("INSERT INTO t (seen) VALUES (0)")
        .execute(&mut *first)
        .await
        .unwrap();
    let members: Vec<_> = (1..=5_i64)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                match i {
                    2 => first_two(&pool, Some(20), None).await?.commit().await,
                    3 => first_two(&pool, Some(30), Some(31)).await?.rollback().await,
                    4 => {
                        drop(begin_sqlite_write_deferred(&pool).await?);
                        Ok(())
                    }
                    _ => {
                        first_two(&pool, Some(i * 10), Some(i * 10 + 1))
                            .await?
                            .commit()
                            .await
                    }
                }
            })
        })
        .collect();
    super::tests::until_queued(&pool, 5).await;
    super::tests::only_the_second_member_failed(first, members).await;
    assert_eq!(writer.commits() - commits_before, 1);
    assert_eq!(rows(&pool).await, vec![0, 10, 11, 50, 51]);
    remove(pool, dir).await;
}

/// A member cut off after its first query was handed over, before it answered (its task
/// cancelled): whether its savepoint ran is unknown, and a `ROLLBACK TO` could reach the
/// savepoint of the member before it, undoing that member's part while it is told it
/// committed. The group is rolled back as a whole and every member told; the next write starts
/// clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_in_its_first_query_fails_its_group() {
    let (pool, dir) = impatient_pool("deferred-cut").await;
    let mut first = begin_sqlite_write(&pool).await.unwrap();
    sqlx::query("INSERT INTO t (seen) VALUES (1)")
        .execute(&mut *first)
        .await
        .unwrap();
    // A member with a savepoint of its own, queued first.
    let before = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut write = begin_sqlite_write(&pool).await?;
            sqlx::query("INSERT INTO t (seen) VALUES (2)")
                .execute(&mut *write)
                .await?;
            write.commit().await
        }
    });
    super::tests::until_queued(&pool, 1).await;
    let (asked_tx, asked) = tokio::sync::oneshot::channel();
    let cut_off = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut ahead = begin_sqlite_write_deferred(&pool).await.unwrap();
            // Asked for its first query, then cut off before its answer came.
            let _ = ahead.first(INSERT_TWO);
            let _ = asked_tx.send(());
            std::future::pending::<()>().await;
            drop(ahead);
        })
    };
    super::tests::until_queued(&pool, 2).await;
    let first = tokio::spawn(first.commit());
    asked.await.unwrap();
    cut_off.abort();
    let within = std::time::Duration::from_secs(10);
    for (who, ended) in [("first", first), ("before", before)] {
        let answer = tokio::time::timeout(within, ended)
            .await
            .expect("the group ended")
            .unwrap();
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.to_string().contains("savepoint")),
            "{who}: {answer:?}"
        );
    }
    assert_eq!(rows(&pool).await, Vec::<i64>::new());
    first_two(&pool, Some(3), Some(4))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    assert_eq!(rows(&pool).await, vec![3, 4]);
    remove(pool, dir).await;
}
