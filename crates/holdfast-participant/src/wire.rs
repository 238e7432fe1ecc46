//! The SDK's wire layer: what a `tcc.v1.Participant` request becomes in SDK terms and what an
//! answer becomes on the wire. Every participant server goes through it (the generic
//! [`ParticipantService`](super::ParticipantService) and `stock-redis`), so they read requests
//! alike and refuse bad ones with the same field names and messages.
//!
//! Only wire-level checks happen here (timestamps, branch ids); what a Try must satisfy
//! beyond that is [`super::validate`].

use chrono::{DateTime, Utc};
use tonic::Response;

use super::validate::check_id;
use super::{
    BranchAnswer, BranchKey, ExtendAnswer, Item, ResourceError, Slot, TryAnswer, TryBranch,
};
use holdfast_proto::{
    BranchRequest, BranchResponse, ExtendBranchRequest, TryRequest, TryResponse, branch,
    try_response,
};

/// The branch a wire Try asks to hold, its timestamps converted (errors name the field:
/// `expires_at`, `items[2].during.start`). Ids and items are checked by
/// [`super::validate::check_try`], not here.
pub fn try_branch(req: TryRequest) -> Result<TryBranch, ResourceError> {
    let expires_at = req
        .expires_at
        .ok_or_else(|| ResourceError::invalid("expires_at", "is required"))
        .and_then(|ts| timestamp("expires_at", ts))?;
    let items = req
        .items
        .into_iter()
        .enumerate()
        .map(|(i, hold)| {
            let during = match hold.during {
                None => None,
                Some(interval) => {
                    let at = |field: &str, ts: Option<prost_types::Timestamp>| {
                        let field = format!("items[{i}].during.{field}");
                        ts.ok_or_else(|| ResourceError::invalid(&field, "is required"))
                            .and_then(|ts| timestamp(&field, ts))
                    };
                    Some(Slot {
                        start: at("start", interval.start)?,
                        end: at("end", interval.end)?,
                    })
                }
            };
            Ok(Item {
                resource: hold.resource,
                quantity: hold.quantity,
                during,
            })
        })
        .collect::<Result<Vec<_>, ResourceError>>()?;
    Ok(TryBranch {
        key: BranchKey {
            reservation_id: req.reservation_id,
            branch_id: req.branch_id,
        },
        holder: req.holder,
        items,
        expires_at,
    })
}

/// The branch a wire Confirm or Cancel names, its ids checked.
pub fn branch_key(req: BranchRequest) -> Result<BranchKey, ResourceError> {
    check_id("reservation_id", &req.reservation_id)?;
    check_id("branch_id", &req.branch_id)?;
    Ok(BranchKey {
        reservation_id: req.reservation_id,
        branch_id: req.branch_id,
    })
}

/// The branch a wire Extend names (ids checked) and its new deadline (`expires_at`, required).
/// How far ahead it may lie is checked by the participant (`--max-hold`).
pub fn extend_branch(
    req: ExtendBranchRequest,
) -> Result<(BranchKey, DateTime<Utc>), ResourceError> {
    let expires_at = req
        .expires_at
        .ok_or_else(|| ResourceError::invalid("expires_at", "is required"))
        .and_then(|ts| timestamp("expires_at", ts))?;
    let key = branch_key(BranchRequest {
        reservation_id: req.reservation_id,
        branch_id: req.branch_id,
    })?;
    Ok((key, expires_at))
}

/// The wire answer to an Extend: `HELD` while the branch holds, else its state.
pub fn extend_response(answer: ExtendAnswer) -> Response<BranchResponse> {
    match answer {
        ExtendAnswer::Held => Response::new(BranchResponse {
            state: branch::State::Held as i32,
        }),
        ExtendAnswer::Settled(state) => branch_response(state),
    }
}

/// The wire answer to a Try (a rejection carries its reason; a hold, none).
pub fn try_response(answer: TryAnswer) -> Response<TryResponse> {
    let (outcome, reason) = match answer {
        TryAnswer::Held => (try_response::Outcome::Held, String::new()),
        TryAnswer::Rejected(reason) => (try_response::Outcome::Rejected, reason),
    };
    Response::new(TryResponse {
        outcome: outcome as i32,
        reason,
    })
}

/// The wire answer to a Confirm or Cancel: the branch's state after the call.
pub fn branch_response(answer: BranchAnswer) -> Response<BranchResponse> {
    let state = match answer {
        BranchAnswer::Confirmed => branch::State::Confirmed,
        BranchAnswer::Cancelled => branch::State::Cancelled,
        BranchAnswer::HoldLost => branch::State::HoldLost,
    };
    Response::new(BranchResponse {
        state: state as i32,
    })
}

