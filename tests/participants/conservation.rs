//! The conservation checker can fail: a unit leaked or duplicated behind the participant's back
//! (a hold row deleted or copied, the counter moved, directly in the test database) makes
//! `admin_checker` - the check every storm runs against the provisioned capacity - report it.
//! Capacity is the stored fact PutResources set, `available` the counter Try takes from,
//! `held`/`confirmed` are summed from the hold rows (migration 0007).

use holdfast::participants::Kind;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

/// SQL of one counter kind: its hold table (the rows GetResource sums) and its counter.
struct Tables {
    kind: Kind,
    resource: &'static str,
    capacity: i64,
    units: i64,
    copy_row: &'static str,
    delete_row: &'static str,
    bump_counter: &'static str,
}

const STOCK: Tables = Tables {
    kind: Kind::Stock,
    resource: "sku-1",
    capacity: 10,
    units: 1,
    copy_row: "INSERT INTO stock_hold (reservation_id, branch_id, resource, quantity, state, held_until) \
               SELECT reservation_id, $1, resource, quantity, state, held_until FROM stock_hold \
               WHERE state = 'held' LIMIT 1",
    delete_row: "DELETE FROM stock_hold WHERE branch_id = $1",
    bump_counter: "UPDATE stock_item SET available = available + 1 WHERE resource = $1",
};

const PAYMENTS: Tables = Tables {
    kind: Kind::Payments,
    resource: "acct-1",
    capacity: 1000,
    units: 100,
    copy_row: "INSERT INTO authorisation (reservation_id, branch_id, resource, amount_minor, state, held_until) \
               SELECT reservation_id, $1, resource, amount_minor, state, held_until FROM authorisation \
               WHERE state = 'authorised' LIMIT 1",
    delete_row: "DELETE FROM authorisation WHERE branch_id = $1",
    bump_counter: "UPDATE account SET available = available + 1 WHERE resource = $1",
};

async fn leaked_units_are_reported(pool: &PgPool, t: &Tables) {
    for db in Db::both(pool).await {
        let what = format!("{:?} on {}", t.kind, db.name());
        let mut p = spawn_on(t.kind, &db).await;
        p.put(t.resource, t.capacity).await;
        let mut branches = Vec::new();
        for _ in 0..3 {
            let req = try_request(vec![hold(t.resource, t.units, None)]);
            branches.push(req.branch_id.clone());
            assert_eq!(outcome(&p.try_(req).await), Outcome::Held, "{what}");
        }
        let check = admin_checker(&p, t.resource, t.capacity);
        check()
            .await
            .unwrap_or_else(|e| panic!("{what}: clean state: {e}"));

        // A duplicated unit: a stray hold row nobody took from the counter.
        assert_eq!(db.execute(t.copy_row, "stray").await, 1, "{what}");
        let err = check()
            .await
            .expect_err("a duplicated unit must be reported");
        assert!(err.contains("conservation broken"), "{what}: {err}");
        db.execute(t.delete_row, "stray").await;
        check()
            .await
            .unwrap_or_else(|e| panic!("{what}: repaired: {e}"));

        // A lost unit: a hold row gone while the counter still counts it out.
        assert_eq!(db.execute(t.delete_row, &branches[0]).await, 1, "{what}");
        let err = check().await.expect_err("a lost unit must be reported");
        assert!(err.contains("conservation broken"), "{what}: {err}");

        // The counter drifting on its own (a release returning units twice): moved by 2, so
        // it does not merely cancel out the lost row above.
        db.execute(t.bump_counter, t.resource).await;
        db.execute(t.bump_counter, t.resource).await;
        let err = check()
            .await
            .expect_err("a doubly returned unit must be reported");
        assert!(err.contains("conservation broken"), "{what}: {err}");
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn stock_checker_reports_a_leaked_or_duplicated_unit(pool: PgPool) {
    leaked_units_are_reported(&pool, &STOCK).await;
}

#[sqlx::test(migrations = false)]
async fn payments_checker_reports_a_leaked_or_duplicated_unit(pool: PgPool) {
    leaked_units_are_reported(&pool, &PAYMENTS).await;
}
