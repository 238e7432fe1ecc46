//! Retention at a participant (SPEC 8.3), on PostgreSQL and SQLite: finished branches'
//! barrier rows past `expires_at + orphan_grace` and past the retention go, with the business
//! rows of released holds (stock's cancelled `stock_hold` rows); a confirmed branch's hold row
//! (the sale) stays, a held branch stays, a recent tombstone stays and still refuses its late
//! Try, and a late Cancel of a deleted cancelled branch changes nothing. "Old" is made by
//! moving the barrier row's times a day back in SQL; the purge is the SDK's own, counted in
//! `holdfast_retention_deleted_total{table}`, and the participant's calls show on a /metrics
//! served on loopback.

use std::time::Duration;

use holdfast::participant::{ParticipantService, Purged};
use holdfast::participants::Kind;
use holdfast::participants::stock::Stock;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

const KEEP: Duration = Duration::from_secs(3600);

/// Moves a branch's barrier row (its last change, deadline and reclaim time) a day back.
async fn backdate(db: &Db, branch_id: &str) {
    let sql = match db {
        Db::Postgres(_) => {
            "UPDATE tcc_barrier SET updated_at = updated_at - interval '1 day', \
             expires_at = expires_at - interval '1 day', \
             reclaim_after = reclaim_after - interval '1 day' WHERE branch_id = $1"
        }
        Db::Sqlite(_) => {
            "UPDATE tcc_barrier SET updated_at = updated_at - 86400000000, \
             expires_at = expires_at - 86400000000, \
             reclaim_after = reclaim_after - 86400000000 WHERE branch_id = $1"
        }
    };
    assert_eq!(db.execute(sql, branch_id).await, 1, "{branch_id}");
}

/// Only the last change a day back: the hold's deadline stays ahead.
async fn backdate_change_only(db: &Db, branch_id: &str) {
    let sql = match db {
        Db::Postgres(_) => {
            "UPDATE tcc_barrier SET updated_at = updated_at - interval '1 day' WHERE branch_id = $1"
        }
        Db::Sqlite(_) => {
            "UPDATE tcc_barrier SET updated_at = updated_at - 86400000000 WHERE branch_id = $1"
        }
    };
    assert_eq!(db.execute(sql, branch_id).await, 1, "{branch_id}");
}

async fn purge(db: &Db, limit: u32) -> Purged {
    match db {
        Db::Postgres(pool) => {
            ParticipantService::<Stock, sqlx::Postgres>::new("stock", Stock, pool.clone())
                .purge_finished(KEEP, limit)
                .await
        }
        Db::Sqlite(pool) => {
            ParticipantService::<Stock, sqlx::Sqlite>::new("stock", Stock, pool.clone())
                .purge_finished(KEEP, limit)
                .await
        }
    }
    .expect("purge")
}

async fn stock_hold_rows(db: &Db, branch_id: &str) -> u64 {
    // A no-op UPDATE counts the rows on either backend through `Db::execute`.
    db.execute(
        "UPDATE stock_hold SET quantity = quantity WHERE branch_id = $1",
        branch_id,
    )
    .await
}

/// The value of one series in a Prometheus text page (0 when absent).
fn series(page: &str, name_and_labels: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut page = String::new();
    s.read_to_string(&mut page).await.expect("read");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    page
}

