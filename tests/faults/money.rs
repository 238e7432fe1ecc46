//! Refunds against SPEC 3.1: at most one refund per reservation (at the payment service), a
//! refund exactly when the SPEC says so (a Confirm with a payment answered `HOLD_EXPIRED` or
//! `RESERVATION_CLOSED` carries it; a `CONFIRMED` reservation and one nobody paid for have
//! none), every refund acknowledged after quiescence, and what the coordinator recorded agreeing
//! with what the payment service did. The payments balance is in `check.rs` (confirmed counts).

use std::collections::HashMap;

use holdfast::api::error::refund_detail;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::plan::Plan;
use crate::workload::{Call, Outcome, retryable};

/// (refund_id, payment_ref, amount) per reservation, as the payment service recorded them.
pub async fn refunds_at_payments(
    pool: &PgPool,
    ids: &[String],
) -> HashMap<String, Vec<(String, String, i64)>> {
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT reservation_id, refund_id, payment_ref, amount_minor FROM refund \
         WHERE reservation_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading refunds: {e}"));
    let mut by = HashMap::<String, Vec<(String, String, i64)>>::new();
    for (id, refund, payment, amount) in rows {
        by.entry(id).or_default().push((refund, payment, amount));
    }
    by
}

pub async fn check(
    pool: &PgPool,
    plan: &Plan,
    reservations: &[proto::Reservation],
    outcomes: &[Outcome],
) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let ids: Vec<String> = reservations.iter().map(|r| r.id.clone()).collect();
    let paid = refunds_at_payments(pool, &ids).await;
    let by_id: HashMap<&str, &proto::Reservation> =
        reservations.iter().map(|r| (r.id.as_str(), r)).collect();
    for r in reservations {
        let state = State::try_from(r.state).unwrap_or(State::Unspecified);
        let at_payments: &[(String, String, i64)] = paid.get(&r.id).map_or(&[], |p| p.as_slice());
        let id = r.id.clone();
        if at_payments.len() > 1 {
            v.push((
                id.clone(),
                format!(
                    "{} refunds at the payment service: {at_payments:?}",
                    at_payments.len()
                ),
            ));
        }
        match &r.refund {
            Some(refund) => {
                if state == State::Confirmed {
                    v.push((id.clone(), format!("CONFIRMED with a refund {refund:?}")));
                }
                if refund.state != proto::refund::State::Refunded as i32 {
                    v.push((
                        id.clone(),
                        format!("refund not acknowledged at quiescence: {refund:?}"),
                    ));
                }
                if !at_payments.iter().any(|(rid, _, amount)| {
                    *rid == refund.refund_id && *amount == refund.amount_minor
                }) {
                    v.push((
                        id.clone(),
                        format!(
                            "refund {refund:?} unknown to the payment service: {at_payments:?}"
                        ),
                    ));
                }
            }
            None => {
                if !at_payments.is_empty() {
                    v.push((
                        id.clone(),
                        format!(
                            "refunded at the payment service {at_payments:?}, no refund recorded"
                        ),
                    ));
                }
            }
        }
        if r.late_payment_honored {
            if state != State::Confirmed {
                v.push((id.clone(), format!("late payment honoured but {state:?}")));
            }
            if plan.late_refund {
                v.push((
                    id.clone(),
                    "late payment honoured under policy refund".to_owned(),
                ));
            }
        }
    }
    for o in outcomes {
        let Some(Ok(reserved)) = &o.reserved else {
            continue;
        };
        let Some(r) = by_id.get(reserved.id.as_str()) else {
            continue;
        };
        let state = State::try_from(r.state).unwrap_or(State::Unspecified);
        let sent_payment = o
            .calls
            .iter()
            .any(|(c, _)| matches!(c, Call::Confirm(Some(_))));
        if !sent_payment && r.refund.is_some() {
            v.push((
                r.id.clone(),
                format!("{} never paid, yet a refund {:?}", o.holder, r.refund),
            ));
        }
        for (call, answer) in &o.calls {
            let Call::Confirm(Some(payment)) = call else {
                continue;
            };
            match answer {
                Ok(answered) => {
                    if state != State::Confirmed {
                        v.push((
                            r.id.clone(),
                            format!(
                                "{}: Confirm with a payment answered {:?}, now {state:?}",
                                o.holder, answered.state
                            ),
                        ));
                    }
                }
                Err(s) if s.code() == tonic::Code::FailedPrecondition && !retryable(s) => {
                    let detail = refund_detail(s);
                    match (&detail, &r.refund) {
                        (Some(d), Some(recorded)) if d.refund_id == recorded.refund_id => {}
                        _ => v.push((
                            r.id.clone(),
                            format!(
                                "{}: Confirm with payment {} answered {:?} {} with refund {detail:?}; recorded {:?}",
                                o.holder, payment.payment_ref, s.code(), s.message(), r.refund
                            ),
                        )),
                    }
                    if state == State::Confirmed {
                        v.push((
                            r.id.clone(),
                            format!(
                                "{}: Confirm with a payment refused, yet CONFIRMED",
                                o.holder
                            ),
                        ));
                    }
                }
                Err(_) => {}
            }
        }
    }
    v
}
