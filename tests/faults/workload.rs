//! The holders: each Reserves (some with `queue`, then waiting for their offer), then Confirms (with or without a payment), pays late, Cancels
//! (and pays after), Extends and Confirms, or walks away; a call that fails with a retryable
//! status is repeated with the same request_id or token (idempotent repeats), a few times,
//! against whichever coordinator is up. Every holder leaves an [`Outcome`]: what it sent and
//! the last answer of each call, which `replay.rs` sends again after quiescence.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast::proto;
use holdfast::proto::payments_client::PaymentsClient;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::plan::{Act, HolderPlan, Plan};
use crate::stack::client;

/// Where the live coordinator listens (changes when the plan kills one).
pub type Current = Arc<Mutex<SocketAddr>>;
/// Every call and its answer, for a violation's report.
pub type History = Arc<Mutex<Vec<String>>>;
/// What every holder sent and was last answered.
pub type Outcomes = Arc<Mutex<Vec<Outcome>>>;

/// A client call after the Reserve, as a replay repeats it.
#[derive(Clone, Debug)]
pub enum Call {
    Confirm(Option<proto::Payment>),
    Cancel,
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub holder: String,
    pub request: proto::ReserveRequest,
    /// The Reserve's last answer (with the token when it succeeded).
    pub reserved: Option<Result<proto::Reservation, Status>>,
    /// Each call after the Reserve with its last answer.
    pub calls: Vec<(Call, Result<proto::Reservation, Status>)>,
    /// The payment the holder charged (if it got as far).
    pub payment: Option<proto::Payment>,
}

/// An answer that is not an outcome: the call is repeated. Besides transport and server
/// trouble, `RESERVATION_NOT_HELD` (a Confirm or Cancel while the reservation is still
/// `TRYING`, e.g. a repeated Reserve answered mid-placement) and `LATE_PAYMENT_IN_PROGRESS`
/// say "not yet".
pub fn retryable(s: &Status) -> bool {
    let not_yet = || {
        s.get_error_details().error_info().is_some_and(|i| {
            matches!(
                i.reason.as_str(),
                "RESERVATION_NOT_HELD" | "LATE_PAYMENT_IN_PROGRESS"
            )
        })
    };
    matches!(
        s.code(),
        Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Cancelled
    ) || not_yet()
}

fn addr(current: &Current) -> SocketAddr {
    *current.lock().unwrap_or_else(|e| e.into_inner())
}

