//! The values of the API, typed: what a caller builds ([`Reserve`], [`Hold`], [`Payment`],
//! [`ListFilter`]) and what it reads ([`Reservation`], [`Branch`], [`Refund`], ...), converted
//! from and to the generated `tcc.v1` messages.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use crate::{Error, proto};

/// One thing to hold at one participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub participant: String,
    pub resource: String,
    /// Units; 1 for seats and rooms, minor units for payments.
    pub quantity: i64,
    /// A time slot, for slot resources such as rooms.
    pub during: Option<Range<SystemTime>>,
}

impl Hold {
    /// One unit of `resource` at `participant`.
    pub fn new(participant: impl Into<String>, resource: impl Into<String>) -> Hold {
        Hold {
            participant: participant.into(),
            resource: resource.into(),
            quantity: 1,
            during: None,
        }
    }

    /// `quantity` units instead of one.
    pub fn quantity(mut self, quantity: i64) -> Hold {
        self.quantity = quantity;
        self
    }

    /// For the slot `during`.
    pub fn during(mut self, during: Range<SystemTime>) -> Hold {
        self.during = Some(during);
        self
    }
}

/// A Reserve request: idempotent on (`holder`, `request_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserve {
    pub request_id: String,
    pub holder: String,
    /// Default: the coordinator's (10 minutes).
    pub ttl: Option<Duration>,
    pub holds: Vec<Hold>,
    pub labels: BTreeMap<String, String>,
    /// Wait up to this long in the resource's waitlist when it is sold out (the reservation
    /// is then `QUEUED`, and `HELD` once an offer places it); `None`: refused instead.
    pub queue: Option<Duration>,
}

impl Reserve {
    /// A Reserve by `holder` under the idempotency key `request_id`; add holds with
    /// [`Reserve::hold`].
    pub fn new(request_id: impl Into<String>, holder: impl Into<String>) -> Reserve {
        Reserve {
            request_id: request_id.into(),
            holder: holder.into(),
            ttl: None,
            holds: Vec::new(),
            labels: BTreeMap::new(),
            queue: None,
        }
    }

    /// When sold out, wait in the waitlist up to `wait_up_to` instead of being refused.
    pub fn queue(mut self, wait_up_to: Duration) -> Reserve {
        self.queue = Some(wait_up_to);
        self
    }

    pub fn hold(mut self, hold: Hold) -> Reserve {
        self.holds.push(hold);
        self
    }

    pub fn ttl(mut self, ttl: Duration) -> Reserve {
        self.ttl = Some(ttl);
        self
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Reserve {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub(crate) fn into_proto(self) -> proto::ReserveRequest {
        proto::ReserveRequest {
            request_id: self.request_id,
            holder: self.holder,
            ttl: self.ttl.map(duration),
            holds: self
                .holds
                .into_iter()
                .map(|h| proto::Hold {
                    participant: h.participant,
                    resource: h.resource,
                    quantity: h.quantity,
                    during: h.during.map(|d| proto::Interval {
                        start: Some(timestamp(d.start)),
                        end: Some(timestamp(d.end)),
                    }),
                })
                .collect(),
            labels: self.labels.into_iter().collect(),
            queue: self.queue.map(|w| proto::QueueOptions {
                wait_up_to: Some(duration(w)),
            }),
        }
    }
}

/// The secret that Confirms, Cancels and Extends a reservation. Its `Debug` hides it: keep
/// it out of logs.
#[derive(Clone, PartialEq, Eq)]
pub struct HoldToken(String);

impl HoldToken {
    /// A token kept elsewhere (e.g. in the caller's session) and handed back.
    pub fn new(token: impl Into<String>) -> HoldToken {
        HoldToken(token.into())
    }

    /// The token itself, to store it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for HoldToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldToken(***)")
    }
}

/// The answer to Reserve: the reservation and its token.
#[derive(Clone, Debug)]
pub struct Reserved {
    pub reservation: Reservation,
    pub hold_token: HoldToken,
}

impl Reserved {
    pub(crate) fn from_proto(mut r: proto::Reservation) -> Result<Reserved, Error> {
        let hold_token = HoldToken(std::mem::take(&mut r.hold_token));
        Ok(Reserved {
            reservation: Reservation::from_proto(r)?,
            hold_token,
        })
    }
}

/// A payment made for a reservation outside the coordinator (Confirm with payment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payment {
    pub participant: String,
    pub payment_ref: String,
    pub amount_minor: i64,
    pub currency: String,
}

impl Payment {
    pub(crate) fn into_proto(self) -> proto::Payment {
        proto::Payment {
            participant: self.participant,
            payment_ref: self.payment_ref,
            amount_minor: self.amount_minor,
            currency: self.currency,
        }
    }
}

