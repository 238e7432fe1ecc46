//! The holders: each Reserves, thinks, then Confirms, Cancels, Extends and Confirms, or walks
//! away; a call that fails with a retryable status is repeated with the same request_id or
//! token (idempotent repeats), a few times, against whichever coordinator is up.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::proto;
use tonic::{Code, Status};

use crate::plan::{Act, HolderPlan, Plan};
use crate::stack::client;

/// Where the live coordinator listens (changes when the plan kills one).
pub type Current = Arc<Mutex<SocketAddr>>;
/// Every call and its answer, for a violation's report.
pub type History = Arc<Mutex<Vec<String>>>;

fn retryable(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Cancelled
    )
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

fn shown(r: &Result<proto::Reservation, Status>) -> String {
    match r {
        Ok(r) => format!(
            "{} {:?}",
            r.id,
            proto::reservation::State::try_from(r.state)
        ),
        Err(s) => format!("{:?} {}", s.code(), s.message()),
    }
}

pub async fn run_holder(plan: &Plan, h: HolderPlan, current: Current, history: History) {
    tokio::time::sleep(h.start_after).await;
    let holds: Vec<proto::Hold> = h
        .holds
        .iter()
        .map(|(participant, i, quantity)| proto::Hold {
            participant: (*participant).to_owned(),
            resource: if *participant == "stock" {
                plan.stock[*i].0.clone()
            } else {
                plan.seats[*i].clone()
            },
            quantity: *quantity,
            during: None,
        })
        .collect();
    let request = proto::ReserveRequest {
        request_id: format!("{}-r", h.name),
        holder: h.name.clone(),
        ttl: Some(duration(h.ttl)),
        holds,
        labels: Default::default(),
    };
    let mut reserved = None;
    for attempt in 0..4 {
        let Some(mut c) = client(addr(&current)).await else {
            break;
        };
        let answer = c.reserve(request.clone()).await.map(|r| r.into_inner());
        note(
            &history,
            format!("{} reserve#{attempt} -> {}", h.name, shown(&answer)),
        );
        match answer {
            Ok(r) => {
                reserved = Some(r);
                break;
            }
            Err(s) if retryable(&s) => tokio::time::sleep(Duration::from_millis(150)).await,
            Err(_) => break,
        }
    }
    let Some(r) = reserved else { return };
    if r.hold_token.is_empty() {
        return;
    }
    tokio::time::sleep(h.think).await;
    if h.act == Act::ExtendThenConfirm {
        let request = proto::ExtendRequest {
            reservation_id: r.id.clone(),
            hold_token: r.hold_token.clone(),
            ttl: Some(duration(Duration::from_secs(2))),
            request_id: format!("{}-x", h.name),
        };
        for attempt in 0..3 {
            let Some(mut c) = client(addr(&current)).await else {
                break;
            };
            let answer = c.extend(request.clone()).await.map(|r| r.into_inner());
            note(
                &history,
                format!("{} extend#{attempt} -> {}", h.name, shown(&answer)),
            );
            match answer {
                Err(s) if retryable(&s) => tokio::time::sleep(Duration::from_millis(150)).await,
                _ => break,
            }
        }
    }
    let act = match h.act {
        Act::Abandon => {
            note(&history, format!("{} walks away", h.name));
            return;
        }
        other => other,
    };
    for attempt in 0..4 {
        let Some(mut c) = client(addr(&current)).await else {
            break;
        };
        let answer = if act == Act::Cancel {
            c.cancel(proto::CancelRequest {
                reservation_id: r.id.clone(),
                hold_token: r.hold_token.clone(),
                reason: "faults".into(),
            })
            .await
        } else {
            c.confirm(proto::ConfirmRequest {
                reservation_id: r.id.clone(),
                hold_token: r.hold_token.clone(),
                payment: None,
            })
            .await
        }
        .map(|r| r.into_inner());
        note(
            &history,
            format!("{} {act:?}#{attempt} -> {}", h.name, shown(&answer)),
        );
        match answer {
            Err(s) if retryable(&s) => tokio::time::sleep(Duration::from_millis(150)).await,
            _ => break,
        }
    }
}
