//! PostgreSQL's group commit when a batch's commit acknowledgement is lost (#15 item 11): the
//! batch committed, the connection failed before its answer, and each call reran alone. The
//! reruns must find what the batch wrote: branch reports counted once, a Reserve answered as
//! the new reservation it is (so its holds get placed), not as an existing one.
//!
//! A batch forms only while another call of its kind is in flight: a first call is held on a
//! lock (a row lock, a holder's advisory lock) taken on a direct connection, and two more are
//! made meanwhile - they queue and run as one batch, through [`AckDropper`].

use std::time::Duration;

use holdfast::domain::{BranchState, Rejection, State};
use holdfast::store::{BranchReport, Created, PgStore};
use sqlx::PgPool;

use super::{LONG, NO_LIMITS, SLOW, confirm, decide, held, lease, new_res};
use crate::ack_relay::AckDropper;

/// The PostgreSQL store through the relay, and the relay.
pub(crate) async fn relayed(pool: &PgPool) -> (super::S, AckDropper) {
    PgStore::from_pool(pool.clone()).migrate().await.unwrap();
    let (relay, relayed) = AckDropper::start(&pool.connect_options(), 8).await;
    (std::sync::Arc::new(PgStore::from_pool(relayed)), relay)
}

/// Waits until a statement of this database waits for a lock.
pub(crate) async fn someone_waits_for_a_lock(pool: &PgPool) {
    waiting_for_locks(pool, 1).await;
}

/// Waits until `n` statements of this database wait for a lock.
pub(crate) async fn waiting_for_locks(pool: &PgPool, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} of {n} wait"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn failed(r: &holdfast::domain::Reservation, error: &str) -> Vec<BranchReport> {
    r.participant_branches()
        .into_iter()
        .map(|b| BranchReport {
            branch_id: b.branch_id,
            state: b.state,
            error: Some(error.to_owned()),
        })
        .collect()
}

pub(crate) fn confirmed(r: &holdfast::domain::Reservation) -> Vec<BranchReport> {
    r.participant_branches()
        .into_iter()
        .map(|b| BranchReport {
            branch_id: b.branch_id,
            state: BranchState::Confirmed,
            error: None,
        })
        .collect()
}

