//! Redis coming back with older data (a restart from an RDB snapshot, a lost AOF tail, a
//! failover to a lagging replica): the data set still has its ready marker, but it is behind
//! the durable record. It must be rebuilt before it serves, or units confirmed after the
//! snapshot are sold again.
//!
//! The rollback is simulated on this test's keys only (the machine's Redis is shared): every
//! key under the prefix is DUMPed, and later the keys are replaced by those dumps (RESTORE
//! REPLACE, the others deleted) in one MULTI/EXEC - what a restart from that snapshot leaves.

use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;
use tonic::Code;

use super::{HOUR, Sr, durable_units, start, start_replica};
use crate::common::{hold, outcome, try_request};

/// Every key of a participant with its DUMP and time to live (ms, 0 for none).
struct Snapshot(Vec<(String, Vec<u8>, i64)>);

async fn keys(p: &Sr, conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{}*", p.prefix))
        .query_async(conn)
        .await
        .expect("KEYS")
}

async fn snapshot(p: &Sr) -> Snapshot {
    let mut conn = p.redis().await;
    let mut out = Vec::new();
    for key in keys(p, &mut conn).await {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DUMP");
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        if let Some(dump) = dump {
            out.push((key, dump, pttl.max(0)));
        }
    }
    assert!(!out.is_empty(), "the participant has keys to snapshot");
    Snapshot(out)
}

/// Puts the participant's keys back as they were at `snap`, atomically.
async fn roll_back(p: &Sr, snap: &Snapshot) {
    let mut conn = p.redis().await;
    let now = keys(p, &mut conn).await;
    let mut pipe = redis::pipe();
    pipe.atomic();
    for key in &now {
        pipe.cmd("DEL").arg(key).ignore();
    }
    for (key, dump, ttl) in &snap.0 {
        pipe.cmd("RESTORE")
            .arg(key)
            .arg(*ttl)
            .arg(dump.as_slice())
            .arg("REPLACE")
            .ignore();
    }
    let () = pipe
        .query_async(&mut conn)
        .await
        .expect("restore the snapshot");
}

/// Tries `req` until the participant serves it, running the reconciler while it answers
/// UNAVAILABLE (rebuilding); then confirms it if held. Whether it ended CONFIRMED.
async fn buy(p: &mut Sr, req: &holdfast::proto::TryRequest) -> bool {
    for _ in 0..5 {
        match p.participant.r#try(req.clone()).await {
            Ok(answer) if outcome(answer.get_ref()) == Outcome::Held => {
                return p.confirm(req).await == State::Confirmed;
            }
            Ok(_) => return false,
            Err(s) if s.code() == Code::Unavailable => {
                p.handle.reconcile().await.expect("reconcile");
            }
            Err(s) => panic!("try: {s:?}"),
        }
    }
    panic!("still rebuilding after five reconciler passes");
}

#[sqlx::test(migrations = false)]
async fn redis_rolled_back_behind_its_durable_record_is_rebuilt_before_serving(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", 1).await;
    let snap = snapshot(&p).await;
    let x = try_request(vec![hold("sku-1", 1, None)]);
    assert_eq!(p.try_(&x).await.0, Outcome::Held);
    assert_eq!(p.confirm(&x).await, State::Confirmed);
    assert_eq!(durable_units(&pool, "sku-1").await, 1);

    roll_back(&p, &snap).await;
    // The data set says one unit is available, but the durable record has it sold: the
    // participant does not serve from it. UNAVAILABLE (retry), not a capacity refusal.
    let y = try_request(vec![hold("sku-1", 1, None)]);
    let first = p.participant.r#try(y.clone()).await;
    let y_confirmed = buy(&mut p, &y).await;
    assert!(!y_confirmed, "the unit confirmed to X was sold again to Y");
    match first {
        Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        Ok(answer) => panic!(
            "served from a Redis behind its durable record: {:?}",
            answer.into_inner()
        ),
    }
    assert_eq!(durable_units(&pool, "sku-1").await, 1);
    assert_eq!(
        p.counts("sku-1").await,
        (0, 0, 1),
        "rebuilt from the record"
    );
    // X is still confirmed, to repeats and to a late Cancel.
    assert_eq!(p.confirm(&x).await, State::Confirmed);
    assert_eq!(p.cancel(&x).await, State::Confirmed);
    let report = p.handle.reconcile().await.expect("reconcile");
    assert!(!report.rebuilt, "a caught-up data set is not rebuilt again");
    assert!(report.drift.is_empty(), "{:?}", report.drift);
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_replica_that_did_not_see_the_confirm_rebuilds_in_its_reconciler(pool: PgPool) {
    let mut a = start(&pool, HOUR).await;
    a.put("sku-1", 1).await;
    let mut b = start_replica(&pool, &a).await;
    let snap = snapshot(&a).await;
    let x = try_request(vec![hold("sku-1", 1, None)]);
    assert_eq!(a.try_(&x).await.0, Outcome::Held);
    assert_eq!(a.confirm(&x).await, State::Confirmed);

    roll_back(&a, &snap).await;
    // B never saw X's confirm; its reconciler compares Redis with the durable record.
    let report = b.handle.reconcile().await.expect("reconcile");
    assert!(report.rebuilt, "Redis behind the durable record is rebuilt");
    let y = try_request(vec![hold("sku-1", 1, None)]);
    assert!(!buy(&mut b, &y).await, "sold twice");
    assert_eq!(b.counts("sku-1").await, (0, 0, 1));
    assert_eq!(durable_units(&pool, "sku-1").await, 1);
    b.stop().await;
    a.stop().await;
}
