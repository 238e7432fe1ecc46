//! The SQLite writer thread (`sqlite_sync.rs`) against real files: a queue is one group, a
//! write's failure stays its own, a nested transaction rolls back alone.

use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Waker};

use super::tests::{impatient_pool, remove, rows};
use super::*;

/// How long the tests' writes wait for their turn.
const WAIT: Duration = Duration::from_secs(10);

type Write = Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send>>;

fn writer_of(dir: &Path) -> SqliteSyncWriter {
    SqliteSyncWriter::open(&dir.join("t.db")).unwrap()
}

/// Writes a row `seen` (`None`: a NULL the table refuses).
fn insert(conn: &SyncConnection, seen: Option<i64>) -> Result<(), sqlx::Error> {
    conn.with(|c| c.execute("INSERT INTO t (seen) VALUES (?1)", [seen]))
        .map(|_| ())
        .map_err(sqlx_error_of)
}

/// A write that inserts `seen`.
fn inserting(writer: &SqliteSyncWriter, seen: i64) -> Write {
    let writer = writer.clone();
    Box::pin(async move { writer.write(WAIT, move |c| insert(c, Some(seen))).await })
}

/// Polls each write once: each has then sent its job to the thread (nothing waits before).
fn queue(writes: &mut [Write]) {
    let mut cx = Context::from_waker(Waker::noop());
    for w in writes {
        assert!(w.as_mut().poll(&mut cx).is_pending(), "the writer is held");
    }
}

/// A write that inserts `seen` once the test opens the gate, and says when it started (the
/// thread is then held in it, its group taken already).
fn held(
    writer: &SqliteSyncWriter,
    seen: i64,
) -> (
    Write,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let (started, on_start) = std::sync::mpsc::channel();
    let (open, gate) = std::sync::mpsc::channel::<()>();
    let writer = writer.clone();
    let write: Write = Box::pin(async move {
        writer
            .write(WAIT, move |c| {
                let _ = started.send(());
                let _ = gate.recv();
                insert(c, Some(seen))
            })
            .await
    });
    (write, on_start, open)
}

#[tokio::test(flavor = "current_thread")]
async fn writes_queued_behind_one_commit_together_and_a_failure_stays_its_own() {
    let (pool, dir) = impatient_pool("sync-group").await;
    let writer = writer_of(&dir);
    let (mut first, started, open) = held(&writer, 0);
    queue(std::slice::from_mut(&mut first));
    started.recv().unwrap();
    let mut queued: Vec<Write> = (1..=10).map(|i| inserting(&writer, i)).collect();
    let w = writer.clone();
    queued.push(Box::pin(async move {
        w.write(WAIT, |c| {
            insert(c, Some(11))?;
            Err(sqlx::Error::Protocol("refused after writing".into()))
        })
        .await
    }));
    let w = writer.clone();
    queued.push(Box::pin(
        async move { w.write(WAIT, |c| insert(c, None)).await },
    ));
    queue(&mut queued);
    open.send(()).unwrap();
    first.await.unwrap();
    let mut answers = Vec::new();
    for w in queued {
        answers.push(w.await);
    }
    for (i, a) in answers[..10].iter().enumerate() {
        assert!(a.is_ok(), "write {}: {a:?}", i + 1);
    }
    assert!(
        matches!(&answers[10], Err(sqlx::Error::Protocol(m)) if m.contains("refused")),
        "{:?}",
        answers[10]
    );
    match &answers[11] {
        Err(sqlx::Error::Database(db)) => {
            assert_eq!(db.kind(), sqlx::error::ErrorKind::NotNullViolation);
            assert_eq!(db.code().as_deref(), Some("1299"), "{db}");
        }
        other => panic!("a NULL into a NOT NULL column: {other:?}"),
    }
    assert_eq!(rows(&pool).await, (0..=10).collect::<Vec<_>>());
    // The held write's group, then everything queued behind it in one.
    assert_eq!(writer.commits.load(Ordering::Relaxed), 2);
    remove(pool, dir).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_transaction_inside_a_write_rolls_back_alone() {
    let (pool, dir) = impatient_pool("sync-nested").await;
    let writer = writer_of(&dir);
    writer
        .write(WAIT, |c| {
            insert(c, Some(1))?;
            let tx = SyncWrite::begin(c)?;
            insert(&tx, Some(2))?;
            drop(tx); // unfinished: undone
            let tx = SyncWrite::begin(c)?;
            insert(&tx, Some(3))?;
            futures_ready(WriteTransaction::rollback(tx))?;
            let tx = SyncWrite::begin(c)?;
            insert(&tx, Some(4))?;
            futures_ready(WriteTransaction::commit(tx))
        })
        .await
        .unwrap();
    assert_eq!(rows(&pool).await, vec![1, 4]);
    remove(pool, dir).await;
}

/// A future that is ready at once (a [`SyncWrite`]'s commit and rollback are), run.
fn futures_ready<T>(f: impl Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        std::task::Poll::Ready(t) => t,
        std::task::Poll::Pending => panic!("a SyncWrite's end waited"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_write_whose_caller_gave_up_before_its_turn_is_skipped() {
    let (pool, dir) = impatient_pool("sync-gave-up").await;
    let writer = writer_of(&dir);
    let (mut first, started, open) = held(&writer, 1);
    queue(std::slice::from_mut(&mut first));
    started.recv().unwrap();
    let impatient = writer
        .write(Duration::from_millis(20), |c| insert(c, Some(2)))
        .await;
    assert!(
        matches!(impatient, Err(sqlx::Error::PoolTimedOut)),
        "{impatient:?}"
    );
    open.send(()).unwrap();
    first.await.unwrap();
    inserting(&writer, 3).await.unwrap();
    assert_eq!(rows(&pool).await, vec![1, 3]);
    remove(pool, dir).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_write_that_panics_answers_an_error_and_the_writer_goes_on() {
    let (pool, dir) = impatient_pool("sync-panic").await;
    let writer = writer_of(&dir);
    let panicked = writer
        .write(WAIT, |c| -> Result<(), sqlx::Error> {
            insert(c, Some(1))?;
            panic!("a bug in a write");
        })
        .await;
    assert!(
        matches!(&panicked, Err(sqlx::Error::Protocol(m)) if m.contains("panicked")),
        "{panicked:?}"
    );
    inserting(&writer, 2).await.unwrap();
    assert_eq!(rows(&pool).await, vec![2]);
    remove(pool, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_cannot_take_the_write_lock_fails_every_write_and_runs_none() {
    let (pool, dir) = impatient_pool("sync-busy").await;
    let writer = writer_of(&dir);
    // Another connection holds SQLite's write lock for longer than the busy timeout.
    let mut other = pool.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *other)
        .await
        .unwrap();
    let busy = writer.write(WAIT, |c| insert(c, Some(1))).await;
    match &busy {
        Err(sqlx::Error::Database(db)) => {
            assert_eq!(db.code().as_deref(), Some("5"), "SQLITE_BUSY: {db}");
        }
        other => panic!("the lock is held elsewhere: {other:?}"),
    }
    sqlx::query("ROLLBACK").execute(&mut *other).await.unwrap();
    drop(other);
    inserting(&writer, 2).await.unwrap();
    assert_eq!(rows(&pool).await, vec![2]);
    remove(pool, dir).await;
}
