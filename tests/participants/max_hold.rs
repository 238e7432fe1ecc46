//! `--max-hold` (SPEC 7.3): every reference participant, on every backend it runs on, refuses
//! a Try whose `expires_at` lies further ahead than it holds, writing nothing; a Try just
//! under the bound holds.

use std::time::Duration;

use holdfast::participant::DEFAULT_MAX_HOLD;
use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

/// 9999-12-31T23:59:59Z.
const YEAR_9999: i64 = 253_402_300_799;

#[sqlx::test(migrations = false)]
async fn a_try_beyond_max_hold_is_invalid_and_writes_nothing(pool: PgPool) {
    let bound = DEFAULT_MAX_HOLD.as_secs() as i64;
    assert_eq!(bound, 24 * 3600, "the default is 24 h");
    for db in Db::both(&pool).await {
        for kind in db.kinds() {
            let what = format!("{kind:?} on {}", db.name());
            let mut p = spawn_on(kind, &db).await;
            let f = fixture(kind);
            p.put(f.resource, f.capacity).await;
            let mut req = try_request(vec![f.hold()]);
            req.expires_at = Some(prost_types::Timestamp {
                seconds: YEAR_9999,
                nanos: 0,
            });
            let err = p
                .participant
                .r#try(req.clone())
                .await
                .expect_err(&format!("{what}: a hold until year 9999 is refused"));
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err:?}");
            assert!(
                err.message().starts_with("expires_at "),
                "{what}: names the field: {}",
                err.message()
            );
            assert_eq!(
                counts(&mut p, f.resource).await,
                f.expect(kind, 0, 0),
                "{what}: nothing held"
            );
            if kind != Kind::StockRedis {
                assert_eq!(
                    db.barrier_rows(&req.branch_id).await,
                    0,
                    "{what}: no barrier row"
                );
            }
            // The same branch, just under the bound: nothing was recorded for it, so it holds
            // (a recorded refusal would be answered again).
            req.expires_at = Some(from_now(bound - 60));
            assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held, "{what}");
            assert_eq!(
                counts(&mut p, f.resource).await,
                f.expect(kind, 1, 0),
                "{what}: held"
            );
            assert_eq!(
                p.cancel(&req).await,
                holdfast::proto::branch::State::Cancelled
            );
            p.stop().await;
        }
    }
}

#[sqlx::test(migrations = false)]
async fn max_hold_is_configurable(pool: PgPool) {
    for db in Db::both(&pool).await {
        let settings = ParticipantSettings {
            max_hold: Duration::from_secs(600),
            ..ParticipantSettings::new(Kind::Seats)
        };
        let mut p = spawn_settings_on(settings, &db).await;
        p.put("A1", 1).await;
        let mut req = try_request(vec![hold("A1", 1, None)]);
        req.expires_at = Some(from_now(660));
        let err = p.participant.r#try(req.clone()).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{}", db.name());
        assert!(err.message().contains("600s"), "{}", err.message());
        req.expires_at = Some(from_now(540));
        assert_eq!(outcome(&p.try_(req).await), Outcome::Held, "{}", db.name());
        p.stop().await;
    }
}
