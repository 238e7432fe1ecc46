//! The invariants, read from the participants (GetResource, their barrier rows) and the
//! coordinator (GetReservation), after quiescence; conservation also while faults run.

use std::collections::HashMap;

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::plan::Plan;
use crate::stack::Stack;

/// Every (participant, resource, provisioned capacity) of a plan.
pub fn resources(plan: &Plan) -> Vec<(&'static str, String, i64)> {
    plan.stock
        .iter()
        .map(|(r, c)| ("stock", r.clone(), *c))
        .chain(plan.seats.iter().map(|r| ("seats", r.clone(), 1)))
        .collect()
}

/// capacity as provisioned = available + held + confirmed, nothing negative.
pub async fn conservation(stack: &Stack, plan: &Plan) -> Vec<String> {
    let mut violations = Vec::new();
    for (p, r, capacity) in resources(plan) {
        let s = stack.resource(p, &r).await;
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
    violations
}

/// (participant -> barrier state) of each reservation.
pub async fn barriers(pool: &PgPool, ids: &[String]) -> HashMap<String, Vec<(String, String)>> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT reservation_id, participant, state FROM tcc_barrier WHERE reservation_id = ANY($1)",
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

/// All-or-nothing, no branch both confirmed and cancelled, and the confirmed counts; returns
/// (reservation id, problem) pairs, plus conservation problems with an empty id.
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
                if at.iter().any(|(_, s)| s != "confirmed") {
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
    for (p, r, _) in resources(plan) {
        let s = stack.resource(p, &r).await;
        let expected = sold.get(&(p.to_owned(), r.clone())).copied().unwrap_or(0);
        if s.confirmed != expected {
            v.push((
                String::new(),
                format!("{p}/{r}: confirmed {} at the participant, {expected} by CONFIRMED reservations", s.confirmed),
            ));
        }
        if s.held != 0 {
            v.push((
                String::new(),
                format!("{p}/{r}: {} still held at quiescence", s.held),
            ));
        }
    }
    for c in conservation(stack, plan).await {
        v.push((String::new(), c));
    }
    v
}
