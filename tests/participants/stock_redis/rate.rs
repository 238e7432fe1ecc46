//! The participant's hold rate, alone: an ignored benchmark that prints holds/s.

use std::sync::Arc;
use std::time::Instant;

use holdfast::proto::participant_server::Participant;
use tokio::sync::Semaphore;

use super::{HOUR, start};
use crate::common::{hold, try_request};

/// Holds/s of the participant alone: `cargo test --test participants stock_redis_rate -- --ignored --nocapture`.
/// On a multi-threaded runtime (`#[sqlx::test]` runs on one thread), with its own database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; prints the rate"]
async fn stock_redis_rate() {
    const N: usize = 40_000;
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let url = format!(
        "{}/hf_bench_{}",
        base.rsplit_once('/').expect("database url").0,
        uuid::Uuid::new_v4().simple()
    );
    let pool = holdfast::db::connect_postgres(&url, 8)
        .await
        .expect("bench database");
    let mut p = start(&pool, HOUR).await;
    p.put("sku-bench", N as i64 * 2).await;
    // In process, no gRPC: the Participant trait called directly.
    let limit = Arc::new(Semaphore::new(256));
    let t = Instant::now();
    let mut calls = Vec::with_capacity(N);
    for _ in 0..N {
        let (h, limit) = (p.handle.clone(), limit.clone());
        calls.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            let req = try_request(vec![hold("sku-bench", 1, None)]);
            h.r#try(tonic::Request::new(req)).await.expect("try");
        }));
    }
    for c in calls {
        c.await.expect("join");
    }
    let direct = N as f64 / t.elapsed().as_secs_f64();
    // Over gRPC on loopback, 32 connections, 256 in flight.
    let mut clients = Vec::new();
    for _ in 0..32 {
        clients.push(p.client().await);
    }
    let t = Instant::now();
    let mut calls = Vec::with_capacity(N);
    for i in 0..N {
        let (mut client, limit) = (clients[i % 32].clone(), limit.clone());
        calls.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            let req = try_request(vec![hold("sku-bench", 1, None)]);
            client.r#try(req).await.expect("try");
        }));
    }
    for c in calls {
        c.await.expect("join");
    }
    let grpc = N as f64 / t.elapsed().as_secs_f64();
    assert_eq!(p.counts("sku-bench").await, (0, 2 * N as i64, 0));
    println!("stock-redis holds/s: in-process {direct:.0}, over gRPC {grpc:.0}");
    p.stop().await;
    pool.close().await;
    use sqlx::migrate::MigrateDatabase;
    let _ = sqlx::Postgres::drop_database(&url).await;
}
