//! PostgreSQL's group commit when a batch fails as a whole: each of its calls reruns alone,
//! all at once, each in a task of its own. One after another, a database that is slow or down
//! for every call would hold the batch's last caller (and every call queued behind the batch)
//! for the sum of their timeouts.
//!
//! A batch forms while a first call waits on a row lock taken here; a trigger refuses every
//! multi-row UPDATE of `reservations` (the batch) and makes each one-row UPDATE (a call alone)
//! take a second.

use std::time::{Duration, Instant};

use holdfast::domain::State;
use holdfast::store::{PhaseRecorded, StoreError};
use sqlx::PgPool;

use super::lost_ack::confirmed;
use super::{LONG, SLOW, confirm, decide, held};

/// Calls in the batch.
const QUEUED: usize = 8;

/// How long each call alone takes under the test's trigger.
const ALONE: Duration = Duration::from_secs(1);

/// `r`'s fan-out recorded `CONFIRMED`, in a task.
fn finish(
    store: &super::S,
    r: &holdfast::domain::Reservation,
) -> tokio::task::JoinHandle<Result<PhaseRecorded, StoreError>> {
    let (store, id, reports) = (store.clone(), r.id, confirmed(r));
    tokio::spawn(async move {
        store
            .record_phase(
                id,
                State::Confirming,
                &reports,
                Some(State::Confirmed),
                SLOW,
            )
            .await
    })
}

pub async fn a_failed_batch_reruns_its_calls_at_once(pool: PgPool) {
    let store = crate::postgres(pool.clone()).await;
    let mut confirming = Vec::new();
    for i in 0..=QUEUED {
        let (r, token) = held(&store, &format!("h{i}"), "r1", LONG).await;
        let (_, r, _) = decide(&store, r.id, &token, &confirm()).await;
        assert_eq!(r.state, State::Confirming);
        confirming.push(r);
    }
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_batches() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF (SELECT count(*) FROM changed) > 1 THEN \
             RAISE EXCEPTION 'this test refuses batches'; \
           END IF; \
           PERFORM pg_sleep(1); \
           RETURN NULL; \
         END $$; \
         CREATE TRIGGER refuse_batches AFTER UPDATE ON reservations \
           REFERENCING NEW TABLE AS changed FOR EACH STATEMENT \
           EXECUTE FUNCTION refuse_batches();",
    )
    .execute(&pool)
    .await
    .unwrap();

    // The first call runs alone and waits for the row lock held here.
    let first = &confirming[0];
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE")
        .bind(first.id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let blocked = finish(&store, first);
    super::lost_ack::someone_waits_for_a_lock(&pool).await;

    // The rest queue and run as one batch, which fails; then each alone.
    let started = Instant::now();
    let calls: Vec<_> = confirming[1..].iter().map(|r| finish(&store, r)).collect();
    for call in calls {
        let recorded = call.await.unwrap().unwrap();
        assert!(recorded.finished);
        assert_eq!(recorded.reservation.state, State::Confirmed);
    }
    let took = started.elapsed();
    lock.commit().await.unwrap();
    assert!(blocked.await.unwrap().unwrap().finished);
    // At once: about one call's time (twice with a busy pool); one after another: QUEUED.
    assert!(
        took < ALONE * (QUEUED as u32) / 2,
        "{QUEUED} calls of a failed batch took {took:?}: rerun one after another, {ALONE:?} each"
    );
}
