//! Extend (`tcc.v1.Participant/Extend`) through the SDK barrier, for every SDK participant on
//! PostgreSQL and on SQLite: a held branch's deadline moves later (never earlier), so the hold
//! outlives its first deadline + grace; a repeat changes nothing; a branch no longer held
//! answers its state and nothing is written; a deadline beyond `--max-hold` is refused.
//! (stock-redis: `stock_redis/holds.rs`.)

use std::time::Duration;

use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn an_extended_hold_outlives_its_first_deadline(pool: PgPool) {
    for db in Db::both(&pool).await {
        let kinds = db.kinds().into_iter().filter(|k| *k != Kind::StockRedis);
        for kind in kinds {
            let at = format!("{kind:?} on {}", db.name());
            // No grace: a hold is reclaimable the moment its deadline has passed.
            let settings = ParticipantSettings {
                orphan_grace: Duration::ZERO,
                ..ParticipantSettings::new(kind)
            };
            let mut p = spawn_settings_on(settings, &db).await;
            let f = fixture(kind);
            // Room for exactly one branch.
            if kind != Kind::Noop {
                p.put(f.resource, f.units).await;
            }
            let mut held = try_request(vec![f.hold()]);
            held.expires_at = Some(from_now(-60));
            assert_eq!(outcome(&p.try_(held.clone()).await), Outcome::Held, "{at}");

            assert_eq!(
                p.extend(&held, from_now(600)).await.unwrap(),
                State::Held,
                "{at}"
            );
            assert_eq!(
                p.extend(&held, from_now(600)).await.unwrap(),
                State::Held,
                "{at}: a repeat"
            );
            assert_eq!(
                p.extend(&held, from_now(-120)).await.unwrap(),
                State::Held,
                "{at}: an earlier deadline"
            );
            if kind != Kind::Noop {
                // Past the first deadline (+ no grace), yet not reclaimed: the extension held,
                // and the earlier deadline did not move it back.
                let next = try_request(vec![f.hold()]);
                assert_eq!(
                    outcome(&p.try_(next.clone()).await),
                    Outcome::Rejected,
                    "{at}: the extended hold was reclaimed"
                );
            }
            assert_eq!(p.confirm(&held).await, State::Confirmed, "{at}");
            assert_eq!(
                p.extend(&held, from_now(900)).await.unwrap(),
                State::Confirmed,
                "{at}: after Confirm"
            );
            assert_eq!(counts(&mut p, f.resource).await, (0, 0, f.units), "{at}");

            let cancelled = try_request(vec![f.hold()]);
            assert_eq!(p.cancel(&cancelled).await, State::Cancelled, "{at}");
            assert_eq!(
                p.extend(&cancelled, from_now(600)).await.unwrap(),
                State::Cancelled,
                "{at}: after Cancel"
            );

            // Never tried: nothing held, and nothing written.
            let unknown = try_request(vec![f.hold()]);
            assert_eq!(
                p.extend(&unknown, from_now(600)).await.unwrap(),
                State::HoldLost,
                "{at}: never tried"
            );
            assert_eq!(db.barrier_rows(&unknown.branch_id).await, 0, "{at}");

            // Beyond --max-hold (24 h by default): refused, naming the field.
            let refused = p.extend(&held, from_now(48 * 3600)).await.unwrap_err();
            assert_eq!(refused.code(), Code::InvalidArgument, "{at}: {refused:?}");
            assert!(
                refused.message().starts_with("expires_at "),
                "{at}: {refused:?}"
            );
            p.stop().await;
        }
    }
}
