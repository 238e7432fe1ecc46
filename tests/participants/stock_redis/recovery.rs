//! The reconciler: an abandoned hold is reclaimed exactly once after its grace, and Redis data
//! lost mid-sale is rebuilt from the durable record without overselling.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use holdfast::proto::TryRequest;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;
use tokio::sync::Semaphore;

use super::{HOUR, durable_units, start};
use crate::common::{branch_request, from_now, hold, outcome, try_request};

#[sqlx::test(migrations = false)]
async fn abandoned_hold_is_reclaimed_exactly_once_after_grace(pool: PgPool) {
    // Generous: the checks inside the grace must fit in it on a loaded machine. Waits are
    // to instants computed from the hold's own expires_at, not fixed sleeps after each step.
    let grace = Duration::from_secs(3);
    let mut p = start(&pool, grace).await;
    p.put("sku-1", 10).await;
    let mut abandoned = try_request(vec![hold("sku-1", 3, None)]);
    let expires_at = from_now(1);
    abandoned.expires_at = Some(expires_at);
    let expires_at = SystemTime::try_from(expires_at).expect("a SystemTime");
    assert_eq!(p.try_(&abandoned).await.0, Outcome::Held);
    let kept = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.try_(&kept).await.0, Outcome::Held);
    // Before expires_at + grace nothing is released.
    assert_eq!(p.handle.reconcile().await.expect("reconcile").reclaimed, 0);
    sleep_until(expires_at + Duration::from_millis(200)).await;
    assert_eq!(
        p.handle.reconcile().await.expect("reconcile").reclaimed,
        0,
        "past expires_at but within the grace"
    );
    assert_eq!(p.counts("sku-1").await, (5, 5, 0));
    assert!(
        SystemTime::now() < expires_at + grace,
        "the checks within the grace took past its end: the machine is too slow for this test"
    );
    sleep_until(expires_at + grace + Duration::from_millis(200)).await;
    let (a, b) = tokio::join!(p.handle.reconcile(), p.handle.reconcile());
    let total = a.expect("reconcile a").reclaimed + b.expect("reconcile b").reclaimed;
    assert_eq!(total, 1, "returned exactly once");
    assert_eq!(p.handle.reconcile().await.expect("again").reclaimed, 0);
    assert_eq!(p.counts("sku-1").await, (8, 2, 0));
    assert_eq!(p.confirm(&abandoned).await, State::HoldLost);
    assert_eq!(p.confirm(&abandoned).await, State::HoldLost);
    assert_eq!(p.cancel(&abandoned).await, State::Cancelled);
    assert_eq!(
        p.try_(&abandoned).await.0,
        Outcome::Held,
        "first answer, no effect"
    );
    assert_eq!(p.counts("sku-1").await, (8, 2, 0));
    assert_eq!(p.confirm(&kept).await, State::Confirmed);
    assert_eq!(p.counts("sku-1").await, (8, 0, 2));
    p.stop().await;
}

/// Sleeps until the host clock reads `at` (at once if it already does).
async fn sleep_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}

#[sqlx::test(migrations = false)]
async fn redis_data_lost_mid_sale_is_rebuilt_without_oversell(pool: PgPool) {
    const CAP: i64 = 60;
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", CAP).await;
    // A sale in flight: buyers Try then Confirm, while the data set is deleted under them.
    let confirmed = Arc::new(std::sync::Mutex::new(Vec::<TryRequest>::new()));
    let limit = Arc::new(Semaphore::new(16));
    let mut buyers = Vec::new();
    for i in 0..150 {
        let mut client = p.client().await;
        let (limit, confirmed) = (limit.clone(), confirmed.clone());
        buyers.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            tokio::time::sleep(Duration::from_millis(2 * i)).await;
            let req = try_request(vec![hold("sku-1", 1, None)]);
            // UNAVAILABLE while the data set is rebuilt: this buyer gives up.
            let answer = match client.r#try(req.clone()).await {
                Ok(answer) => answer.into_inner(),
                Err(s) if s.code() == tonic::Code::Unavailable => return,
                Err(s) => panic!("try: {s}"),
            };
            if outcome(&answer) != Outcome::Held {
                return;
            }
            // The coordinator retries Confirm until it gets an answer (here: for a minute).
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                match client.confirm(branch_request(&req)).await {
                    Ok(r) => {
                        if r.into_inner().state == State::Confirmed as i32 {
                            confirmed.lock().expect("lock").push(req);
                        }
                        return;
                    }
                    Err(s) if s.code() == tonic::Code::Unavailable => {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "Confirm still UNAVAILABLE after 60 s: {s:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(s) => panic!("confirm: {s}"),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(p.delete_redis_data().await > 0);
    // Until rebuilt, a Try answers UNAVAILABLE and records nothing; the woken reconciler may
    // already have rebuilt (then it holds or finds the stock sold out).
    let probe = try_request(vec![hold("sku-1", 1, None)]);
    let o = match p.participant.r#try(probe.clone()).await {
        Ok(answer) => {
            let answer = answer.into_inner();
            let o = outcome(&answer);
            assert!(
                o == Outcome::Held || answer.reason.starts_with("insufficient"),
                "{answer:?}"
            );
            o
        }
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
            Outcome::Rejected
        }
    };
    let _ = p.handle.reconcile().await.expect("reconcile");
    for b in buyers {
        b.await.expect("buyer");
    }
    if o == Outcome::Held {
        assert_eq!(p.cancel(&probe).await, State::Cancelled);
    }
    let report = p.handle.reconcile().await.expect("reconcile");
    assert!(report.drift.is_empty(), "{:?}", report.drift);
    let confirmed = confirmed.lock().expect("lock").clone();
    let durable = durable_units(&pool, "sku-1").await;
    // Every CONFIRMED answer is durable, and Redis agrees with the durable record.
    assert_eq!(durable, confirmed.len() as i64);
    let (a, h, c) = p.counts("sku-1").await;
    assert_eq!(c, durable);
    assert!(a >= 0 && a + h + c == CAP);
    for req in &confirmed {
        assert_eq!(
            p.confirm(req).await,
            State::Confirmed,
            "repeat after rebuild"
        );
        assert_eq!(
            p.cancel(req).await,
            State::Confirmed,
            "cancel after confirm"
        );
        assert_eq!(p.try_(req).await.0, Outcome::Held, "first answer");
    }
    assert_eq!(p.counts("sku-1").await, (a, h, c));
    // Sell out what is left: never more than the capacity in total.
    let mut sold = 0;
    for _ in 0..(CAP + 20) {
        let req = try_request(vec![hold("sku-1", 1, None)]);
        if p.try_(&req).await.0 == Outcome::Held {
            assert_eq!(p.confirm(&req).await, State::Confirmed);
            sold += 1;
        }
    }
    assert_eq!(sold, a);
    assert_eq!(durable_units(&pool, "sku-1").await + h, CAP);
    assert_eq!(p.counts("sku-1").await, (0, h, CAP - h));
    p.stop().await;
}