/// A reservation's lifecycle state (SPEC 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Trying,
    Held,
    Confirming,
    Confirmed,
    Cancelling,
    Cancelled,
    Expired,
    Rejected,
    Failed,
    /// Waiting in a waitlist; nothing is held.
    Queued,
}

impl State {
    /// Whether it never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            State::Confirmed | State::Cancelled | State::Expired | State::Rejected | State::Failed
        )
    }

    fn from_proto(s: proto::reservation::State) -> Option<State> {
        use proto::reservation::State as P;
        Some(match s {
            P::Unspecified => return None,
            P::Trying => State::Trying,
            P::Held => State::Held,
            P::Confirming => State::Confirming,
            P::Confirmed => State::Confirmed,
            P::Cancelling => State::Cancelling,
            P::Cancelled => State::Cancelled,
            P::Expired => State::Expired,
            P::Rejected => State::Rejected,
            P::Failed => State::Failed,
            P::Queued => State::Queued,
        })
    }

    pub(crate) fn into_proto(self) -> proto::reservation::State {
        use proto::reservation::State as P;
        match self {
            State::Trying => P::Trying,
            State::Held => P::Held,
            State::Confirming => P::Confirming,
            State::Confirmed => P::Confirmed,
            State::Cancelling => P::Cancelling,
            State::Cancelled => P::Cancelled,
            State::Expired => P::Expired,
            State::Rejected => P::Rejected,
            State::Failed => P::Failed,
            State::Queued => P::Queued,
        }
    }
}

/// A branch's state at its participant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BranchState {
    Pending,
    Held,
    Rejected,
    Confirmed,
    Cancelled,
    HoldLost,
}

/// One hold of a reservation, as placed at its participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Branch {
    pub hold: Hold,
    pub state: BranchState,
    /// Calls made in the current phase (grows with retries).
    pub attempts: u32,
    pub last_error: Option<String>,
}

/// Why a reservation was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub participant: String,
    pub resource: String,
    pub reason: String,
}

/// A refund's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefundState {
    Pending,
    Refunded,
    Failed,
}

/// A refund of a payment that could not be honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    pub refund_id: String,
    pub state: RefundState,
    pub amount_minor: i64,
    pub currency: String,
    pub failure_reason: Option<String>,
}

/// An operator action on the reservation (tcc.v1.Admin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    pub principal: String,
    pub at: SystemTime,
    pub action: String,
    pub reason: String,
}

/// A reservation as the coordinator reports it (never with its token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: Uuid,
    pub request_id: String,
    pub holder: String,
    pub state: State,
    pub created_at: SystemTime,
    pub expires_at: SystemTime,
    pub extensions_used: u32,
    pub branches: Vec<Branch>,
    pub rejection: Option<Rejection>,
    pub refund: Option<Refund>,
    pub late_payment_honored: bool,
    pub labels: BTreeMap<String, String>,
    pub audit: Vec<AuditEntry>,
    /// Where it waits, while `QUEUED` (answered by Reserve and get).
    pub queue: Option<QueuePlace>,
}

/// Where a `QUEUED` reservation waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// 1 for the next to be offered.
    pub position: i64,
    pub participant: String,
    pub resource: String,
    pub since: SystemTime,
    /// Its wait ends then: `REJECTED` with reason `QUEUE_WAIT_ENDED`.
    pub until: SystemTime,
}

impl Reservation {
    pub(crate) fn from_answer(
        answer: Result<tonic::Response<proto::Reservation>, tonic::Status>,
    ) -> Result<Reservation, Error> {
        match answer {
            Ok(r) => Reservation::from_proto(r.into_inner()),
            Err(status) => Err(Error::from_status(&status)),
        }
    }

