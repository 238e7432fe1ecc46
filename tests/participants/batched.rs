//! A barrier-only participant's concurrent writes share statements on PostgreSQL (the SDK's
//! `barrier_only.rs`): many clients at once, every answer checked against the row it left.
//! Rows written by one statement carry one transaction id (`xmin`), which shows the batches.
//!
//! A call runs alone when no other of its kind is in flight, so each test first holds one call
//! up inside PostgreSQL (its row locked by the test) and only then sends the rest: they must
//! queue behind it, whatever the scheduling.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::participant_client::ParticipantClient;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{BranchRequest, TryRequest};
use sqlx::{PgPool, Postgres, Transaction};
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

/// Holds up `req`'s first Try: an uncommitted row for its branch, which the Try's insert
/// waits for until the returned transaction ends.
async fn hold_up_try(pool: &PgPool, req: &TryRequest) -> Transaction<'static, Postgres> {
    let mut blocker = pool.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state) \
         VALUES ('noop', $1, $2, 'trying')",
    )
    .bind(&req.reservation_id)
    .bind(&req.branch_id)
    .execute(&mut *blocker)
    .await
    .expect("the held-up branch's row");
    blocker
}

/// Holds up a Confirm or Cancel of `req`'s branch: its row locked until the returned
/// transaction ends.
async fn hold_up_branch(pool: &PgPool, req: &TryRequest) -> Transaction<'static, Postgres> {
    let mut blocker = pool.begin().await.expect("begin");
    sqlx::query(
        "SELECT 1 FROM tcc_barrier WHERE participant = 'noop' \
         AND reservation_id = $1 AND branch_id = $2 FOR UPDATE",
    )
    .bind(&req.reservation_id)
    .bind(&req.branch_id)
    .execute(&mut *blocker)
    .await
    .expect("lock the held-up branch's row");
    blocker
}

/// Until a barrier statement of the participant waits for a lock (the held-up call).
async fn until_held_up(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' \
             AND (query LIKE 'INSERT INTO tcc_barrier%' OR query LIKE 'UPDATE tcc_barrier%')",
        )
        .fetch_one(pool)
        .await
        .expect("pg_stat_activity");
        if waiting >= 1 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held-up call never waited for its row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `req`'s Try on a client of its own, in a task.
