//! In test mode stock-redis reads the deployment's clock, as the SDK's participants do: a
//! Try's `expires_at` is bounded by `--max-hold` from the moved clock, and a move of the clock
//! reclaims at once the holds past `expires_at + orphan_grace` on it (Redis's own clock moved
//! by the same amount).

use std::time::Duration;

use holdfast::participant::ParticipantClock;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use super::{serve_with, settings};
use crate::common::{hold, try_request};

const MINUTE_US: i64 = 60 * 1_000_000;

#[sqlx::test(migrations = false)]
async fn stock_redis_follows_a_moved_test_clock(pool: PgPool) {
    let clock = ParticipantClock::default();
    let mut s = settings();
    s.orphan_grace = Duration::from_secs(60);
    s.clock = clock.clone();
    let mut p = serve_with(&pool, s).await;
    p.put("sku-1", 10).await;

    // 25 hours on: a ten-minute hold from the moved clock is 25 h 10 min after the host's,
    // beyond the default --max-hold (24 h) from it, and within it from the moved clock.
    clock.move_to(25 * 60 * MINUTE_US);
    let mut later = try_request(vec![hold("sku-1", 3, None)]);
    let expires_at = clock.now() + chrono::Duration::minutes(10);
    later.expires_at = Some(prost_types::Timestamp {
        seconds: expires_at.timestamp(),
        nanos: 0,
    });
    assert_eq!(p.try_(&later).await.0, Outcome::Held);
    assert_eq!(p.counts("sku-1").await, (7, 3, 0));

    // Abandoned: 10 minutes to its expires_at and one of grace; a move of 12 minutes puts it
    // past both on the clock, and the move itself reclaims it.
    clock.move_to(clock.offset_us() + 12 * MINUTE_US);
    assert_eq!(clock.reclaim_orphans().await, 1);
    assert_eq!(p.counts("sku-1").await, (10, 0, 0));
    assert_eq!(p.confirm(&later).await, State::HoldLost);
    p.stop().await;
}
