//! Idempotency, after quiescence: each holder's Reserve and last call, when definitive, is sent
//! again, byte for byte (same request_id, same token, same payment), and must get the same
//! outcome: a Reserve the same reservation and token, a Confirm or Cancel the same final
//! state or the same refusal with the same refund; and no replay may change a reservation or
//! create a refund (compared by the caller before and after).

use holdfast::api::error::refund_detail;
use holdfast::proto;
use holdfast::proto::reservation::State;
use tonic::Status;
use tonic_types::StatusExt;

use crate::stack::client;
use crate::workload::{Call, Current, Outcome, retryable};

/// What must not change between an answer and its replay: Ok with the state it settles in
/// (`CONFIRMING` settles `CONFIRMED`; `CANCELLING` and every released state are one class), or the
/// code, ErrorInfo reason and refund id of a refusal.
fn class(answer: &Result<proto::Reservation, Status>) -> String {
    match answer {
        Ok(r) => {
            let s = match State::try_from(r.state) {
                Ok(State::Confirming) => State::Confirmed,
                // Released, whichever way: a Cancel answered while a rejection or an
                // expiry was releasing reports CANCELLING, which then ends REJECTED or
                // EXPIRED (the release the holder asked for, either way).
                Ok(State::Cancelling | State::Cancelled | State::Expired | State::Rejected) => {
                    return "ok released".to_owned();
                }
                Ok(s) => s,
                Err(_) => State::Unspecified,
            };
            format!("ok {}", s.as_str_name())
        }
        Err(s) => format!(
            "{:?} {} refund {:?}",
            s.code(),
            s.get_error_details()
                .error_info()
                .map(|i| i.reason.clone())
                .unwrap_or_default(),
            refund_detail(s).map(|r| r.refund_id)
        ),
    }
}

/// The reservation a refusal names (ErrorInfo metadata `reservation_id`).
fn recorded_id(s: &Status) -> Option<String> {
    s.get_error_details()
        .error_info()
        .and_then(|i| i.metadata.get("reservation_id").cloned())
}

/// Whether a refusal says it recorded nothing (the sold-out fast path).
fn unrecorded(s: &Status) -> bool {
    s.get_error_details()
        .error_info()
        .is_some_and(|i| i.metadata.get("recorded").map(String::as_str) == Some("false"))
}

/// Replays every definitive answer of `outcomes`; returns (reservation id, problem) pairs
/// and how many calls were replayed.
pub async fn replay(current: &Current, outcomes: &[Outcome]) -> (Vec<(String, String)>, u64) {
    let mut v = Vec::new();
    let mut n = 0;
    let addr = *current.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut c) = client(addr).await else {
        return (vec![(String::new(), "no client for the replay".into())], 0);
    };
    for o in outcomes {
        let Some(first) = &o.reserved else { continue };
        // A sold-out fast path's refusal recorded nothing (SPEC 3.2: `recorded` = `false`):
        // its repeat is a new request, not a replay, and would place a hold nobody releases.
        if matches!(first, Err(s) if retryable(s) || unrecorded(s)) {
            continue;
        }
        n += 1;
        let again = c.reserve(o.request.clone()).await.map(|r| r.into_inner());
        let id = first
            .as_ref()
            .map_or_else(|_| String::new(), |r| r.id.clone());
        // A repeat returns the reservation whatever its state now (SPEC 3.1): a first
        // answer INSUFFICIENT_CAPACITY (the reservation REJECTED) comes back as that
        // reservation, REJECTED, or as the same refusal.
        let same = match (first, &again) {
            (Ok(a), Ok(b)) => a.id == b.id && a.hold_token == b.hold_token,
            (Err(a), Err(b)) => a.code() == b.code() && recorded_id(a) == recorded_id(b),
            (Err(a), Ok(b)) => {
                recorded_id(a).as_deref() == Some(b.id.as_str())
                    && b.state == State::Rejected as i32
            }
            (Ok(_), Err(_)) => false,
        };
        if !same {
            v.push((
                id.clone(),
                format!(
                    "{}: Reserve replayed answered {} (token {}), first {} (token {})",
                    o.holder,
                    crate::workload::shown(&again),
                    again.as_ref().is_ok_and(|r| !r.hold_token.is_empty()),
                    crate::workload::shown(first),
                    first.as_ref().is_ok_and(|r| !r.hold_token.is_empty()),
                ),
            ));
        }
        let Ok(reserved) = first else { continue };
        // Only the holder's last call: an earlier one may be superseded by a later one (a
        // Cancel racing expiry answered as the expiry's release, then a late payment
        // honoured: the Cancel's replay now meets a CONFIRMED reservation, as SPEC 3.1 says).
        if let Some((call, answer)) = o.calls.last() {
            if matches!(answer, Err(s) if retryable(s)) {
                continue;
            }
            n += 1;
            let again = match call {
                Call::Confirm(payment) => c
                    .confirm(proto::ConfirmRequest {
                        reservation_id: reserved.id.clone(),
                        hold_token: reserved.hold_token.clone(),
                        payment: payment.clone(),
                    })
                    .await
                    .map(|r| r.into_inner()),
                Call::Cancel => c
                    .cancel(proto::CancelRequest {
                        reservation_id: reserved.id.clone(),
                        hold_token: reserved.hold_token.clone(),
                        reason: "faults".into(),
                    })
                    .await
                    .map(|r| r.into_inner()),
            };
            if class(answer) != class(&again) {
                v.push((
                    reserved.id.clone(),
                    format!(
                        "{}: {call:?} replayed answered [{}], first [{}]",
                        o.holder,
                        class(&again),
                        class(answer)
                    ),
                ));
            }
        }
    }
    (v, n)
}
