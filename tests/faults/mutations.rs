//! The checks can fail: a schedule without faults passes them, then each of the faults a
//! bug would leave behind is planted in the real stores (a unit leaked from a counter, a
//! second refund sent to the payment service, a cancelled reservation's branch confirmed at
//! its participant, a confirmed stock-redis branch missing from the durable record, a decided
//! reservation's state rewritten so a replayed Confirm answers differently), and the checks
//! run again: each must report its fault.

use std::time::Duration;

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::plan::{Act, HolderPlan, Plan};
use crate::runner::{Healed, Totals, run_plan, verify};
use crate::stack::Stack;

fn holder(seed: u64, h: usize, holds: Vec<(&'static str, usize, i64)>, act: Act) -> HolderPlan {
    HolderPlan {
        name: format!("s{seed}-h{h}"),
        start_after: Duration::from_millis(20 * h as u64),
        holds,
        ttl: Duration::from_secs(5),
        act,
        think: Duration::ZERO,
        amount: 2_000,
        queue: false,
    }
}

/// A fault-free schedule whose reservations cover what the mutations need.
fn plan() -> Plan {
    let seed = 990_000_001;
    let mut plan = Plan::from_seed(seed);
    plan.stock = vec![(format!("s{seed}-item0"), 5)];
    plan.redis = vec![(format!("s{seed}-flash"), 5)];
    plan.seats = vec![format!("s{seed}-seat0"), format!("s{seed}-seat1")];
    plan.holders = vec![
        holder(seed, 0, vec![("stock", 0, 1)], Act::Confirm),
        holder(seed, 1, vec![("seats", 0, 1)], Act::Pay),
        holder(seed, 2, vec![("seats", 1, 1), ("stock", 0, 1)], Act::Cancel),
        holder(seed, 3, vec![("stock-redis", 0, 2)], Act::Confirm),
    ];
    plan.failpoints.clear();
    plan.faults.clear();
    plan.late_refund = false;
    plan.boundary = false;
    plan.workload = Duration::from_millis(300);
    plan
}

async fn expect(stack: &Stack, ran: &crate::runner::Ran, fault: &str, reported: &str) {
    let (found, _) = verify(
        stack,
        &ran.plan,
        &ran.current,
        &ran.reservations,
        &ran.outcomes,
    )
    .await;
    assert!(
        found.iter().any(|(_, v)| v.contains(reported)),
        "planted {fault}: expected a violation containing {reported:?}, the checks found {found:#?}"
    );
    eprintln!("faults: planted {fault}: reported ({reported})");
}

async fn exec(pool: &PgPool, sql: &'static str, id: &str) {
    let done = sqlx::query(sql)
        .bind(id)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert!(done.rows_affected() > 0, "{sql} ({id}) changed nothing");
}

pub async fn checks_catch_planted_faults(pool: PgPool) {
    let _healed = Healed;
    let stack = Stack::start(pool).await;
    let ran = run_plan(&stack, plan(), &mut Totals::default()).await;
    let id_of = |h: usize| {
        let name = &ran.plan.holders[h].name;
        let r = ran
            .reservations
            .iter()
            .find(|r| &r.holder == name)
            .unwrap_or_else(|| panic!("{name} reserved nothing: {:#?}", ran.reservations));
        (r.id.clone(), State::try_from(r.state))
    };
    let (confirmed, s0) = id_of(0);
    let (paid, s1) = id_of(1);
    let (cancelled, s2) = id_of(2);
    let (flash, s3) = id_of(3);
    assert_eq!(
        (s0, s1, s2, s3),
        (
            Ok(State::Confirmed),
            Ok(State::Confirmed),
            Ok(State::Cancelled),
            Ok(State::Confirmed)
        ),
        "the fault-free schedule"
    );
    let pool = &stack.pool;

    // A unit leaked by the participant: the counter moved, no hold behind it.
    exec(
        pool,
        "UPDATE stock_item SET available = available - 1 WHERE resource = $1",
        &ran.plan.stock[0].0,
    )
    .await;
    expect(&stack, &ran, "a leaked unit", "!= provisioned").await;
    exec(
        pool,
        "UPDATE stock_item SET available = available + 1 WHERE resource = $1",
        &ran.plan.stock[0].0,
    )
    .await;

    // A second refund: the coordinator refunding a payment it did not record a refund for.
    let payment = ran
        .outcomes
        .iter()
        .find_map(|o| (o.holder == ran.plan.holders[1].name).then(|| o.payment.clone()))
        .flatten()
        .expect("h1 paid");
    stack
        .payments
        .clone()
        .refund(proto::RefundRequest {
            refund_id: uuid::Uuid::new_v4().to_string(),
            reservation_id: paid.clone(),
            payment_ref: payment.payment_ref.clone(),
            amount_minor: payment.amount_minor,
            currency: payment.currency.clone(),
            reason: "planted".into(),
        })
        .await
        .expect("the planted refund");
    expect(
        &stack,
        &ran,
        "a refund of a CONFIRMED reservation",
        "no refund recorded",
    )
    .await;

    // A branch of a CANCELLED reservation confirmed at its participant.
    exec(pool, "UPDATE tcc_barrier SET state = 'confirmed' WHERE reservation_id = $1 AND participant = 'seats'", &cancelled).await;
    expect(
        &stack,
        &ran,
        "a cancelled reservation's branch confirmed",
        "Cancelled, barrier rows",
    )
    .await;

    // A confirmed stock-redis branch missing from the durable record.
    exec(
        pool,
        "DELETE FROM stock_redis_confirmed WHERE reservation_id = $1",
        &flash,
    )
    .await;
    expect(
        &stack,
        &ran,
        "a lost durable stock-redis confirm",
        "in the durable record",
    )
    .await;

    // A decided outcome changed behind the client's back: its replayed Confirm differs.
    exec(
        pool,
        "UPDATE reservations SET state = 'CANCELLED' WHERE id = $1::uuid",
        &confirmed,
    )
    .await;
    expect(
        &stack,
        &ran,
        "a CONFIRMED reservation rewritten",
        "replayed answered",
    )
    .await;

    drop(ran);
    stack.stop().await;
}
