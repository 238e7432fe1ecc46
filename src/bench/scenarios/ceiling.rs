//! `ceiling`: the raw commit rate of the benchmark's Postgres, the baseline every other
//! scenario's rate is compared with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Measured, Progress, join_workers};
use crate::bench::stats::{Outcome, Recorder};

/// The raw commit rate: `conns` connections each running single-statement autocommit
/// `UPDATE bench_ceiling SET n = n + 1 WHERE id = <its own row>` in a loop for `duration`.
/// With `one_row`, every connection updates the same row: commits queue on its lock, each
/// waiting for the previous one's WAL flush (the contended single-row rate).
pub async fn ceiling(
    url: &str,
    conns: usize,
    duration: Duration,
    progress: Arc<Progress>,
    one_row: bool,
) -> Result<Measured, String> {
    let n = u32::try_from(conns).map_err(|_| "too many connections".to_owned())?;
    let pool = crate::db::connect_postgres(url, n)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let setup = async {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_ceiling (id int PRIMARY KEY, n bigint NOT NULL)",
        )
        .execute(&pool)
        .await?;
        sqlx::query(
            "INSERT INTO bench_ceiling SELECT g, 0 FROM generate_series(0, $1 - 1) g \
             ON CONFLICT DO NOTHING",
        )
        .bind(i32::try_from(conns).unwrap_or(i32::MAX))
        .execute(&pool)
        .await?;
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = setup.await {
        pool.close().await;
        return Err(format!("creating bench_ceiling: {e}"));
    }
    let start = Instant::now();
    let deadline = start + duration;
    let workers = (0..conns).map(|id| {
        let (pool, progress) = (pool.clone(), progress.clone());
        tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut conn = match pool.acquire().await {
                Ok(c) => c,
                Err(e) => {
                    rec.record(Outcome::Error(format!("connect: {e}")), Duration::ZERO);
                    return rec;
                }
            };
            while Instant::now() < deadline {
                let t = Instant::now();
                let row = if one_row { 0 } else { id };
                let done = sqlx::query("UPDATE bench_ceiling SET n = n + 1 WHERE id = $1")
                    .bind(i32::try_from(row).unwrap_or(i32::MAX))
                    .execute(&mut *conn)
                    .await;
                let outcome = match done {
                    Ok(r) if r.rows_affected() == 1 => Outcome::Ok,
                    Ok(_) => Outcome::Error("UPDATE matched no row".into()),
                    Err(e) => Outcome::Error(format!("UPDATE: {e}")),
                };
                progress.count(&outcome);
                let failed = matches!(outcome, Outcome::Error(_));
                rec.record(outcome, t.elapsed());
                if failed {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            rec
        })
    });
    let recorder = join_workers(workers.collect()).await;
    let elapsed = start.elapsed();
    pool.close().await;
    Ok(Measured {
        recorder,
        elapsed,
        notes: vec![],
        extra: serde_json::json!({
            "statement": "UPDATE bench_ceiling SET n = n + 1 WHERE id = $1 (autocommit)",
            "rows": if one_row { "one row shared by every connection" } else { "one row per connection" },
        }),
        // CREATE TABLE and the INSERT of the rows.
        setup_xacts: 2,
    })
}
