//! The invariants over resources, read from the participants (GetResource, their barrier rows,
//! stock-redis's durable record) and the coordinator (GetReservation), after quiescence;
//! conservation also while faults run. Money (refunds, payments balance) is in `money.rs`,
//! replayed calls in `replay.rs`.

use std::collections::HashMap;

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::plan::Plan;
use crate::stack::Stack;

/// capacity as provisioned = available + held + confirmed, nothing negative. A participant
/// that does not answer (killed, restarting) is skipped: `.1` counts the skipped reads.
pub async fn conservation(stack: &Stack, plan: &Plan) -> (Vec<String>, u64) {
    let mut violations = Vec::new();
    let mut skipped = 0;
    for (p, r, capacity) in plan.resources() {
        let Ok(s) = stack.try_resource(p, &r).await else {
            skipped += 1;
            continue;
        };
        if s.available < 0 || s.held < 0 || s.confirmed < 0 {
            violations.push(format!("{p}/{r}: a negative count {s:?}"));
        }
        if s.available + s.held + s.confirmed != capacity {
            violations.push(format!(
                "{p}/{r}: available {} + held {} + confirmed {} != provisioned {capacity}",
                s.available, s.held, s.confirmed
            ));
        }
    }
    (violations, skipped)
}

/// (participant -> barrier state) of each reservation; stock-redis's branches durably
/// confirmed show as ("stock-redis", "confirmed") (its barrier is in Redis, its record of
/// truth in `stock_redis_confirmed`).
pub async fn barriers(pool: &PgPool, ids: &[String]) -> HashMap<String, Vec<(String, String)>> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT reservation_id, participant, state FROM tcc_barrier WHERE reservation_id = ANY($1) \
         UNION ALL SELECT DISTINCT reservation_id, 'stock-redis', 'confirmed' \
         FROM stock_redis_confirmed WHERE reservation_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading barrier rows: {e}"));
    let mut by = HashMap::<String, Vec<(String, String)>>::new();
    for (id, participant, state) in rows {
        by.entry(id).or_default().push((participant, state));
    }
    by
}

/// Units per resource in stock-redis's durable record.
async fn redis_durable(pool: &PgPool, plan: &Plan) -> HashMap<String, i64> {
    let names: Vec<String> = plan.redis.iter().map(|(r, _)| r.clone()).collect();
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT resource, CAST(sum(quantity) AS BIGINT) FROM stock_redis_confirmed \
         WHERE resource = ANY($1) GROUP BY resource",
    )
    .bind(&names)
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading stock_redis_confirmed: {e}"));
    rows.into_iter().collect()
}

/// The captured money of payments made outside reservations (charges, net of refunds).
async fn charged(pool: &PgPool, account: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT CAST(coalesce(sum(amount_minor - refunded_minor), 0) AS BIGINT) FROM payment \
         WHERE resource = $1",
    )
    .bind(account)
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("reading payments: {e}"))
}

