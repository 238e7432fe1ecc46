//! When finished branch records expire from Redis (their retention), and how a branch is
//! answered once its record is gone.

use std::time::Duration;

use holdfast::proto::TryRequest;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use super::{durable_units, start_with};
use crate::common::{from_now, hold, try_request};

fn unix_ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000)
}

fn now_ms() -> i64 {
    unix_ms(&from_now(0))
}

/// Asserts that a record's PTTL says it expires at `at` (Unix ms), give or take 2 s.
#[track_caller]
fn assert_expires_at(pttl: i64, at: i64, what: &str) {
    assert!(pttl > 0, "{what}: no expiry (PTTL {pttl})");
    let off = pttl + now_ms() - at;
    assert!(
        off.abs() < 2000,
        "{what}: expires {off} ms off (PTTL {pttl})"
    );
}

/// Every script that finishes a branch record gives it a Redis expiry: a confirmed,
/// cancelled or reclaimed hold and a refused Try at the hold's deadline (`expires_at +
/// orphan_grace`) + retention, a tombstone at orphan_grace + retention from now; a held record
/// has none. Within the retention every late call answers as before. Once a record is gone
/// (deleted here, as its expiry does), a confirmed branch is answered CONFIRMED from the
/// durable record, to Confirm and to Cancel, with no unit moved.
#[sqlx::test(migrations = false)]
async fn finished_records_expire_after_their_retention(pool: PgPool) {
    let grace = Duration::from_secs(5);
    let retention = Duration::from_secs(30);
    let (grace_ms, keep_ms) = (grace.as_millis() as i64, retention.as_millis() as i64);
    let mut p = start_with(&pool, grace, retention).await;
    p.put("sku-1", 6).await;
    let deadline = |req: &TryRequest| unix_ms(req.expires_at.as_ref().expect("expires_at"));
    let request = |quantity, secs| {
        let mut req = try_request(vec![hold("sku-1", quantity, None)]);
        req.expires_at = Some(from_now(secs));
        req
    };

    // Held: no expiry. Confirmed: the hold's deadline + grace + retention.
    let a = request(2, 10);
    assert_eq!(p.try_(&a).await.0, Outcome::Held);
    assert_eq!(p.pttl(&a).await, -1, "a held record never expires");
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    let a_at = deadline(&a) + grace_ms + keep_ms;
    assert_expires_at(p.pttl(&a).await, a_at, "confirmed");
    // Within the retention: repeats and late calls answer as before, nothing moves.
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    assert_eq!(p.cancel(&a).await, State::Confirmed);
    assert_eq!(p.try_(&a).await.0, Outcome::Held, "first answer");
    assert_expires_at(p.pttl(&a).await, a_at, "confirmed, after repeats");

    // Cancelled hold.
    let b = request(1, 20);
    assert_eq!(p.try_(&b).await.0, Outcome::Held);
    assert_eq!(p.cancel(&b).await, State::Cancelled);
    let b_at = deadline(&b) + grace_ms + keep_ms;
    assert_expires_at(p.pttl(&b).await, b_at, "cancelled");
    assert_eq!(p.confirm(&b).await, State::Cancelled);

    // Refused Try (5 wanted, 4 available): the Try's deadline + grace + retention.
    let c = request(5, 10);
    assert_eq!(p.try_(&c).await.0, Outcome::Rejected);
    assert_expires_at(
        p.pttl(&c).await,
        deadline(&c) + grace_ms + keep_ms,
        "rejected",
    );
    assert_eq!(p.cancel(&c).await, State::Cancelled);
    assert_eq!(p.try_(&c).await.0, Outcome::Rejected, "first answer");

    // Tombstones: Cancel or Confirm before any Try.
    let d = request(1, 10);
    assert_eq!(p.cancel(&d).await, State::Cancelled);
    assert_expires_at(
        p.pttl(&d).await,
        now_ms() + grace_ms + keep_ms,
        "cancel tombstone",
    );
    assert_eq!(
        p.try_(&d).await.0,
        Outcome::Rejected,
        "late Try after Cancel"
    );
    let e = request(1, 10);
    assert_eq!(p.confirm(&e).await, State::HoldLost);
    assert_expires_at(
        p.pttl(&e).await,
        now_ms() + grace_ms + keep_ms,
        "confirm tombstone",
    );
    assert_eq!(
        p.try_(&e).await.0,
        Outcome::Rejected,
        "late Try after Confirm"
    );

    // Reclaimed orphan (its expires_at + grace already passed).
    let f = request(1, -10);
    assert_eq!(p.try_(&f).await.0, Outcome::Held);
    assert_eq!(p.pttl(&f).await, -1);
    assert_eq!(p.handle.reconcile().await.expect("reconcile").reclaimed, 1);
    assert_expires_at(
        p.pttl(&f).await,
        deadline(&f) + grace_ms + keep_ms,
        "reclaimed",
    );
    assert_eq!(p.confirm(&f).await, State::HoldLost);
    assert_eq!(p.counts("sku-1").await, (4, 0, 2));

    // After the retention: a confirmed branch answers from the durable record (and its record
    // is back, for another retention); others answer as tombstones do. No unit moves.
    p.expire_now(&a).await;
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    assert_expires_at(p.pttl(&a).await, now_ms() + keep_ms, "restored");
    p.expire_now(&a).await;
    assert_eq!(p.cancel(&a).await, State::Confirmed, "Cancel after Confirm");
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    p.expire_now(&b).await;
    assert_eq!(p.confirm(&b).await, State::HoldLost);
    assert_eq!(p.cancel(&b).await, State::Cancelled);
    assert_eq!(p.counts("sku-1").await, (4, 0, 2));
    assert_eq!(durable_units(&pool, "sku-1").await, 2);
    p.stop().await;
}
