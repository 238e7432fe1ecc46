//! The retry policy of unfinished work (SPEC 2: exponential backoff with jitter, a cap on the
//! interval, no attempt limit), as each database computes it in the statement that records a
//! failed attempt: the n-th retry is due `min(cap, base * 2^n) * U[0.5, 1)` after the write,
//! by the database clock. Read back from the row (`next_attempt_at`, `recovery_attempts`),
//! which the `Store` trait does not expose, so these run per backend rather than as a
//! conformance case.

use holdfast::domain::policy::Backoff;
use sqlx::{PgPool, SqlitePool};

use super::*;

const POLICY: Backoff = Backoff {
    base: Duration::from_secs(8),
    cap: Duration::from_secs(40),
};

/// Reads the row the way only a test may.
enum Raw {
    Pg(PgPool),
    Lite(SqlitePool),
}

impl Raw {
    /// (recovery_attempts, seconds from now until next_attempt_at), both by the database.
    async fn due_in(&self, id: Uuid) -> (i64, f64) {
        match self {
            Raw::Pg(pool) => sqlx::query_as(
                "SELECT recovery_attempts::bigint, \
                        EXTRACT(EPOCH FROM next_attempt_at - clock_timestamp())::float8 \
                 FROM reservations WHERE id = $1",
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap(),
            Raw::Lite(pool) => sqlx::query_as(
                "SELECT recovery_attempts, \
                        (next_attempt_at - CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER)) \
                        / 1000000.0 \
                 FROM reservations WHERE id = ?1",
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap(),
        }
    }
}

/// A reservation being released whose release keeps failing.
async fn cancelling(store: &S, request_id: &str) -> Uuid {
    let (r, token) = held(store, "alice", request_id, LONG).await;
    decide(store, r.id, &token, &cancel()).await;
    r.id
}

async fn failed_attempt(store: &S, id: Uuid) {
    let phase = store
        .record_phase(id, State::Cancelling, &[], None, POLICY)
        .await
        .unwrap();
    assert!(!phase.finished);
}

async fn grows_jitters_and_caps(store: S, raw: Raw) {
    // Growth, then the cap: one reservation failing again and again. Each delay lies in
    // [full / 2, full] (a little less: the statement ran a moment before the read).
    let id = cancelling(&store, "req-0").await;
    for n in 0..6u32 {
        failed_attempt(&store, id).await;
        let (attempts, due_in) = raw.due_in(id).await;
        assert_eq!(attempts, i64::from(n) + 1);
        let full = POLICY.cap.min(POLICY.base * 2u32.pow(n)).as_secs_f64();
        assert!(
            due_in > full / 2.0 - 0.5 && due_in <= full,
            "retry {n}: due in {due_in:.3} s, expected within [{}, {full}] s",
            full / 2.0
        );
    }
    // Jitter: the first retries of reservations failing together spread out over [4, 8) s.
    let mut first = Vec::new();
    for i in 1..=16 {
        let id = cancelling(&store, &format!("req-{i}")).await;
        failed_attempt(&store, id).await;
        first.push(raw.due_in(id).await.1);
    }
    let (min, max) = first
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), d| (lo.min(*d), hi.max(*d)));
    assert!(
        max - min > 1.0,
        "16 first retries not spread by jitter: {first:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn postgres(pool: PgPool) {
    grows_jitters_and_caps(crate::postgres(pool.clone()).await, Raw::Pg(pool)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = crate::TempDb::fresh();
    let store: S = Arc::new(db.store().await);
    let raw = SqlitePool::connect(&db.url).await.unwrap();
    grows_jitters_and_caps(store, Raw::Lite(raw.clone())).await;
    raw.close().await;
}
