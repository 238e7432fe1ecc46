//! Orphaned holds: kept until `expires_at + orphan_grace`, reclaimed after it (lazily, by a
//! Try that needs the capacity), after which the old branch's Confirm answers HOLD_LOST.

use std::time::Duration;

use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

const KINDS: [Kind; 4] = [Kind::Seats, Kind::Stock, Kind::Rooms, Kind::Payments];

#[sqlx::test(migrations = false)]
async fn orphan_past_grace_is_reclaimed_and_its_confirm_answers_hold_lost(pool: PgPool) {
    for kind in KINDS {
        let settings = ParticipantSettings {
            kind,
            orphan_grace: Duration::ZERO,
        };
        let mut p = spawn_with(settings, pool.clone()).await;
        let f = fixture(kind);
        // Room for exactly one branch.
        p.put(f.resource, f.units).await;
        let mut orphan = try_request(vec![f.hold()]);
        orphan.expires_at = Some(from_now(-60));
        assert_eq!(
            outcome(&p.try_(orphan.clone()).await),
            Outcome::Held,
            "{kind:?}"
        );

        let next = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(next.clone()).await),
            Outcome::Held,
            "{kind:?}: reclaimed"
        );
        assert_eq!(p.confirm(&orphan).await, State::HoldLost, "{kind:?}");
        assert_eq!(
            p.confirm(&orphan).await,
            State::HoldLost,
            "{kind:?}: repeat"
        );
        assert_eq!(p.confirm(&next).await, State::Confirmed, "{kind:?}");
        assert_eq!(
            p.cancel(&orphan).await,
            State::Cancelled,
            "{kind:?}: nothing held"
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            (0, 0, f.units),
            "{kind:?}"
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn expired_hold_is_kept_until_the_grace_has_passed(pool: PgPool) {
    for kind in KINDS {
        let mut p = spawn_participant(kind, pool.clone()).await;
        let f = fixture(kind);
        p.put(f.resource, f.units).await;
        let mut expired = try_request(vec![f.hold()]);
        expired.expires_at = Some(from_now(-60));
        assert_eq!(
            outcome(&p.try_(expired.clone()).await),
            Outcome::Held,
            "{kind:?}"
        );

        // Within the default one-hour grace only the coordinator releases.
        let other = try_request(vec![f.hold()]);
        assert_eq!(outcome(&p.try_(other).await), Outcome::Rejected, "{kind:?}");
        assert_eq!(p.confirm(&expired).await, State::Confirmed, "{kind:?}");
        assert_eq!(
            counts(&mut p, f.resource).await,
            (0, 0, f.units),
            "{kind:?}"
        );
        p.stop().await;
    }
}
