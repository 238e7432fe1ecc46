//! What one hand-off per SQLite write buys (issue #20, BENCHMARKS.md): a measurement, not
//! product code.
//!
//! sqlx runs each SQLite connection on a thread of its own: every statement of a write
//! transaction is a round trip from the async task to that thread and back, all while the
//! file's one write lock is held. This runs one
//! coordinator-shaped write (a Reserve's create: the request lookup, the reservation and its
//! two branches inserted, the row and its branches read back, then a decision's conditional
//! UPDATE - the statements of `src/store/sqlite/create.rs` and `decide.rs`) on the real
//! coordinator schema, from many concurrent tasks, two ways:
//! - `sqlx`: `holdfast::db::begin_sqlite_write` (the pool's one writer, queued in process, group
//!   commit; the participant SDK's way, and the coordinator store's until session 19): nine
//!   hand-offs per write;
//! - `sync`: the same statements on `holdfast::db::SqliteSyncWriter`, the coordinator store's
//!   way now: a synchronous connection owned by a thread of its own, a write sent there whole
//!   and answered once, queued writes sharing one transaction (a `SAVEPOINT` each) and one
//!   COMMIT;
//! - `locked`: the sqlx writer and transaction, the statements run on sqlx's own connection
//!   taken off its thread for the write (`lock_handle`), through a rusqlite wrapper.
//!
//! Both use `synchronous = FULL` and WAL. It prints writes per second, the process's CPU per
//! write and the latency of one write:
//!
//! ```sh
//! cargo run --release --example sqlite_handoff -- sqlx 32 10   # mode, concurrent writers, seconds
//! cargo run --release --example sqlite_handoff -- sync 32 10
//! cargo run --release --example sqlite_handoff -- locked 32 10
//! ```

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast_serve::sqlite_now_us;
use uuid::Uuid;

type Failure = Box<dyn Error + Send + Sync>;

const FIND: &str = concat!(
    "SELECT (SELECT id FROM reservations WHERE owner = ?3 AND holder = ?1 AND request_id = ?2), \
            (SELECT count(*) FROM reservations WHERE owner = ?3 AND holder = ?1 \
               AND state IN ('TRYING', 'HELD') AND (state = 'TRYING' OR expires_at > ",
    sqlite_now_us!(),
    "))"
);
const INSERT: &str = concat!(
    "INSERT INTO reservations (id, request_id, holder, state, token_digest, ttl_ms, created_at, \
                               updated_at, expires_at, labels, lease_owner, lease_until, owner, \
                               token_key_id) \
     VALUES (?1, ?2, ?3, 'TRYING', ?4, ?5, ",
    sqlite_now_us!(),
    ", ",
    sqlite_now_us!(),
    ", ",
    sqlite_now_us!(),
    " + ?5 * 1000, ?6, ?7, ",
    sqlite_now_us!(),
    " + ?8, ?9, ?10) ON CONFLICT (owner, holder, request_id) DO NOTHING"
);
const BRANCH: &str = "INSERT INTO branches (reservation_id, position, branch_id, participant, \
                      resource, quantity, during_start, during_end, state) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, NULL, 'PENDING')";
const LOAD: &str = "SELECT generation, state FROM reservations WHERE id = ?1";
const LOAD_BRANCHES: &str = "SELECT position, participant, resource, quantity, state FROM branches \
                             WHERE reservation_id = ?1 AND generation = ?2 ORDER BY position";
const DECIDE: &str = concat!(
    "UPDATE reservations SET state = 'CONFIRMED', version = version + 1, updated_at = ",
    sqlite_now_us!(),
    " WHERE id = ?1 AND state = 'TRYING'"
);
const PARTICIPANTS: [&str; 2] = ["noop-a", "noop-b"];
/// How long a `sync` write waits for its turn on the writer thread.
const WAIT: Duration = Duration::from_secs(5);

