//! Extend at stock-redis: a held record's deadline (and its entry in the expiry index the
//! reconciler reclaims from) moves later, never earlier, so the hold outlives its first
//! deadline + grace; a branch no longer held answers its state and nothing is written.

use std::time::Duration;

use holdfast::proto::TryRequest;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;
use tonic::Code;

use super::{Sr, start};
use crate::common::{extend_request, from_now, hold, try_request};

async fn extend(p: &mut Sr, req: &TryRequest, secs: i64) -> Result<State, tonic::Status> {
    let state = p
        .participant
        .extend(extend_request(req, from_now(secs)))
        .await?
        .into_inner()
        .state;
    Ok(State::try_from(state).expect("state"))
}

#[sqlx::test(migrations = false)]
async fn an_extended_hold_outlives_its_first_deadline(pool: PgPool) {
    // No grace: a hold is reclaimable the moment its deadline has passed.
    let mut p = start(&pool, Duration::ZERO).await;
    p.put("sku-1", 2).await;
    p.put("sku-2", 1).await;
    let mut held = try_request(vec![hold("sku-1", 2, None)]);
    held.expires_at = Some(from_now(-60));
    assert_eq!(p.try_(&held).await.0, Outcome::Held);
    // The control: a hold past its deadline that nobody extends.
    let mut control = try_request(vec![hold("sku-2", 1, None)]);
    control.expires_at = Some(from_now(-60));
    assert_eq!(p.try_(&control).await.0, Outcome::Held);

    assert_eq!(extend(&mut p, &held, 600).await.unwrap(), State::Held);
    assert_eq!(
        extend(&mut p, &held, 600).await.unwrap(),
        State::Held,
        "a repeat"
    );
    assert_eq!(
        extend(&mut p, &held, -120).await.unwrap(),
        State::Held,
        "an earlier deadline"
    );
    let report = p.handle.reconcile().await.expect("reconcile");
    assert_eq!(
        report.reclaimed, 1,
        "only the control is reclaimed: {report:?}"
    );
    assert_eq!(p.counts("sku-1").await, (0, 2, 0));
    assert_eq!(p.counts("sku-2").await, (1, 0, 0));

    assert_eq!(p.confirm(&held).await, State::Confirmed);
    assert_eq!(extend(&mut p, &held, 900).await.unwrap(), State::Confirmed);
    assert_eq!(
        extend(&mut p, &control, 900).await.unwrap(),
        State::HoldLost
    );
    assert_eq!(p.counts("sku-1").await, (0, 0, 2));

    let cancelled = try_request(vec![hold("sku-2", 1, None)]);
    assert_eq!(p.cancel(&cancelled).await, State::Cancelled);
    assert_eq!(
        extend(&mut p, &cancelled, 600).await.unwrap(),
        State::Cancelled
    );

    // Never tried: nothing held, and no record written.
    let unknown = try_request(vec![hold("sku-2", 1, None)]);
    assert_eq!(
        extend(&mut p, &unknown, 600).await.unwrap(),
        State::HoldLost
    );
    assert_eq!(p.pttl(&unknown).await, -2, "no record");

    // Beyond --max-hold (24 h by default): refused, naming the field.
    let refused = extend(&mut p, &held, 48 * 3600).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("expires_at "), "{refused:?}");
    p.stop().await;
}