fn note(history: &History, line: String) {
    history.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

pub fn shown(r: &Result<proto::Reservation, Status>) -> String {
    match r {
        Ok(r) => format!(
            "{} {:?}",
            r.id,
            proto::reservation::State::try_from(r.state)
        ),
        Err(s) => format!("{:?} {}", s.code(), s.message()),
    }
}

/// A slot covering the present hour and the next two (rooms count the slot covering now).
fn slot() -> proto::Interval {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let at = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
    proto::Interval {
        start: Some(at(now - 3600)),
        end: Some(at(now + 2 * 3600)),
    }
}

pub fn reserve_request(plan: &Plan, h: &HolderPlan) -> proto::ReserveRequest {
    let holds = h
        .holds
        .iter()
        .map(|(participant, i, quantity)| proto::Hold {
            participant: (*participant).to_owned(),
            resource: plan.resource(participant, *i),
            quantity: *quantity,
            during: (*participant == "rooms").then(slot),
        })
        .collect();
    proto::ReserveRequest {
        request_id: format!("{}-r", h.name),
        holder: h.name.clone(),
        ttl: Some(duration(h.ttl)),
        holds,
        labels: Default::default(),
        queue: h.queue.then(|| proto::QueueOptions {
            wait_up_to: Some(duration(crate::plan::QUEUED_HOLDER_WAIT)),
        }),
    }
}

/// One call, repeated (same body) while the answer is retryable, at most `tries` times.
async fn repeated<F, Fut>(
    current: &Current,
    history: &History,
    what: String,
    tries: u32,
    call: F,
) -> Option<Result<proto::Reservation, Status>>
where
    F: Fn(proto::coordinator_client::CoordinatorClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<proto::Reservation, Status>>,
{
    let mut last = None;
    for attempt in 0..tries {
        let Some(c) = client(addr(current)).await else {
            break;
        };
        let answer = call(c).await;
        note(history, format!("{what}#{attempt} -> {}", shown(&answer)));
        let again = matches!(&answer, Err(s) if retryable(s));
        last = Some(answer);
        if !again {
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    last
}

/// Charges the holder's card for the reservation (outside the coordinator, SPEC 3.4). Not
/// idempotent: an answer lost is a payment the runner does not know, which the balance
/// check still counts (it reads every payment of the account).
async fn charge(
    payments: &PaymentsClient<Channel>,
    plan: &Plan,
    h: &HolderPlan,
    reservation_id: &str,
    history: &History,
) -> Option<proto::Payment> {
    for attempt in 0..4 {
        let answer = payments
            .clone()
            .charge(proto::ChargeRequest {
                account: plan.account.0.clone(),
                amount_minor: h.amount,
                currency: "EUR".into(),
                reservation_id: reservation_id.to_owned(),
            })
            .await;
        match answer {
            Ok(r) => {
                let payment_ref = r.into_inner().payment_ref;
                note(history, format!("{} charge -> {payment_ref}", h.name));
                return Some(proto::Payment {
                    participant: "payments".into(),
                    payment_ref,
                    amount_minor: h.amount,
                    currency: "EUR".into(),
                });
            }
            Err(s) => {
                note(history, format!("{} charge#{attempt} -> {s:?}", h.name));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    None
}

pub async fn run_holder(
    plan: &Plan,
    h: HolderPlan,
    current: Current,
    history: History,
    payments: PaymentsClient<Channel>,
    outcomes: Outcomes,
) {
    tokio::time::sleep(h.start_after).await;
    let request = reserve_request(plan, &h);
    let mut outcome = Outcome {
        holder: h.name.clone(),
        request: request.clone(),
        reserved: None,
        calls: Vec::new(),
        payment: None,
    };
    outcome.reserved = repeated(
        &current,
        &history,
        format!("{} reserve", h.name),
        4,
        |mut c| {
            let request = request.clone();
            async move { c.reserve(request).await.map(|r| r.into_inner()) }
        },
    )
    .await;
    if let Some(Ok(r)) = &outcome.reserved
        && !r.hold_token.is_empty()
    {
        let mut r = r.clone();
        if r.state == proto::reservation::State::Queued as i32 {
            match offered(&h, &r, &current, &history).await {
                Some(held) => r.state = held.state,
                None => r.state = proto::reservation::State::Rejected as i32,
            }
        }
        if r.state != proto::reservation::State::Rejected as i32 {
            act(plan, &h, &r, &current, &history, &payments, &mut outcome).await;
        }
    }
    outcomes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(outcome);
}

/// A queued holder waits for its offer: reads its reservation until it is `HELD` (then it
/// acts) or its wait is over (the wait ends `REJECTED` with `QUEUE_WAIT_ENDED`, or an offer
/// came too late to matter): `None`.
async fn offered(
    h: &HolderPlan,
    r: &proto::Reservation,
    current: &Current,
    history: &History,
) -> Option<proto::Reservation> {
    use proto::reservation::State;
    let until =
        tokio::time::Instant::now() + crate::plan::QUEUED_HOLDER_WAIT + Duration::from_secs(1);
    note(history, format!("{} queued: {}", h.name, r.id));
    while tokio::time::Instant::now() < until {
        if let Some(mut c) = client(addr(current)).await {
            let read = c
                .get_reservation(proto::GetReservationRequest {
                    reservation_id: r.id.clone(),
                })
                .await;
            match read.map(|a| a.into_inner()) {
                Ok(now) if now.state == State::Held as i32 => {
                    note(history, format!("{} offered: HELD", h.name));
                    return Some(now);
                }
                Ok(now)
                    if now.state != State::Queued as i32
                        && now.state != State::Trying as i32
                        && now.state != State::Cancelling as i32 =>
                {
                    return None;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn act(
    plan: &Plan,
    h: &HolderPlan,
    r: &proto::Reservation,
    current: &Current,
    history: &History,
    payments: &PaymentsClient<Channel>,
    outcome: &mut Outcome,
) {
    let (id, token) = (r.id.clone(), r.hold_token.clone());
    let confirm = |payment: Option<proto::Payment>| {
        let (id, token) = (id.clone(), token.clone());
        move |mut c: proto::coordinator_client::CoordinatorClient<Channel>| {
            let request = proto::ConfirmRequest {
                reservation_id: id.clone(),
                hold_token: token.clone(),
                payment: payment.clone(),
            };
            async move { c.confirm(request).await.map(|r| r.into_inner()) }
        }
    };
    let cancel = |mut c: proto::coordinator_client::CoordinatorClient<Channel>| {
        let request = proto::CancelRequest {
            reservation_id: id.clone(),
            hold_token: token.clone(),
            reason: "faults".into(),
        };
        async move { c.cancel(request).await.map(|r| r.into_inner()) }
    };
    match h.act {
        Act::Abandon => {
            note(history, format!("{} walks away", h.name));
            return;
        }
        // Past expires_at (as this clock sees it), then pays.
        Act::PayLate => tokio::time::sleep(h.ttl + Duration::from_millis(100) + h.think).await,
        _ => tokio::time::sleep(h.think).await,
    }
    if h.act == Act::ExtendThenConfirm {
        let request = proto::ExtendRequest {
            reservation_id: id.clone(),
            hold_token: token.clone(),
            ttl: Some(duration(Duration::from_secs(2))),
            request_id: format!("{}-x", h.name),
        };
        repeated(
            current,
            history,
            format!("{} extend", h.name),
            3,
            |mut c| {
                let request = request.clone();
                async move { c.extend(request).await.map(|r| r.into_inner()) }
            },
        )
        .await;
    }
    if matches!(h.act, Act::Cancel | Act::CancelThenPay) {
        let what = format!("{} cancel", h.name);
        if let Some(answer) = repeated(current, history, what, 4, cancel).await {
            outcome.calls.push((Call::Cancel, answer));
        }
        if h.act == Act::Cancel {
            return;
        }
    }
    let payment = if h.act.pays() {
        outcome.payment = charge(payments, plan, h, &id, history).await;
        if outcome.payment.is_none() {
            return;
        }
        outcome.payment.clone()
    } else {
        None
    };
    let what = format!(
        "{} confirm{}",
        h.name,
        if h.act.pays() { "+pay" } else { "" }
    );
    if let Some(answer) = repeated(current, history, what, 4, confirm(payment.clone())).await {
        outcome.calls.push((Call::Confirm(payment), answer));
    }
}
