//! The SDK's barrier guarantees, checked once per reference participant by counting business
//! effects (GetResource counts), not calls.

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

/// Every (backend, kind) pair: the same case on PostgreSQL and on SQLite.
async fn every_backend_and_kind(pool: &PgPool) -> Vec<(Db, Kind)> {
    Db::both(pool)
        .await
        .into_iter()
        .flat_map(|db| db.kinds().into_iter().map(move |k| (db.clone(), k)))
        .collect()
}

async fn setup(kind: Kind, db: &Db) -> (Running, Fixture) {
    let mut p = spawn_on(kind, db).await;
    let f = fixture(kind);
    if kind != Kind::Noop {
        p.put(f.resource, f.capacity).await;
    }
    (p, f)
}

#[sqlx::test(migrations = false)]
async fn cancel_before_try_makes_the_late_try_a_rejected_no_op(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let (mut p, f) = setup(kind, &db).await;
        let req = try_request(vec![f.hold()]);
        assert_eq!(
            p.cancel(&req).await,
            State::Cancelled,
            "{kind:?} on {}",
            db.name()
        );
        let late = p.try_(req.clone()).await;
        assert_eq!(
            outcome(&late),
            Outcome::Rejected,
            "{kind:?} on {}",
            db.name()
        );
        assert!(!late.reason.is_empty(), "{kind:?}: a rejection says why");
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.try_(req.clone()).await,
            late,
            "{kind:?}: repeat answers the same"
        );
        assert_eq!(
            p.confirm(&req).await,
            State::Cancelled,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn duplicate_try_and_confirm_apply_once_with_the_first_answer(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let (mut p, f) = setup(kind, &db).await;
        let req = try_request(vec![f.hold()]);
        // Concurrent duplicates, each on its own connection: they must serialise.
        let mut calls = Vec::new();
        for _ in 0..4 {
            let mut client = p.new_client().await;
            let req = req.clone();
            calls.push(tokio::spawn(async move { client.r#try(req).await }));
        }
        for call in calls {
            let answer = call.await.expect("join").expect("try").into_inner();
            assert_eq!(outcome(&answer), Outcome::Held, "{kind:?} on {}", db.name());
        }
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 1, 0),
            "{kind:?} on {}",
            db.name()
        );

        let mut calls = Vec::new();
        for _ in 0..4 {
            let mut client = p.new_client().await;
            let branch = branch_request(&req);
            calls.push(tokio::spawn(async move { client.confirm(branch).await }));
        }
        for call in calls {
            let state = call
                .await
                .expect("join")
                .expect("confirm")
                .into_inner()
                .state;
            assert_eq!(state, State::Confirmed as i32, "{kind:?} on {}", db.name());
        }
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 1),
            "{kind:?} on {}",
            db.name()
        );
        // A Try repeated after Confirm answers its first answer and holds nothing more.
        assert_eq!(
            outcome(&p.try_(req.clone()).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 1),
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn duplicate_cancel_releases_once(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let (mut p, f) = setup(kind, &db).await;
        let req = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(req.clone()).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );
        let mut calls = Vec::new();
        for _ in 0..4 {
            let mut client = p.new_client().await;
            let branch = branch_request(&req);
            calls.push(tokio::spawn(async move { client.cancel(branch).await }));
        }
        for call in calls {
            let state = call
                .await
                .expect("join")
                .expect("cancel")
                .into_inner()
                .state;
            assert_eq!(state, State::Cancelled as i32, "{kind:?} on {}", db.name());
        }
        // Released exactly once: a double release would show more available than capacity.
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            outcome(&p.try_(req.clone()).await),
            Outcome::Held,
            "{kind:?}: first answer"
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?}: no effect"
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn confirm_after_cancel_is_refused_without_change(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let (mut p, f) = setup(kind, &db).await;
        let req = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(req.clone()).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.cancel(&req).await,
            State::Cancelled,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.confirm(&req).await,
            State::Cancelled,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn cancel_after_confirm_is_refused_without_change(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let (mut p, f) = setup(kind, &db).await;
        let req = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(req.clone()).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.confirm(&req).await,
            State::Confirmed,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.cancel(&req).await,
            State::Confirmed,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 1),
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

/// A second item that makes the whole Try fail after the first item was applied inside the
/// transaction (it sorts after the fixture's item).
fn failing_item(kind: Kind, f: &Fixture) -> Option<holdfast::proto::Hold> {
    match kind {
        Kind::Seats => Some(hold("ZZ-missing", 1, None)),
        Kind::Stock | Kind::StockRedis => Some(hold("sku-missing", 1, None)),
        // Overlaps the fixture's slot in the same room: SQLSTATE 23P01 inside the Try.
        Kind::Rooms => Some(hold("blue", 1, slot(from_now(-1800), from_now(5400)))),
        Kind::Payments => Some(hold("acct-missing", 1, None)),
        // noop cannot fail.
        Kind::Noop => {
            let _ = f;
            None
        }
    }
}

#[sqlx::test(migrations = false)]
async fn rejected_try_rolls_back_then_its_cancel_is_recorded(pool: PgPool) {
    for (db, kind) in every_backend_and_kind(&pool).await {
        let (mut p, f) = setup(kind, &db).await;
        let Some(failing) = failing_item(kind, &f) else {
            p.stop().await;
            continue;
        };
        let req = try_request(vec![failing, f.hold()]);
        let answer = p.try_(req.clone()).await;
        assert_eq!(
            outcome(&answer),
            Outcome::Rejected,
            "{kind:?} on {}",
            db.name()
        );
        // The first item, applied before the failing one, was rolled back.
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.try_(req.clone()).await,
            answer,
            "{kind:?}: repeat answers the same"
        );
        assert_eq!(
            p.cancel(&req).await,
            State::Cancelled,
            "{kind:?} on {}",
            db.name()
        );
        assert_eq!(
            p.confirm(&req).await,
            State::Cancelled,
            "{kind:?}: cancel was recorded"
        );
        assert_eq!(
            counts(&mut p, f.resource).await,
            f.expect(kind, 0, 0),
            "{kind:?} on {}",
            db.name()
        );
        // The resource is really free.
        let fresh = try_request(vec![f.hold()]);
        assert_eq!(
            outcome(&p.try_(fresh).await),
            Outcome::Held,
            "{kind:?} on {}",
            db.name()
        );
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn errored_try_leaves_no_barrier_row_and_its_cancel_still_works(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Seats, &db).await;
        p.put("A1", 1).await;
        p.put("BOOM", 1).await;
        // A database error inside the business change (not a rejection).
        match &db {
            Db::Postgres(pool) => sqlx::raw_sql(
                "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS \
                   $$ BEGIN RAISE EXCEPTION 'secret detail'; END $$; \
                 CREATE TRIGGER seat_boom BEFORE UPDATE ON seat FOR EACH ROW \
                   WHEN (NEW.resource = 'BOOM') EXECUTE FUNCTION boom();",
            )
            .execute(pool)
            .await
            .map(drop),
            Db::Sqlite(pool) => sqlx::raw_sql(
                "CREATE TRIGGER seat_boom BEFORE UPDATE ON seat FOR EACH ROW \
                   WHEN NEW.resource = 'BOOM' BEGIN SELECT RAISE(ABORT, 'secret detail'); END;",
            )
            .execute(pool)
            .await
            .map(drop),
        }
        .expect("trigger");
        let req = try_request(vec![hold("A1", 1, None), hold("BOOM", 1, None)]);
        let err = p
            .participant
            .r#try(req.clone())
            .await
            .expect_err("errored try");
        assert_eq!(err.code(), tonic::Code::Internal, "on {}", db.name());
        assert!(
            !err.message().contains("secret"),
            "internals leaked: {}",
            err.message()
        );
        assert_eq!(
            barrier_state(&db, &req.branch_id).await,
            None,
            "no barrier row survives a failed Try, on {}",
            db.name()
        );
        assert_eq!(counts(&mut p, "A1").await, (1, 0, 0));

        assert_eq!(p.cancel(&req).await, State::Cancelled);
        assert_eq!(
            barrier_state(&db, &req.branch_id).await.as_deref(),
            Some("cancelled")
        );
        // The retried Try (say the trigger is gone now) is refused: the branch is cancelled.
        match &db {
            Db::Postgres(pool) => sqlx::raw_sql("DROP TRIGGER seat_boom ON seat")
                .execute(pool)
                .await
                .map(drop),
            Db::Sqlite(pool) => sqlx::raw_sql("DROP TRIGGER seat_boom")
                .execute(pool)
                .await
                .map(drop),
        }
        .expect("drop");
        assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Rejected);
        assert_eq!(counts(&mut p, "A1").await, (1, 0, 0));
        p.stop().await;
    }
}