#[sqlx::test(migrations = false)]
async fn retention_deletes_finished_branches_and_released_rows_only(pool: PgPool) {
    // /metrics on loopback, in process, as `--metrics-listen` serves it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = listener.local_addr().unwrap();
    holdfast::telemetry::metrics_handle();
    tokio::spawn(holdfast::telemetry::serve_metrics(
        holdfast::tls::Listener::new(listener, None),
        holdfast::auth::Authenticator::Off,
        std::future::pending(),
    ));
    let deleted = |page: &str, table: &str| {
        series(
            page,
            &format!("holdfast_retention_deleted_total{{table=\"{table}\"}}"),
        )
    };

    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Stock, &db).await;
        p.put("sku-1", 100).await;
        let one = || try_request(vec![hold("sku-1", 1, None)]);
        let held = |r: &holdfast::proto::TryResponse| assert_eq!(outcome(r), Outcome::Held);
        // Cancelled and old: barrier row and cancelled hold row go.
        let cancelled = one();
        held(&p.try_(cancelled.clone()).await);
        assert_eq!(p.cancel(&cancelled).await, State::Cancelled);
        // Confirmed and old: the barrier row goes, the sale's hold row stays.
        let confirmed = one();
        held(&p.try_(confirmed.clone()).await);
        assert_eq!(p.confirm(&confirmed).await, State::Confirmed);
        // A Cancel before its Try, old: the tombstone goes.
        let old_tombstone = one();
        assert_eq!(p.cancel(&old_tombstone).await, State::Cancelled);
        // A recent tombstone stays, and still refuses its late Try.
        let tombstone = one();
        assert_eq!(p.cancel(&tombstone).await, State::Cancelled);
        // Cancelled long ago but its hold's deadline (+ grace) is still ahead: stays.
        let deadline_ahead = one();
        held(&p.try_(deadline_ahead.clone()).await);
        assert_eq!(p.cancel(&deadline_ahead).await, State::Cancelled);
        // Held, old: not finished, stays (orphan reclaim's, not retention's).
        let holding = one();
        held(&p.try_(holding.clone()).await);
        for b in [&cancelled, &confirmed, &old_tombstone, &holding] {
            backdate(&db, &b.branch_id).await;
        }
        backdate_change_only(&db, &deadline_ahead.branch_id).await;
        let before = counts(&mut p, "sku-1").await;
        let page = scrape(metrics_addr).await;

        let purged = purge(&db, 1000).await;
        assert_eq!(
            purged,
            Purged {
                barrier: 3,
                business: 1
            },
            "{}",
            db.name()
        );
        for b in [&cancelled, &confirmed, &old_tombstone] {
            assert_eq!(db.barrier_rows(&b.branch_id).await, 0, "{}", db.name());
        }
        for b in [&tombstone, &deadline_ahead, &holding] {
            assert_eq!(db.barrier_rows(&b.branch_id).await, 1, "{}", db.name());
        }
        assert_eq!(stock_hold_rows(&db, &cancelled.branch_id).await, 0);
        assert_eq!(
            stock_hold_rows(&db, &confirmed.branch_id).await,
            1,
            "the sale stays"
        );
        assert_eq!(counts(&mut p, "sku-1").await, before, "{}", db.name());
        let after = scrape(metrics_addr).await;
        assert_eq!(
            deleted(&after, "tcc_barrier") - deleted(&page, "tcc_barrier"),
            3.0
        );
        assert_eq!(
            deleted(&after, "stock_hold") - deleted(&page, "stock_hold"),
            1.0
        );

        // The kept tombstone refuses its late Try; nothing is held.
        assert_eq!(outcome(&p.try_(tombstone.clone()).await), Outcome::Rejected);
        // A late Cancel of a deleted, cancelled branch answers cancelled and moves nothing.
        assert_eq!(p.cancel(&cancelled).await, State::Cancelled);
        assert_eq!(counts(&mut p, "sku-1").await, before, "{}", db.name());
        // Nothing else is due.
        assert_eq!(purge(&db, 1000).await, Purged::default());

        // The participant's own calls are on the page, by method and outcome, and the
        // barrier's answers from its rows.
        for name in [
            "holdfast_participant_calls_total{participant=\"stock\",method=\"try\",outcome=\"held\"}",
            "holdfast_participant_calls_total{participant=\"stock\",method=\"cancel\",outcome=\"cancelled\"}",
            "holdfast_participant_barrier_total{participant=\"stock\",outcome=\"tombstone\"}",
        ] {
            assert!(series(&after, name) >= 1.0, "{name} missing:\n{after}");
        }
        assert!(after.contains("holdfast_participant_call_seconds_bucket{"));
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn retention_batches_are_bounded(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Stock, &db).await;
        p.put("sku-1", 100).await;
        for _ in 0..5 {
            let b = try_request(vec![hold("sku-1", 1, None)]);
            assert_eq!(p.cancel(&b).await, State::Cancelled);
            backdate_change_only(&db, &b.branch_id).await;
        }
        let sizes = [
            purge(&db, 2).await.barrier,
            purge(&db, 2).await.barrier,
            purge(&db, 2).await.barrier,
            purge(&db, 2).await.barrier,
        ];
        assert_eq!(sizes, [2, 2, 1, 0], "{}", db.name());
        p.stop().await;
    }
}
