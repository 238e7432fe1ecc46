//! The wire shape of Admin `ListQueue` (SPEC 11): its request and answer. (A Reserve's
//! `queue` and a reservation's `QueuePlace` are `convert.rs`'s, with the rest of theirs.)

use super::convert::{interval, timestamp};
use crate::domain::validate::{self, FieldError, Limits};
use crate::domain::waitlist::{QueueKey, QueuePage};
use crate::proto;

/// A `ListQueue` request: the queue, where to start (the page token is the last entry's
/// queue sequence), and how many.
pub(super) fn list_queue_request(
    req: &proto::ListQueueRequest,
    limits: &Limits,
) -> Result<(QueueKey, i64, u32), FieldError> {
    validate::identifier("participant", &req.participant, limits.max_id_bytes)?;
    validate::identifier("resource", &req.resource, limits.max_id_bytes)?;
    let during = req
        .during
        .as_ref()
        .map(|d| interval("during", d))
        .transpose()?;
    let after = match req.page_token.as_str() {
        "" => 0,
        t => t
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| FieldError::new("page_token", "is not a token this API gave"))?,
    };
    let size = match req.page_size {
        0 => 100,
        n @ 1..=500 => n.unsigned_abs(),
        _ => return Err(FieldError::new("page_size", "must be between 0 and 500")),
    };
    let key = QueueKey {
        participant: req.participant.clone(),
        resource: req.resource.clone(),
        during,
    };
    Ok((key, after, size))
}

/// A page of a queue, on the wire; the next page token is the last entry's sequence when the
/// page is full.
pub(super) fn list_queue_response(page: QueuePage, size: u32) -> proto::ListQueueResponse {
    let full = page.entries.len() == size as usize;
    let next_page_token = match page.entries.last() {
        Some(last) if full => last.seq.to_string(),
        _ => String::new(),
    };
    proto::ListQueueResponse {
        entries: page
            .entries
            .into_iter()
            .map(|e| proto::QueuedReservation {
                position: e.position,
                reservation_id: e.reservation_id.to_string(),
                holder: e.holder,
                quantity: e.quantity,
                since: Some(timestamp(e.since)),
                until: Some(timestamp(e.until)),
            })
            .collect(),
        next_page_token,
        length: page.length,
    }
}