/// The barrier phase of `branch_id`, if it has a row.
async fn barrier_state(db: &Db, branch_id: &str) -> Option<String> {
    match db {
        Db::Postgres(pool) => {
            sqlx::query_scalar("SELECT state FROM tcc_barrier WHERE branch_id = $1")
                .bind(branch_id)
                .fetch_optional(pool)
                .await
        }
        Db::Sqlite(pool) => {
            sqlx::query_scalar("SELECT state FROM tcc_barrier WHERE branch_id = ?1")
                .bind(branch_id)
                .fetch_optional(pool)
                .await
        }
    }
    .expect("barrier state")
}

#[sqlx::test(migrations = false)]
async fn racing_try_and_cancel_never_leave_a_hold(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    p.put("sku-1", 100).await;
    let mut calls = Vec::new();
    for i in 0..30 {
        let req = try_request(vec![hold("sku-1", 1, None)]);
        let mut a = p.new_client().await;
        let mut b = p.new_client().await;
        let branch = branch_request(&req);
        calls.push(tokio::spawn(async move {
            // Alternate which call is sent first; either order must end released.
            if i % 2 == 0 {
                let (t, c) = tokio::join!(a.r#try(req), b.cancel(branch));
                (t.map(|_| ()), c.map(|r| r.into_inner().state))
            } else {
                let (c, t) = tokio::join!(b.cancel(branch), a.r#try(req));
                (t.map(|_| ()), c.map(|r| r.into_inner().state))
            }
        }));
    }
    for call in calls {
        let (t, c) = call.await.expect("join");
        t.expect("try");
        assert_eq!(c.expect("cancel"), State::Cancelled as i32);
    }
    assert_eq!(counts(&mut p, "sku-1").await, (100, 0, 0));
    p.stop().await;
}

/// A barrier write refused because the server is read-only (SQLSTATE 25006: at a failover, a
/// primary demoted to a standby, or a connection that reached a standby) is answered
/// UNAVAILABLE, so the coordinator retries it against the new primary; it was INTERNAL.
#[sqlx::test(migrations = false)]
async fn a_write_refused_by_a_read_only_server_is_unavailable_not_internal(pool: PgPool) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION READ ONLY")
        .execute(&mut *tx)
        .await
        .unwrap();
    let refused = sqlx::query("CREATE TABLE refused_on_a_standby (x int)")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("25006"),
        "{refused:?}"
    );
    let answered = tonic::Status::from(holdfast::participant::ResourceError::Database(refused));
    assert_eq!(answered.code(), tonic::Code::Unavailable, "{answered:?}");
}