pub async fn record_phase_counts_a_batch_once(pool: PgPool) {
    let (store, relay) = relayed(&pool).await;
    let mut confirming = Vec::new();
    for holder in ["first", "retried", "finished"] {
        let (r, token) = held(&store, holder, "r1", LONG).await;
        let (_, r, _) = decide(&store, r.id, &token, &confirm()).await;
        assert_eq!(r.state, State::Confirming);
        confirming.push(r);
    }
    let (first, retried, finished) = (&confirming[0], &confirming[1], &confirming[2]);

    // The first call runs alone and waits for the row lock held here.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE")
        .bind(first.id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let blocked = {
        let store = store.clone();
        let (id, reports) = (first.id, failed(first, "participant down"));
        tokio::spawn(async move {
            store
                .record_phase(id, State::Confirming, &reports, None, SLOW)
                .await
        })
    };
    someone_waits_for_a_lock(&pool).await;

    // Two more queue and run as one batch, whose commit acknowledgement is lost.
    relay.arm("ack-lost-marker");
    let (retried_reports, finished_reports) =
        (failed(retried, "ack-lost-marker"), confirmed(finished));
    let (a, b) = tokio::join!(
        store.record_phase(retried.id, State::Confirming, &retried_reports, None, SLOW),
        store.record_phase(
            finished.id,
            State::Confirming,
            &finished_reports,
            Some(State::Confirmed),
            SLOW,
        ),
    );
    lock.commit().await.unwrap();
    blocked.await.unwrap().unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(relay.cuts(), 1, "the batch's acknowledgement was dropped");

    // Counted once: the rerun found the batch's write.
    for id in [first.id, retried.id, finished.id] {
        let (attempts, recovery): (Vec<i32>, i32) = sqlx::query_as(
            "SELECT array_agg(b.attempts), min(r.recovery_attempts) FROM reservations r \
             JOIN branches b ON b.reservation_id = r.id WHERE r.id = $1 \
             AND b.state IN ('HELD', 'CONFIRMED')",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            attempts.iter().all(|&n| n == 2),
            "{id}: attempts {attempts:?}"
        );
        let expected = if id == finished.id { 0 } else { 1 };
        assert_eq!(recovery, expected, "{id}: recovery attempts");
    }
    assert!(!a.finished);
    assert_eq!(a.reservation.state, State::Confirming);
    assert!(
        b.finished,
        "the batch finished it: the answer says so, as without the fault"
    );
    assert_eq!(b.reservation.state, State::Confirmed);
}

pub async fn create_after_a_lost_ack_answers_the_new_reservation(pool: PgPool) {
    let (store, relay) = relayed(&pool).await;
    // The first Reserve runs alone and waits for its holder's lock, held here.
    let first = new_res("first", "r1", LONG);
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(first.limit_key())
        .execute(&mut *lock)
        .await
        .unwrap();
    let blocked = {
        let store = store.clone();
        tokio::spawn(async move { store.create(&first, lease(), NO_LIMITS).await })
    };
    someone_waits_for_a_lock(&pool).await;

    // Two more (other holders) queue and share a transaction, whose COMMIT's answer is lost.
    relay.arm("ack-lost-request");
    let lost = new_res("bob", "ack-lost-request", LONG);
    let other = new_res("carol", "r1", LONG);
    let (a, b) = tokio::join!(
        store.create(&lost, lease(), NO_LIMITS),
        store.create(&other, lease(), NO_LIMITS),
    );
    lock.commit().await.unwrap();
    assert!(matches!(blocked.await.unwrap().unwrap(), Created::New(_)));
    assert_eq!(relay.cuts(), 1, "the batch's acknowledgement was dropped");
    for (new, created) in [(&lost, a.unwrap()), (&other, b.unwrap())] {
        match created {
            Created::New(r) => {
                assert_eq!(r.id, new.id);
                assert_eq!(r.state, State::Trying);
            }
            other => panic!(
                "{}: a Reserve whose commit was not acknowledged must answer the reservation it \
                 recorded as new (its holds are yet to be placed), got {other:?}",
                new.request_id
            ),
        }
    }
    // And a true repeat is still a repeat.
    let again = new_res("bob", "ack-lost-request", LONG);
    assert!(matches!(
        store.create(&again, lease(), NO_LIMITS).await.unwrap(),
        Created::Existing(r) if r.id == lost.id
    ));
}

/// `record_rejected` batches too: a batch whose COMMIT's answer is lost is rerun call by call;
/// each rerun finds its reservation moved on and only reads it. The answers are what the batch
/// wrote, and each refused branch's attempt is counted once.
pub async fn record_rejected_after_a_lost_ack_is_applied_once(pool: PgPool) {
    let (store, relay) = relayed(&pool).await;
    let mut trying = Vec::new();
    for holder in ["first", "lost", "other"] {
        let (r, _) = super::create(&store, holder, "r1", LONG).await;
        trying.push(r);
    }
    let refused = |r: &holdfast::domain::Reservation, reason: &str| {
        let first = r.participant_branches()[0].branch_id;
        (
            Rejection {
                participant: "seats".into(),
                resource: "A1".into(),
                reason: reason.into(),
            },
            vec![BranchReport {
                branch_id: first,
                state: BranchState::Rejected,
                error: None,
            }],
        )
    };

    // The first call runs alone and waits for the row lock held here.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE")
        .bind(trying[0].id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let blocked = {
        let store = store.clone();
        let id = trying[0].id;
        let (rejection, reports) = refused(&trying[0], "sold out");
        tokio::spawn(async move { store.record_rejected(id, Some(&rejection), &reports).await })
    };
    someone_waits_for_a_lock(&pool).await;

    // Two more queue and run as one batch, whose commit acknowledgement is lost.
    relay.arm("ack-lost-marker");
    let (lost_rejection, lost_reports) = refused(&trying[1], "ack-lost-marker");
    let (other_rejection, other_reports) = refused(&trying[2], "sold out");
    let (a, b) = tokio::join!(
        store.record_rejected(trying[1].id, Some(&lost_rejection), &lost_reports),
        store.record_rejected(trying[2].id, Some(&other_rejection), &other_reports),
    );
    lock.commit().await.unwrap();
    let first = blocked.await.unwrap().unwrap();
    assert_eq!(relay.cuts(), 1, "the batch's acknowledgement was dropped");
    for (r, answer, rejection) in [
        (&trying[1], a.unwrap(), &lost_rejection),
        (&trying[2], b.unwrap(), &other_rejection),
        (&trying[0], first, &refused(&trying[0], "sold out").0),
    ] {
        assert_eq!(answer.state, State::Rejected, "{}", r.holder);
        assert_eq!(answer.version, r.version + 1, "{}", r.holder);
        assert_eq!(answer.rejection.as_ref(), Some(rejection));
        let attempts: Vec<i32> = sqlx::query_scalar(
            "SELECT attempts FROM branches WHERE reservation_id = $1 AND state = 'REJECTED'",
        )
        .bind(r.id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(
            !attempts.is_empty() && attempts.iter().all(|&n| n == 1),
            "{}: counted once, got {attempts:?}",
            r.holder
        );
    }
}