/// All-or-nothing, no branch both confirmed and cancelled, the confirmed counts (the payments
/// balance among them: captured = authorisations of CONFIRMED reservations + charges net of
/// refunds); returns (reservation id, problem) pairs, plus resource problems with an empty id.
pub async fn settled(
    stack: &Stack,
    plan: &Plan,
    reservations: &[proto::Reservation],
) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let ids: Vec<String> = reservations.iter().map(|r| r.id.clone()).collect();
    let barriers = barriers(&stack.pool, &ids).await;
    let mut sold = HashMap::<(String, String), i64>::new();
    for r in reservations {
        let state = State::try_from(r.state).unwrap_or(State::Unspecified);
        let at: &[(String, String)] = barriers.get(&r.id).map_or(&[], |b| b.as_slice());
        use proto::branch::State as B;
        match state {
            State::Confirmed => {
                for b in &r.branches {
                    if B::try_from(b.state) != Ok(B::Confirmed) {
                        v.push((r.id.clone(), format!("CONFIRMED with branch {b:?}")));
                    }
                    *sold
                        .entry((b.participant.clone(), b.resource.clone()))
                        .or_default() += b.quantity;
                    if !at
                        .iter()
                        .any(|(p, s)| *p == b.participant && s == "confirmed")
                    {
                        v.push((
                            r.id.clone(),
                            format!(
                                "CONFIRMED but {} has no confirmed barrier row: {at:?}",
                                b.participant
                            ),
                        ));
                    }
                }
                // An honoured late payment re-placed released branches as a new
                // generation (SPEC 3.1): the old generation's rows are cancelled. A queued
                // reservation's refused placements and released offers (SPEC 11) are earlier
                // generations too: rejected or cancelled rows.
                let queued = plan.holders.iter().any(|h| h.queue && h.name == r.holder);
                let old_generation = |s: &str| {
                    (r.late_payment_honored && s == "cancelled")
                        || (queued && matches!(s, "cancelled" | "rejected"))
                };
                if at
                    .iter()
                    .any(|(_, s)| s != "confirmed" && !old_generation(s))
                {
                    v.push((r.id.clone(), format!("CONFIRMED, barrier rows {at:?}")));
                }
            }
            State::Cancelled | State::Expired | State::Rejected => {
                for b in &r.branches {
                    if matches!(B::try_from(b.state), Ok(B::Confirmed) | Ok(B::Held)) {
                        v.push((r.id.clone(), format!("{state:?} with branch {b:?}")));
                    }
                }
                if at.iter().any(|(_, s)| s == "held" || s == "confirmed") {
                    v.push((r.id.clone(), format!("{state:?}, barrier rows {at:?}")));
                }
            }
            other => v.push((r.id.clone(), format!("not settled as expected: {other:?}"))),
        }
    }
    let durable = redis_durable(&stack.pool, plan).await;
    for (p, r, _) in plan.resources() {
        let s = stack.resource(p, &r).await;
        let mut expected = sold.get(&(p.to_owned(), r.clone())).copied().unwrap_or(0);
        if p == "payments" {
            expected += charged(&stack.pool, &r).await;
        }
        if s.confirmed != expected {
            v.push((
                String::new(),
                format!(
                    "{p}/{r}: confirmed {} at the participant, {expected} by CONFIRMED reservations{}",
                    s.confirmed,
                    if p == "payments" {
                        " and charges net of refunds"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if p == "stock-redis" && durable.get(&r).copied().unwrap_or(0) != expected {
            v.push((
                String::new(),
                format!(
                    "{p}/{r}: {:?} units in the durable record, {expected} by CONFIRMED reservations",
                    durable.get(&r)
                ),
            ));
        }
        if s.held != 0 {
            v.push((
                String::new(),
                format!("{p}/{r}: {} still held at quiescence", s.held),
            ));
        }
    }
    for c in conservation(stack, plan).await.0 {
        v.push((String::new(), c));
    }
    v
}

/// The event log against the reservations (SPEC 10), after quiescence: once every event is
/// readable (below the horizon), each reservation's events start with its creation, their
/// reservation versions never go back, each state event carries the state it names, nothing
/// follows a terminal state but what SPEC 2 allows (a late payment re-placing an EXPIRED
/// reservation, an operator settling a FAILED one), and the last state event is the
/// reservation's state.
pub async fn event_log(
    pool: &PgPool,
    reservations: &[proto::Reservation],
) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let mut unreadable: i64 = 0;
    for _ in 0..200 {
        unreadable = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE sequence >= holdfast_event_horizon()",
        )
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("reading the event log: {e}"));
        if unreadable == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    if unreadable > 0 {
        v.push((
            String::new(),
            format!("{unreadable} events stay above the horizon"),
        ));
    }
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT reservation_id::text, type, state, version FROM events ORDER BY sequence",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading the event log: {e}"));
    let mut by = HashMap::<String, Vec<(String, String, i64)>>::new();
    for (id, event_type, state, version) in rows {
        by.entry(id).or_default().push((event_type, state, version));
    }
    for r in reservations {
        let events = by.remove(&r.id).unwrap_or_default();
        v.extend(
            lifecycle_of(r, &events)
                .into_iter()
                .map(|p| (r.id.clone(), p)),
        );
    }
    v
}

/// What is wrong with one reservation's events (type, snapshot state, version), in order.
fn lifecycle_of(r: &proto::Reservation, events: &[(String, String, i64)]) -> Vec<String> {
    let mut v = Vec::new();
    if events.first().map(|e| e.0.as_str()) != Some("RESERVATION_TRYING") {
        v.push(format!("events do not start with its creation: {events:?}"));
    }
    for pair in events.windows(2) {
        if pair[1].2 < pair[0].2 {
            v.push(format!("versions go back: {pair:?}"));
        }
    }
    let states: Vec<&str> = events
        .iter()
        .filter_map(|(t, s, _)| {
            let named = t.strip_prefix("RESERVATION_")?;
            (named != "EXTENDED").then_some((named, s.as_str()))
        })
        .map(|(named, s)| {
            if named != s {
                v.push(format!("a {named} event carries state {s}"));
            }
            named
        })
        .collect();
    for pair in states.windows(2) {
        let allowed = match pair[0] {
            "CONFIRMED" | "CANCELLED" | "REJECTED" => false,
            "EXPIRED" => matches!(pair[1], "CONFIRMING" | "CANCELLING"),
            "FAILED" => matches!(
                pair[1],
                "CONFIRMED" | "CANCELLED" | "CONFIRMING" | "CANCELLING"
            ),
            _ => true,
        };
        if !allowed {
            v.push(format!("{} after terminal {}", pair[1], pair[0]));
        }
    }
    let state = State::try_from(r.state).unwrap_or(State::Unspecified);
    if states.last().copied() != Some(state.as_str_name()) {
        v.push(format!(
            "last state event {:?}, reservation {state:?}",
            states.last()
        ));
    }
    v
}