async fn spawn_try(
    p: &Running,
    req: &TryRequest,
) -> tokio::task::JoinHandle<Result<Outcome, tonic::Status>> {
    let (mut client, req) = (p.new_client().await, req.clone());
    tokio::spawn(async move { client.r#try(req).await.map(|a| outcome(&a.into_inner())) })
}

/// Holds `first`'s Try up inside PostgreSQL, then sends `sent` at once (they queue behind
/// it), and lets it go: every Try must answer held.
async fn all_held_behind_a_held_up_try(
    p: &Running,
    pool: &PgPool,
    first: &TryRequest,
    sent: Vec<TryRequest>,
) {
    let blocker = hold_up_try(pool, first).await;
    let first = spawn_try(p, first).await;
    until_held_up(pool).await;
    let answers = at_once(p, sent, |mut client, req| async move {
        client.r#try(req).await.map(|a| outcome(&a.into_inner()))
    })
    .await;
    blocker.rollback().await.expect("rollback");
    assert_eq!(first.await.expect("join").ok(), Some(Outcome::Held));
    for answer in &answers {
        assert_eq!(answer.as_ref().ok(), Some(&Outcome::Held), "{answers:?}");
    }
}

/// Sends a Confirm of `req`'s branch on a client of its own, in a task.
async fn spawn_confirm(
    p: &Running,
    req: &TryRequest,
) -> tokio::task::JoinHandle<Result<State, tonic::Status>> {
    let (mut client, req) = (p.new_client().await, branch_request(req));
    tokio::spawn(async move {
        client
            .confirm(req)
            .await
            .map(|a| state(a.into_inner().state))
    })
}

fn state(state: i32) -> State {
    State::try_from(state).expect("state")
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

async fn rows_in(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tcc_barrier WHERE participant = 'noop' AND state = $1")
        .bind(state)
        .fetch_one(pool)
        .await
        .expect("count rows")
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

fn new_branches() -> Vec<TryRequest> {
    (0..BRANCHES)
        .map(|_| try_request(vec![hold("x", 1, None)]))
        .collect()
}

/// The participant started and migrated (its first answered call), with nothing written.
async fn noop(pool: &PgPool) -> Running {
    let mut p = spawn_participant(Kind::Noop, pool.clone()).await;
    counts(&mut p, "x").await;
    p
}

crate::parallel::parallel_test!(concurrent_first_tries_share_statements_and_each_is_held_once => concurrent_first_tries_on);
async fn concurrent_first_tries_on(pool: PgPool) {
    let p = noop(&pool).await;
    let requests = new_branches();
    // Each other branch twice at once: a repeat inside a batch answers what the first did.
    let sent: Vec<TryRequest> = requests[1..]
        .iter()
        .chain(&requests[1..])
        .cloned()
        .collect();
    all_held_behind_a_held_up_try(&p, &pool, &requests[0], sent).await;
    assert_eq!(
        rows_in(&pool, "held").await,
        BRANCHES as i64,
        "one held row per branch"
    );
    let writers = writers(&pool, "held").await;
    assert!(
        writers < BRANCHES as i64 - 1,
        "{BRANCHES} first Tries, {} of them queued, were written by {writers} transactions",
        BRANCHES - 1
    );
    p.stop().await;
}

crate::parallel::parallel_test!(concurrent_confirms_and_cancels_share_statements_and_agree_with_the_rows => confirms_and_cancels_on);
async fn confirms_and_cancels_on(pool: PgPool) {
    let mut p = noop(&pool).await;
    let requests = new_branches();
    for req in &requests {
        assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
    }
    let blocker = hold_up_branch(&pool, &requests[0]).await;
    let first = spawn_confirm(&p, &requests[0]).await;
    until_held_up(&pool).await;
    // Every other branch is confirmed twice; every second one is also cancelled, all at
    // once: the row decides which won, and every answer must agree with it.
    let mut calls: Vec<(usize, bool)> =
        (1..BRANCHES).flat_map(|i| [(i, true), (i, true)]).collect();
    calls.extend((1..BRANCHES).step_by(2).map(|i| (i, false)));
    let sent: Vec<(usize, bool, BranchRequest)> = calls
        .iter()
        .map(|&(i, confirm)| (i, confirm, branch_request(&requests[i])))
        .collect();
    let answers = at_once(&p, sent, |mut client, (i, confirm, req)| async move {
        let answer = if confirm {
            client.confirm(req).await
        } else {
            client.cancel(req).await
        };
        (
            i,
            state(answer.expect("confirm or cancel").into_inner().state),
        )
    })
    .await;
    blocker.commit().await.expect("commit");
    assert_eq!(first.await.expect("join").ok(), Some(State::Confirmed));
    let mut confirmed = 0;
    for (i, req) in requests.iter().enumerate() {
        let wanted = match state_of(&pool, req).await.as_str() {
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
    // Branch 0 and every even one had no Cancel.
    assert!(
        confirmed >= BRANCHES / 2,
        "only cancelled branches can end cancelled"
    );
    let confirm_writers = writers(&pool, "confirmed").await;
    assert!(
        confirm_writers < confirmed as i64 - 1,
        "{confirmed} branches confirmed, all but one queued, by {confirm_writers} transactions"
    );
    // A repeat later answers the same, and the counts follow the rows.
    assert_eq!(p.confirm(&requests[0]).await, State::Confirmed);
    assert_eq!(
        counts(&mut p, "x").await,
        (0, 0, confirmed as i64),
        "noop counts confirmed branches"
    );
    p.stop().await;
}

crate::parallel::parallel_test!(a_batch_that_fails_runs_each_of_its_calls_alone => failing_batches_on);
async fn failing_batches_on(pool: PgPool) {
    let p = noop(&pool).await;
    // Every statement writing more than one barrier row fails, as a batch can (a deadlock with
    // another replica, a lost connection), while a call alone still works. A sequence counts
    // the refusals: its calls outlive their rollback.
    sqlx::raw_sql(
        "CREATE SEQUENCE refused_batches; \
         CREATE FUNCTION one_row_at_a_time() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF (SELECT count(*) FROM changed) > 1 THEN \
             PERFORM nextval('refused_batches'); \
             RAISE EXCEPTION 'this test refuses batches'; \
           END IF; \
           RETURN NULL; \
         END $$; \
         CREATE TRIGGER no_batch_insert AFTER INSERT ON tcc_barrier \
           REFERENCING NEW TABLE AS changed FOR EACH STATEMENT \
           EXECUTE FUNCTION one_row_at_a_time(); \
         CREATE TRIGGER no_batch_update AFTER UPDATE ON tcc_barrier \
           REFERENCING NEW TABLE AS changed FOR EACH STATEMENT \
           EXECUTE FUNCTION one_row_at_a_time();",
    )
    .execute(&pool)
    .await
    .expect("the test's trigger");
    let requests = new_branches();

    all_held_behind_a_held_up_try(&p, &pool, &requests[0], requests[1..].to_vec()).await;
    let refused = refused_batches(&pool).await;
    assert!(refused > 0, "no batch of Tries was tried");

    let blocker = hold_up_branch(&pool, &requests[0]).await;
    let first = spawn_confirm(&p, &requests[0]).await;
    until_held_up(&pool).await;
    let sent: Vec<BranchRequest> = requests[1..].iter().map(branch_request).collect();
    let answers = at_once(&p, sent, |mut client, req| async move {
        client
            .confirm(req)
            .await
            .map(|a| state(a.into_inner().state))
    })
    .await;
    blocker.commit().await.expect("commit");
    assert_eq!(first.await.expect("join").ok(), Some(State::Confirmed));
    for answer in &answers {
        assert_eq!(answer.as_ref().ok(), Some(&State::Confirmed), "{answers:?}");
    }
    assert!(
        refused_batches(&pool).await > refused,
        "no batch of Confirms was tried"
    );
    assert_eq!(rows_in(&pool, "confirmed").await, BRANCHES as i64);
    assert_eq!(
        writers(&pool, "confirmed").await,
        BRANCHES as i64,
        "no batch got through the trigger"
    );
    p.stop().await;
}

/// Batches the test's trigger refused so far.
async fn refused_batches(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM refused_batches")
        .fetch_one(pool)
        .await
        .expect("refused batches")
}
