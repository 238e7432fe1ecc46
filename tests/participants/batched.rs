//! A barrier-only participant's concurrent writes share statements on PostgreSQL (the SDK's
//! `barrier_only.rs`): many clients at once, every answer checked against the row it left.
//! Rows written by one statement carry one transaction id (`xmin`), which shows the batches.

use std::future::Future;
use std::sync::Arc;

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::participant_client::ParticipantClient;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{BranchRequest, TryRequest};
use sqlx::PgPool;
use tonic::transport::Channel;

use crate::common::*;

/// Branches per test; every call is sent by a client (connection) of its own.
const BRANCHES: usize = 64;

/// Runs `call` once per item, each on its own client, all released together.
async fn at_once<T, R, F, Fut>(p: &Running, items: Vec<T>, call: F) -> Vec<R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(ParticipantClient<Channel>, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send,
{
    let mut clients = Vec::with_capacity(items.len());
    for _ in 0..items.len() {
        clients.push(p.new_client().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(items.len()));
    let call = Arc::new(call);
    let tasks: Vec<_> = items
        .into_iter()
        .zip(clients)
        .map(|(item, client)| {
            let (start, call) = (start.clone(), call.clone());
            tokio::spawn(async move {
                start.wait().await;
                call(client, item).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("join"));
    }
    answers
}

/// How many transactions wrote the noop participant's barrier rows in `state`.
async fn writers(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM tcc_barrier \
         WHERE participant = 'noop' AND state = $1",
    )
    .bind(state)
    .fetch_one(pool)
    .await
    .expect("count writers")
}

async fn state_of(pool: &PgPool, req: &TryRequest) -> String {
    sqlx::query_scalar(
        "SELECT state FROM tcc_barrier \
         WHERE participant = 'noop' AND reservation_id = $1 AND branch_id = $2",
    )
    .bind(&req.reservation_id)
    .bind(&req.branch_id)
    .fetch_one(pool)
    .await
    .expect("the branch's row")
}

crate::parallel::parallel_test!(concurrent_first_tries_share_statements_and_each_is_held_once => concurrent_first_tries_on);
async fn concurrent_first_tries_on(pool: PgPool) {
    let p = spawn_participant(Kind::Noop, pool.clone()).await;
    let requests: Vec<TryRequest> = (0..BRANCHES)
        .map(|_| try_request(vec![hold("x", 1, None)]))
        .collect();
    // Each branch twice at once: a repeat inside a batch answers what the first did.
    let sent: Vec<TryRequest> = requests.iter().chain(&requests).cloned().collect();
    let answers = at_once(&p, sent, |mut client, req| async move {
        client.r#try(req).await.expect("try").into_inner()
    })
    .await;
    assert!(
        answers.iter().all(|a| outcome(a) == Outcome::Held),
        "every Try and its repeat answered held: {answers:?}"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tcc_barrier WHERE state = 'held'")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(rows, BRANCHES as i64, "one held row per branch");
    let writers = writers(&pool, "held").await;
    assert!(
        writers < BRANCHES as i64,
        "{BRANCHES} concurrent first Tries were written by {writers} transactions: none shared"
    );
    p.stop().await;
}

crate::parallel::parallel_test!(concurrent_confirms_and_cancels_share_statements_and_agree_with_the_rows => confirms_and_cancels_on);
async fn confirms_and_cancels_on(pool: PgPool) {
    let mut p = spawn_participant(Kind::Noop, pool.clone()).await;
    let requests: Vec<TryRequest> = (0..BRANCHES)
        .map(|_| try_request(vec![hold("x", 1, None)]))
        .collect();
    for req in &requests {
        assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
    }
    // Every branch is confirmed twice; every other one is also cancelled, all at once: the
    // row decides which won, and every answer must agree with it.
    let mut calls: Vec<(usize, bool)> =
        (0..BRANCHES).flat_map(|i| [(i, true), (i, true)]).collect();
    calls.extend((0..BRANCHES).step_by(2).map(|i| (i, false)));
    let sent: Vec<(usize, bool, BranchRequest)> = calls
        .iter()
        .map(|&(i, confirm)| (i, confirm, branch_request(&requests[i])))
        .collect();
    let answers = at_once(&p, sent, |mut client, (i, confirm, req)| async move {
        let state = if confirm {
            client.confirm(req).await
        } else {
            client.cancel(req).await
        };
        let state = state.expect("confirm or cancel").into_inner().state;
        (i, State::try_from(state).expect("state"))
    })
    .await;
    let mut confirmed = 0;
    for (i, req) in requests.iter().enumerate() {
        let stored = state_of(&pool, req).await;
        let wanted = match stored.as_str() {
            "confirmed" => State::Confirmed,
            "cancelled" => State::Cancelled,
            other => panic!("branch {i} left {other}"),
        };
        confirmed += usize::from(wanted == State::Confirmed);
        for (_, answer) in answers.iter().filter(|(j, _)| *j == i) {
            assert_eq!(
                *answer, wanted,
                "branch {i}: an answer disagrees with its row"
            );
        }
    }
    assert!(
        confirmed >= BRANCHES / 2,
        "only cancelled branches can end cancelled"
    );
    let confirm_writers = writers(&pool, "confirmed").await;
    assert!(
        confirm_writers < confirmed as i64,
        "{confirmed} branches confirmed at once by {confirm_writers} transactions: none shared"
    );
    // A repeat later answers the same, and the counts follow the rows.
    assert_eq!(p.confirm(&requests[1]).await, State::Confirmed);
    assert_eq!(
        counts(&mut p, "x").await,
        (0, 0, confirmed as i64),
        "noop counts confirmed branches"
    );
    p.stop().await;
}