/// One write the sqlx writer's way: nine round trips to the connection's thread.
async fn write_sqlx(pool: &sqlx::SqlitePool, holder: &str) -> Result<(), Failure> {
    let mut tx = holdfast::db::begin_sqlite_write(pool).await?;
    let (id, request_id) = (Uuid::new_v4(), Uuid::new_v4().to_string());
    let _: (Option<Vec<u8>>, i64) = sqlx::query_as(FIND)
        .bind(holder)
        .bind(&request_id)
        .bind("bench")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(INSERT)
        .bind(id)
        .bind(&request_id)
        .bind(holder)
        .bind([7u8; 32].as_slice())
        .bind(60_000i64)
        .bind("{}")
        .bind(Uuid::new_v4())
        .bind(30_000_000i64)
        .bind("bench")
        .bind(Option::<String>::None)
        .execute(&mut *tx)
        .await?;
    for (position, participant) in PARTICIPANTS.iter().enumerate() {
        sqlx::query(BRANCH)
            .bind(id)
            .bind(position as i64)
            .bind(Uuid::new_v4())
            .bind(*participant)
            .bind("r")
            .bind(1i64)
            .execute(&mut *tx)
            .await?;
    }
    let (generation, _state): (i64, String) =
        sqlx::query_as(LOAD).bind(id).fetch_one(&mut *tx).await?;
    let branches: Vec<(i64, String, String, i64, String)> = sqlx::query_as(LOAD_BRANCHES)
        .bind(id)
        .bind(generation)
        .fetch_all(&mut *tx)
        .await?;
    let decided = sqlx::query(DECIDE).bind(id).execute(&mut *tx).await?;
    check(branches.len(), decided.rows_affected() as usize)?;
    Ok(tx.commit().await?)
}

/// Today's writer and transaction, but its statements run here, on sqlx's own connection taken
/// from its thread for the write (`lock_handle`: one hand-off), wrapped by rusqlite (a wrapper
/// per write, so every statement is prepared again).
async fn write_locked(pool: &sqlx::SqlitePool, holder: &str) -> Result<(), Failure> {
    let mut tx = holdfast::db::begin_sqlite_write(pool).await?;
    {
        let mut locked = tx.lock_handle().await?;
        // SAFETY: the handle is sqlx's open connection, locked away from its thread until
        // `locked` drops, after the wrapper (which does not close it) is gone.
        let conn = unsafe { rusqlite::Connection::from_handle(locked.as_raw_handle().as_ptr())? };
        write_sync(&conn, holder)?;
    }
    Ok(tx.commit().await?)
}

/// The same write on the writer thread's own connection: no hand-off between statements.
fn write_sync(conn: &rusqlite::Connection, holder: &str) -> Result<(), Failure> {
    let (id, request_id) = (Uuid::new_v4(), Uuid::new_v4().to_string());
    let id = id.as_bytes().as_slice();
    let _: (Option<Vec<u8>>, i64) = conn
        .prepare_cached(FIND)?
        .query_row(rusqlite::params![holder, request_id, "bench"], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    conn.prepare_cached(INSERT)?.execute(rusqlite::params![
        id,
        request_id,
        holder,
        [7u8; 32].as_slice(),
        60_000i64,
        "{}",
        Uuid::new_v4().as_bytes().as_slice(),
        30_000_000i64,
        "bench",
        Option::<String>::None
    ])?;
    for (position, participant) in PARTICIPANTS.iter().enumerate() {
        conn.prepare_cached(BRANCH)?.execute(rusqlite::params![
            id,
            position as i64,
            Uuid::new_v4().as_bytes().as_slice(),
            participant,
            "r",
            1i64
        ])?;
    }
    let (generation, _state): (i64, String) = conn
        .prepare_cached(LOAD)?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let mut load_branches = conn.prepare_cached(LOAD_BRANCHES)?;
    let branches = load_branches
        .query_map(rusqlite::params![id, generation], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let decided = conn.prepare_cached(DECIDE)?.execute([id])?;
    check(branches.len(), decided)
}

/// Both ways read back what they wrote and decide once.
fn check(branches: usize, decided: usize) -> Result<(), Failure> {
    if (branches, decided) != (PARTICIPANTS.len(), 1) {
        return Err(format!("read back {branches} branches, decided {decided} rows").into());
    }
    Ok(())
}

/// CPU time this process has used (user + system).
fn cpu_used() -> Result<Duration, Failure> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).ok_or("stat")?.parse::<u64>()?
        + fields.get(12).ok_or("stat")?.parse::<u64>()?;
    Ok(Duration::from_millis(ticks * 10)) // USER_HZ is 100 on Linux
}