    pub(crate) fn from_proto(r: proto::Reservation) -> Result<Reservation, Error> {
        let bad = || Error::malformed("reservation");
        let state = State::from_proto(r.state()).ok_or_else(bad)?;
        let branches = r
            .branches
            .into_iter()
            .map(Branch::from_proto)
            .collect::<Result<Vec<_>, Error>>()?;
        let refund = r.refund.map(Refund::from_proto).transpose()?;
        let audit = r
            .audit
            .into_iter()
            .map(|a| {
                Ok(AuditEntry {
                    principal: a.principal,
                    at: time(a.at)?,
                    action: a.action,
                    reason: a.reason,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Reservation {
            id: Uuid::parse_str(&r.id).map_err(|_| bad())?,
            request_id: r.request_id,
            holder: r.holder,
            state,
            created_at: time(r.created_at)?,
            expires_at: time(r.expires_at)?,
            extensions_used: u32::try_from(r.extensions_used).unwrap_or(0),
            branches,
            rejection: r.rejection.map(|x| Rejection {
                participant: x.participant,
                resource: x.resource,
                reason: x.reason,
            }),
            refund,
            late_payment_honored: r.late_payment_honored,
            labels: r.labels.into_iter().collect(),
            audit,
            queue: r
                .queue
                .map(|q| {
                    Ok::<_, Error>(QueuePlace {
                        position: q.position,
                        participant: q.participant,
                        resource: q.resource,
                        since: time(q.since)?,
                        until: time(q.until)?,
                    })
                })
                .transpose()?,
        })
    }
}

impl Branch {
    fn from_proto(b: proto::Branch) -> Result<Branch, Error> {
        use proto::branch::State as P;
        let state = match b.state() {
            P::Unspecified => return Err(Error::malformed("reservation")),
            P::Pending => BranchState::Pending,
            P::Held => BranchState::Held,
            P::Rejected => BranchState::Rejected,
            P::Confirmed => BranchState::Confirmed,
            P::Cancelled => BranchState::Cancelled,
            P::HoldLost => BranchState::HoldLost,
        };
        let during = match b.during {
            Some(d) => Some(time(d.start)?..time(d.end)?),
            None => None,
        };
        Ok(Branch {
            hold: Hold {
                participant: b.participant,
                resource: b.resource,
                quantity: b.quantity,
                during,
            },
            state,
            attempts: u32::try_from(b.attempts).unwrap_or(0),
            last_error: Some(b.last_error).filter(|e| !e.is_empty()),
        })
    }
}

impl Refund {
    fn from_proto(x: proto::Refund) -> Result<Refund, Error> {
        use proto::refund::State as P;
        let state = match x.state() {
            P::Unspecified => return Err(Error::malformed("reservation")),
            P::Pending => RefundState::Pending,
            P::Refunded => RefundState::Refunded,
            P::Failed => RefundState::Failed,
        };
        Ok(Refund {
            refund_id: x.refund_id,
            state,
            amount_minor: x.amount_minor,
            currency: x.currency,
            failure_reason: Some(x.failure_reason).filter(|e| !e.is_empty()),
        })
    }
}

/// Which reservations [`crate::Client::list`] answers (all conditions must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub holder: Option<String>,
    pub state: Option<State>,
    pub participant: Option<String>,
    pub created_after: Option<SystemTime>,
    pub created_before: Option<SystemTime>,
    pub labels: BTreeMap<String, String>,
    /// 0 means the server's default (50).
    pub page_size: u32,
    /// From the previous [`Page::next_page_token`].
    pub page_token: Option<String>,
    /// A lookup instead of the filters above: ids starting with these 4 to 32 hex digits, in
    /// id order.
    pub id_prefix: Option<String>,
    /// A lookup instead of the filters above: the reservations made with this request id.
    pub request_id: Option<String>,
}

impl ListFilter {
    pub(crate) fn into_proto(self) -> proto::ListReservationsRequest {
        proto::ListReservationsRequest {
            holder: self.holder.unwrap_or_default(),
            state: self.state.map_or(0, |s| s.into_proto() as i32),
            page_size: i32::try_from(self.page_size).unwrap_or(i32::MAX),
            page_token: self.page_token.unwrap_or_default(),
            participant: self.participant.unwrap_or_default(),
            created_after: self.created_after.map(timestamp),
            created_before: self.created_before.map(timestamp),
            labels: self.labels.into_iter().collect(),
            id_prefix: self.id_prefix.unwrap_or_default(),
            request_id: self.request_id.unwrap_or_default(),
        }
    }
}

/// One page of [`crate::Client::list`].
#[derive(Clone, Debug)]
pub struct Page {
    pub reservations: Vec<Reservation>,
    /// Pass to [`ListFilter::page_token`] for the next page; `None` on the last.
    pub next_page_token: Option<String>,
}

impl Page {
    pub(crate) fn from_proto(p: proto::ListReservationsResponse) -> Result<Page, Error> {
        Ok(Page {
            reservations: p
                .reservations
                .into_iter()
                .map(Reservation::from_proto)
                .collect::<Result<_, _>>()?,
            next_page_token: Some(p.next_page_token).filter(|t| !t.is_empty()),
        })
    }
}

pub(crate) fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub(crate) fn time(t: Option<prost_types::Timestamp>) -> Result<SystemTime, Error> {
    let t = t.ok_or_else(|| Error::malformed("timestamp"))?;
    SystemTime::try_from(t).map_err(|_| Error::malformed("timestamp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_never_shows_in_debug_output() {
        let t = HoldToken::new("hf1.secret");
        assert_eq!(format!("{t:?}"), "HoldToken(***)");
        assert_eq!(t.expose(), "hf1.secret");
    }

    #[test]
    fn an_answer_without_a_state_or_times_is_an_error_not_a_default() {
        let r = proto::Reservation {
            id: Uuid::nil().to_string(),
            state: proto::reservation::State::Held as i32,
            ..Default::default()
        };
        assert!(Reservation::from_proto(r).is_err());
    }
}