/// Converts a wire timestamp, truncated to microseconds (Postgres precision) so stored and
/// compared values agree.
fn timestamp(field: &str, ts: prost_types::Timestamp) -> Result<DateTime<Utc>, ResourceError> {
    let invalid = || ResourceError::invalid(field, "is not a valid timestamp");
    let nanos = u32::try_from(ts.nanos).map_err(|_| invalid())?;
    let at = DateTime::<Utc>::from_timestamp(ts.seconds, nanos).ok_or_else(invalid)?;
    DateTime::<Utc>::from_timestamp_micros(at.timestamp_micros()).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::check_try;
    use holdfast_proto::{Hold, Interval};

    fn ts(seconds: i64) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos: 0 }
    }

    fn hold(resource: &str, quantity: i64, during: Option<(i64, i64)>) -> Hold {
        Hold {
            participant: String::new(),
            resource: resource.to_owned(),
            quantity,
            during: during.map(|(start, end)| Interval {
                start: Some(ts(start)),
                end: Some(ts(end)),
            }),
        }
    }

    fn request(items: Vec<Hold>) -> TryRequest {
        TryRequest {
            reservation_id: "r-1".to_owned(),
            branch_id: "b-1".to_owned(),
            holder: "alice".to_owned(),
            items,
            expires_at: Some(ts(1_700_000_000)),
        }
    }

    /// Wire conversion, then the common checks: the error every participant answers with.
    fn refusal(req: TryRequest) -> String {
        let checked =
            try_branch(req).and_then(|b| check_try(b, crate::DEFAULT_MAX_HOLD, |_| Ok(())));
        match checked {
            Err(err) => err.to_string(),
            Ok(branch) => panic!("accepted {branch:?}"),
        }
    }

    #[test]
    fn bad_tries_are_refused_naming_the_field() {
        let mut no_expiry = request(vec![hold("a", 1, None)]);
        no_expiry.expires_at = None;
        assert_eq!(refusal(no_expiry), "expires_at is required");
        let mut bad_nanos = request(vec![hold("a", 1, None)]);
        bad_nanos.expires_at = Some(prost_types::Timestamp {
            seconds: 1,
            nanos: -1,
        });
        assert_eq!(refusal(bad_nanos), "expires_at is not a valid timestamp");
        // Year 9999: far past the default --max-hold of 24 h.
        let mut too_long = request(vec![hold("a", 1, None)]);
        too_long.expires_at = Some(ts(253_402_300_000));
        assert_eq!(
            refusal(too_long),
            "expires_at lies more than 86400s ahead, further than this participant holds (--max-hold)"
        );
        let mut no_reservation = request(vec![hold("a", 1, None)]);
        no_reservation.reservation_id.clear();
        assert_eq!(refusal(no_reservation), "reservation_id is required");
        let mut long_holder = request(vec![hold("a", 1, None)]);
        long_holder.holder = "h".repeat(129);
        assert_eq!(refusal(long_holder), "holder must be at most 128 bytes");
        assert_eq!(refusal(request(vec![])), "items must not be empty");
        assert_eq!(
            refusal(request(vec![hold("a", 0, None)])),
            "items[0].quantity must be >= 1"
        );
        assert_eq!(
            refusal(request(vec![hold("a", 1, Some((5, 5)))])),
            "items[0].during.end must be after during.start"
        );
        assert_eq!(
            refusal(request(vec![hold("a", 2, None), hold("a", 1, None)])),
            "items[1] duplicates items[0]"
        );
    }

    #[test]
    fn items_are_put_in_lock_order() {
        let req = request(vec![
            hold("b", 1, None),
            hold("a", 1, Some((5, 6))),
            hold("a", 1, Some((1, 2))),
        ]);
        let branch = check_try(
            try_branch(req).expect("converts"),
            crate::DEFAULT_MAX_HOLD,
            |_| Ok(()),
        )
        .expect("valid");
        let order: Vec<_> = branch
            .items
            .iter()
            .map(|i| (i.resource.as_str(), i.during.map(|s| s.start.timestamp())))
            .collect();
        assert_eq!(order, [("a", Some(1)), ("a", Some(5)), ("b", None)]);
    }

    #[test]
    fn branch_ids_are_checked() {
        let key = |reservation_id: &str, branch_id: &str| {
            branch_key(BranchRequest {
                reservation_id: reservation_id.to_owned(),
                branch_id: branch_id.to_owned(),
            })
            .map_err(|err| err.to_string())
        };
        assert!(key("r", "b").is_ok());
        assert_eq!(key("", "b").unwrap_err(), "reservation_id is required");
        assert_eq!(
            key("r", &"b".repeat(129)).unwrap_err(),
            "branch_id must be at most 128 bytes"
        );
    }
}