/// What one run measured.
struct Measured {
    writes: u64,
    line: String,
}

/// Runs `mode` with `writers` concurrent tasks for `run_for` on a fresh coordinator database in
/// `folder`: writes per second, CPU per write, latency.
async fn measure(
    mode: &str,
    writers: usize,
    run_for: Duration,
    folder: &std::path::Path,
) -> Result<Measured, Failure> {
    let file = folder.join("holdfast.db");
    let pool = holdfast::db::open_sqlite(&format!("sqlite://{}", file.display()), 4).await?;
    holdfast::store::sqlite::MIGRATOR.run(&pool).await?;
    let sync = if mode == "sync" {
        Some(holdfast::db::SqliteSyncWriter::open(&file)?)
    } else {
        None
    };
    let locked = mode == "locked";
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + run_for;
    let (started, cpu_before) = (Instant::now(), cpu_used()?);
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (pool, sync, done) = (pool.clone(), sync.clone(), done.clone());
        tasks.spawn(async move {
            let holder = format!("holder-{w}");
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let begun = Instant::now();
                match &sync {
                    Some(writer) => {
                        let holder = holder.clone();
                        let wrote = writer.write(WAIT, move |conn| {
                            conn.with(|c| write_sync(c, &holder))
                                .map_err(|e| sqlx::Error::Protocol(e.to_string()))
                        });
                        wrote.await.map_err(|e| e.to_string())?;
                    }
                    None if locked => write_locked(&pool, &holder)
                        .await
                        .map_err(|e| e.to_string())?,
                    None => write_sqlx(&pool, &holder)
                        .await
                        .map_err(|e| e.to_string())?,
                }
                latencies.push(begun.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??);
    }
    let (wall, cpu) = (started.elapsed(), cpu_used()? - cpu_before);
    drop(sync); // the writer thread ends once its queue is gone
    let writes = done.load(Ordering::Relaxed);
    latencies.sort();
    if latencies.is_empty() {
        return Err("no write finished".into());
    }
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    let line = format!(
        "{mode} writers={writers}: {:.0} writes/s, CPU {:.3} ms/write, p50 {:.2} ms, p99 {:.2} ms",
        writes as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e3 / writes as f64,
        at(0.5),
        at(0.99),
    );
    pool.close().await;
    Ok(Measured { writes, line })
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: sqlite_handoff sqlx|sync|locked [writers] [seconds]";
    let mode = args.get(1).ok_or(usage)?.clone();
    if !MODES.contains(&mode.as_str()) {
        return Err(usage.into());
    }
    let writers: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let seconds: u64 = args.get(3).map_or(Ok(10), |s| s.parse())?;
    let folder = std::env::temp_dir().join(format!("holdfast-handoff-{}", std::process::id()));
    let measured = measure(&mode, writers, Duration::from_secs(seconds), &folder).await;
    std::fs::remove_dir_all(&folder)?;
    let measured = measured?;
    println!("{} ({} writes)", measured.line, measured.writes);
    Ok(())
}

const MODES: [&str; 3] = ["sqlx", "sync", "locked"];

/// `cargo test` runs each way briefly: the measurement keeps working as the schema changes,
/// and every write it counted was committed (each one's reservation reads `CONFIRMED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_commits_every_write_it_counts() {
    for mode in MODES {
        let folder = std::env::temp_dir().join(format!(
            "holdfast-handoff-test-{mode}-{}",
            std::process::id()
        ));
        let measured = measure(mode, 4, Duration::from_millis(300), &folder)
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        let url = format!("sqlite://{}", folder.join("holdfast.db").display());
        let pool = holdfast::db::open_sqlite(&url, 1).await.unwrap();
        let confirmed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM reservations WHERE state = 'CONFIRMED'")
                .fetch_one(&pool)
                .await
                .unwrap();
        pool.close().await;
        let _ = std::fs::remove_dir_all(&folder);
        assert!(measured.writes > 0, "{mode}: no write");
        assert_eq!(
            confirmed as u64, measured.writes,
            "{mode}: {}",
            measured.line
        );
    }
}
