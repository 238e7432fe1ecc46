//! Orphaned holds: kept until `expires_at + orphan_grace`, reclaimed after it (lazily, by a
//! Try that needs the capacity), after which the old branch's Confirm answers HOLD_LOST. The
//! gRPC cases run on PostgreSQL and on SQLite.

use std::time::Duration;

use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

const KINDS: [Kind; 4] = [Kind::Seats, Kind::Stock, Kind::Rooms, Kind::Payments];

/// Every kind with holds to lose, on PostgreSQL and on SQLite.
async fn every_backend_and_kind(pool: &PgPool) -> Vec<(Db, Kind)> {
    Db::both(pool)
        .await
        .into_iter()
        .flat_map(|db| KINDS.into_iter().map(move |k| (db.clone(), k)))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn orphan_past_grace_is_reclaimed_and_its_confirm_answers_hold_lost(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let settings = ParticipantSettings {
            orphan_grace: Duration::ZERO,
            ..ParticipantSettings::new(kind)
        };
        let mut p = spawn_settings_on(settings, &db).await;
        let f = fixture(kind);
        // Room for exactly one branch.
        p.put(f.resource, f.units).await;
        let mut orphan = try_request(vec![f.hold()]);
        orphan.expires_at = Some(from_now(-60));
        assert_eq!(
            outcome(&p.try_(orphan.clone()).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );

        let next = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(next.clone()).await),
            Outcome::Held,
            "{kind:?} on {}: reclaimed",
            db.name()
        );
        assert_eq!(
            p.confirm(&orphan).await,
            State::HoldLost,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.confirm(&orphan).await,
            State::HoldLost,
            "{kind:?} on {}: repeat",
            db.name()
        );
        assert_eq!(
            p.confirm(&next).await,
            State::Confirmed,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.cancel(&orphan).await,
            State::Cancelled,
            "{kind:?} on {}: nothing held",
            db.name()
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            (0, 0, f.units),
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn expired_hold_is_kept_until_the_grace_has_passed(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let mut p = spawn_on(kind, &db).await;
        let f = fixture(kind);
        p.put(f.resource, f.units).await;
        let mut expired = try_request(vec![f.hold()]);
        expired.expires_at = Some(from_now(-60));
        assert_eq!(
            outcome(&p.try_(expired.clone()).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );

        // Within the default one-hour grace only the coordinator releases.
        let other = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(other).await),
            Outcome::Rejected,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.confirm(&expired).await,
            State::Confirmed,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            (0, 0, f.units),
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

/// The periodic sweep (the SDK's public `reclaim_orphans`) used in-process, through the
/// domain API rather than gRPC.
#[sqlx::test(migrations = false)]
async fn sweep_reclaims_orphans_through_the_domain_api(pool: PgPool) {
    use holdfast::participant::{
        BranchAnswer, BranchKey, Item, ParticipantService, TryAnswer, TryBranch,
    };
    use holdfast::participants::{MIGRATOR, admin::Inventory, stock::Stock};

    MIGRATOR.run(&pool).await.expect("migrate");
    let mut conn = pool.acquire().await.expect("conn");
    Inventory::<sqlx::Postgres>::put(&Stock, &mut conn, "sku-1", 5)
        .await
        .expect("put");
    let service =
        ParticipantService::new("stock", Stock, pool.clone()).with_orphan_grace(Duration::ZERO);
    let past = chrono::Utc::now() - chrono::Duration::minutes(5);
    let branch = |id: &str, expires_at| TryBranch {
        key: BranchKey {
            reservation_id: format!("r-{id}"),
            branch_id: format!("b-{id}"),
        },
        holder: "alice".into(),
        items: vec![Item {
            resource: "sku-1".into(),
            quantity: 2,
            during: None,
        }],
        expires_at,
    };
    let orphan = branch("orphan", past);
    let live = branch("live", chrono::Utc::now() + chrono::Duration::minutes(10));
    assert_eq!(
        service.try_branch(orphan.clone()).await.expect("try"),
        TryAnswer::Held
    );
    assert_eq!(
        service.try_branch(live.clone()).await.expect("try"),
        TryAnswer::Held
    );

    assert_eq!(
        service.reclaim_orphans(10).await.expect("sweep"),
        1,
        "only the orphan"
    );
    assert_eq!(
        service.reclaim_orphans(10).await.expect("sweep"),
        0,
        "never twice"
    );
    let counts = Inventory::<sqlx::Postgres>::get(&Stock, &mut conn, "sku-1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!((counts.available, counts.held), (3, 2));
    assert_eq!(
        service.confirm_branch(&orphan.key).await.expect("confirm"),
        BranchAnswer::HoldLost
    );
    assert_eq!(
        service.confirm_branch(&live.key).await.expect("confirm"),
        BranchAnswer::Confirmed
    );
}

/// A Confirm whose business code finds part of the hold gone answers HOLD_LOST, undoes its
/// partial confirm and releases the rest, so nothing is left hanging.
#[sqlx::test(migrations = false)]
async fn confirm_finding_part_of_the_hold_gone_releases_the_rest(pool: PgPool) {
    let mut p = spawn_participant(Kind::Seats, pool.clone()).await;
    p.put("A1", 1).await;
    p.put("A2", 1).await;
    let req = try_request(vec![hold("A1", 1, None), hold("A2", 1, None)]);
    assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
    // Someone (an operator, a bug) freed A2 behind the barrier's back.
    sqlx::query("UPDATE seat SET state = 'available', reservation_id = NULL, branch_id = NULL WHERE resource = 'A2'")
        .execute(&pool)
        .await
        .expect("free A2");
    assert_eq!(p.confirm(&req).await, State::HoldLost);
    assert_eq!(
        counts(&mut p, "A1").await,
        (1, 0, 0),
        "A1 released, not confirmed"
    );
    assert_eq!(counts(&mut p, "A2").await, (1, 0, 0));
    assert_eq!(
        p.confirm(&req).await,
        State::HoldLost,
        "repeat answers the same"
    );
    p.stop().await;
}

/// Confirms racing a sweep (here from a second, in-process replica of the same participant):
/// each orphan ends either confirmed or reclaimed, never both, and the counts agree.
#[sqlx::test(migrations = false)]
async fn confirm_racing_the_sweep_decides_each_branch_once(pool: PgPool) {
    use holdfast::participant::ParticipantService;
    use holdfast::participants::stock::Stock;

    let settings = ParticipantSettings {
        orphan_grace: Duration::ZERO,
        ..ParticipantSettings::new(Kind::Stock)
    };
    let mut p = spawn_with(settings, pool.clone()).await;
    p.put("sku-1", 20).await;
    let mut branches = Vec::new();
    for _ in 0..20 {
        let mut req = try_request(vec![hold("sku-1", 1, None)]);
        req.expires_at = Some(from_now(-60));
        assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
        branches.push(req);
    }
    let replica =
        ParticipantService::new("stock", Stock, pool.clone()).with_orphan_grace(Duration::ZERO);
    let sweep = tokio::spawn(async move { replica.reclaim_orphans(100).await });
    let mut confirms = Vec::new();
    for req in &branches {
        let mut client = p.new_client().await;
        let branch = branch_request(req);
        confirms.push(tokio::spawn(async move { client.confirm(branch).await }));
    }
    let mut confirmed: i64 = 0;
    let mut lost: usize = 0;
    for call in confirms {
        let state = call
            .await
            .expect("join")
            .expect("confirm")
            .into_inner()
            .state;
        match State::try_from(state).expect("state") {
            State::Confirmed => confirmed += 1,
            State::HoldLost => lost += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    let reclaimed = sweep.await.expect("join").expect("sweep");
    assert_eq!(confirmed as usize + lost, 20);
    assert_eq!(
        reclaimed, lost,
        "every lost hold was reclaimed by the sweep, once"
    );
    assert_eq!(
        counts(&mut p, "sku-1").await,
        (20 - confirmed, 0, confirmed)
    );
    p.stop().await;
}
