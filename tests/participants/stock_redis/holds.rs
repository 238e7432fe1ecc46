//! Holding in Redis: a storm of Tries holds exactly the capacity, the barrier's disorder cases
//! (Cancel before Try, duplicates, races) hold, and a resize is durable and never below what is
//! taken.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{GetResourceRequest, PutResourcesRequest, ResourceSpec};
use sqlx::PgPool;
use tokio::sync::Semaphore;

use super::{HOUR, durable_units, start};
use crate::common::{branch_request, hold, outcome, try_request};

crate::parallel::parallel_test!(storm_of_1000_tries_on_100_units_holds_exactly_100 => storm_of_1000_tries_on_100_units_holds_exactly_100_on);
async fn storm_of_1000_tries_on_100_units_holds_exactly_100_on(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-flash", 100).await;
    // Concurrent checker: capacity constant, available >= 0, the sum holds, during the storm.
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (stop, mut admin) = (stop.clone(), p.admin.clone());
        tokio::spawn(async move {
            let mut runs = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let s = admin
                    .get_resource(GetResourceRequest {
                        resource: "sku-flash".to_owned(),
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                if s.capacity != 100
                    || s.available < 0
                    || s.capacity != s.available + s.held + s.confirmed
                {
                    return Err(format!("invariant broken: {s:?}"));
                }
                runs += 1;
            }
            Ok::<usize, String>(runs)
        })
    };
    let mut clients = Vec::new();
    for _ in 0..64 {
        clients.push(p.client().await);
    }
    let limit = Arc::new(Semaphore::new(128));
    // Every call spawned before any is sent: they start together.
    let start = Arc::new(tokio::sync::Barrier::new(1000));
    let mut calls = Vec::new();
    for i in 0..1000 {
        let req = try_request(vec![hold("sku-flash", 1, None)]);
        let mut client = clients[i % clients.len()].clone();
        let (limit, start) = (limit.clone(), start.clone());
        calls.push(tokio::spawn(async move {
            start.wait().await;
            let _permit = limit.acquire_owned().await.expect("permit");
            let answer = client.r#try(req.clone()).await.expect("try").into_inner();
            (req, outcome(&answer))
        }));
    }
    let mut held = Vec::new();
    for call in calls {
        let (req, o) = call.await.expect("join");
        if o == Outcome::Held {
            held.push(req);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let runs = checker.await.expect("join").expect("invariant held");
    assert!(runs > 0, "the checker ran during the storm");
    assert_eq!(held.len(), 100, "exactly the capacity is held");
    assert_eq!(p.counts("sku-flash").await, (0, 100, 0));
    // Confirm 40, cancel 60, concurrently.
    let mut calls = Vec::new();
    for (i, req) in held.into_iter().enumerate() {
        let mut client = clients[i % clients.len()].clone();
        calls.push(tokio::spawn(async move {
            if i < 40 {
                client.confirm(branch_request(&req)).await
            } else {
                client.cancel(branch_request(&req)).await
            }
        }));
    }
    for call in calls {
        call.await.expect("join").expect("decide");
    }
    assert_eq!(p.counts("sku-flash").await, (60, 0, 40));
    assert_eq!(durable_units(&pool, "sku-flash").await, 40);
    assert!(
        p.handle
            .reconcile()
            .await
            .expect("reconcile")
            .drift
            .is_empty()
    );
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn barrier_disorder_holds_in_redis(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", 5).await;
    // Cancel before Try: tombstone, late Try is a REJECTED no-op, repeats answer the same.
    let req = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.cancel(&req).await, State::Cancelled);
    let late = p.try_(&req).await;
    assert_eq!(late.0, Outcome::Rejected);
    assert!(!late.1.is_empty());
    assert_eq!(p.try_(&req).await, late);
    assert_eq!(p.confirm(&req).await, State::Cancelled);
    assert_eq!(p.counts("sku-1").await, (5, 0, 0));
    // Confirm after Cancel refused; Cancel after Confirm refused.
    let a = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.try_(&a).await.0, Outcome::Held);
    assert_eq!(p.cancel(&a).await, State::Cancelled);
    assert_eq!(p.confirm(&a).await, State::Cancelled);
    let b = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.try_(&b).await.0, Outcome::Held);
    assert_eq!(p.confirm(&b).await, State::Confirmed);
    assert_eq!(p.cancel(&b).await, State::Confirmed);
    assert_eq!(p.confirm(&b).await, State::Confirmed);
    assert_eq!(p.try_(&b).await.0, Outcome::Held, "first answer");
    assert_eq!(p.counts("sku-1").await, (3, 0, 2));
    // Confirm before Try: HOLD_LOST, the late Try is refused.
    let c = try_request(vec![hold("sku-1", 1, None)]);
    assert_eq!(p.confirm(&c).await, State::HoldLost);
    assert_eq!(p.try_(&c).await.0, Outcome::Rejected);
    // All-or-nothing: a missing second item leaves the first untouched.
    let d = try_request(vec![hold("sku-1", 1, None), hold("sku-zz", 1, None)]);
    let (o, reason) = p.try_(&d).await;
    assert_eq!(o, Outcome::Rejected);
    assert!(reason.contains("sku-zz"), "{reason}");
    assert_eq!(p.counts("sku-1").await, (3, 0, 2));
    // Concurrent duplicate Confirms and Cancels apply once.
    let e = try_request(vec![hold("sku-1", 3, None)]);
    assert_eq!(p.try_(&e).await.0, Outcome::Held);
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut client = p.client().await;
        let br = branch_request(&e);
        calls.push(tokio::spawn(async move {
            if i % 2 == 0 {
                client.cancel(br).await
            } else {
                client.confirm(br).await
            }
        }));
    }
    let mut states = HashSet::new();
    for call in calls {
        states.insert(call.await.expect("join").expect("call").into_inner().state);
    }
    assert_eq!(states.len(), 1, "one decision wins, every call reports it");
    let (a, h, c) = p.counts("sku-1").await;
    assert_eq!(h, 0);
    assert!((a, c) == (3, 2) || (a, c) == (0, 5), "{a} {c}");
    assert_eq!(durable_units(&pool, "sku-1").await, c);
    // Racing Try and Cancel never leave a hold.
    p.put("sku-race", 100).await;
    let mut calls = Vec::new();
    for _ in 0..30 {
        let req = try_request(vec![hold("sku-race", 1, None)]);
        let (mut x, mut y) = (p.client().await, p.client().await);
        let br = branch_request(&req);
        calls.push(tokio::spawn(async move {
            let (t, c) = tokio::join!(x.r#try(req), y.cancel(br));
            t.expect("try");
            c.expect("cancel").into_inner().state
        }));
    }
    for call in calls {
        assert_eq!(call.await.expect("join"), State::Cancelled as i32);
    }
    assert_eq!(p.counts("sku-race").await, (100, 0, 0));
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn resize_is_durable_and_refused_below_what_is_taken(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", 5).await;
    let req = try_request(vec![hold("sku-1", 3, None)]);
    assert_eq!(p.try_(&req).await.0, Outcome::Held);
    let err = p
        .admin
        .put_resources(PutResourcesRequest {
            resources: vec![ResourceSpec {
                resource: "sku-1".to_owned(),
                capacity: 2,
            }],
        })
        .await
        .expect_err("below held");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let cap: i64 =
        sqlx::query_scalar("SELECT capacity FROM stock_redis_item WHERE resource = 'sku-1'")
            .fetch_one(&pool)
            .await
            .expect("capacity");
    assert_eq!(cap, 5, "refusal changed nothing durably");
    p.put("sku-1", 8).await;
    assert_eq!(p.counts("sku-1").await, (5, 3, 0));
    p.stop().await;
}
