//! The coordinator's domain: reservations, their branches, hold tokens, and the lifecycle
//! rules. Pure types and logic; no I/O, no prost, no SQL.

pub mod admin;
pub mod event;
mod field;
pub mod find;
pub mod lifecycle;
pub mod payments;
pub mod policy;
pub mod token;
pub mod validate;
pub mod waitlist;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use event::{Event, EventFilter, EventType};
pub use find::Find;
pub use lifecycle::{Decision, Verdict};
pub use payments::{PaymentRecord, PaymentState};
pub use token::{HoldToken, PresentedToken, TokenCheck, TokenKeys};
pub use validate::RequestId;

/// A reservation's global state (SPEC section 2).
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
    /// Waiting in a waitlist: nothing held (SPEC 11).
    Queued,
}

impl State {
    /// All states, for parsing and tests.
    pub const ALL: [State; 10] = [
        State::Trying,
        State::Held,
        State::Confirming,
        State::Confirmed,
        State::Cancelling,
        State::Cancelled,
        State::Expired,
        State::Rejected,
        State::Failed,
        State::Queued,
    ];

    /// The name stored in the database and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Trying => "TRYING",
            State::Held => "HELD",
            State::Confirming => "CONFIRMING",
            State::Confirmed => "CONFIRMED",
            State::Cancelling => "CANCELLING",
            State::Cancelled => "CANCELLED",
            State::Expired => "EXPIRED",
            State::Rejected => "REJECTED",
            State::Failed => "FAILED",
            State::Queued => "QUEUED",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Terminal states never change again (except the honoured late payment out of EXPIRED).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            State::Confirmed | State::Cancelled | State::Expired | State::Rejected | State::Failed
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of one hold at its participant, as the coordinator knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BranchState {
    Pending,
    Held,
    Rejected,
    Confirmed,
    Cancelled,
    HoldLost,
}

impl BranchState {
    const ALL: [BranchState; 6] = [
        BranchState::Pending,
        BranchState::Held,
        BranchState::Rejected,
        BranchState::Confirmed,
        BranchState::Cancelled,
        BranchState::HoldLost,
    ];

    /// The name stored in the database and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            BranchState::Pending => "PENDING",
            BranchState::Held => "HELD",
            BranchState::Rejected => "REJECTED",
            BranchState::Confirmed => "CONFIRMED",
            BranchState::Cancelled => "CANCELLED",
            BranchState::HoldLost => "HOLD_LOST",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<BranchState> {
        BranchState::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// A half-open time slot `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// One thing to hold at one participant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hold {
    pub participant: String,
    pub resource: String,
    pub quantity: i64,
    pub during: Option<Interval>,
}

impl Hold {
    /// The canonical placement order: participant, then resource (then slot, for rooms).
    pub fn canonical_key(&self) -> (&str, &str, Option<Interval>) {
        (&self.participant, &self.resource, self.during)
    }
}

/// A hold as recorded in a reservation, with its progress at the participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Branch {
    /// The participant-level branch id (shared by all of one participant's holds).
    pub branch_id: Uuid,
    pub hold: Hold,
    pub state: BranchState,
    pub attempts: i32,
    pub last_error: Option<String>,
}

/// Why a reservation was rejected: the first hold that could not be placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub participant: String,
    pub resource: String,
    pub reason: String,
}

/// A payment made outside the coordinator for a reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payment {
    /// The registered payment participant that can refund it.
    pub participant: String,
    pub payment_ref: String,
    pub amount_minor: i64,
    pub currency: String,
}

/// Whether a refund was acknowledged by the payment participant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundState {
    /// Recorded, not acknowledged yet: sent until it is (with backoff).
    Pending,
    Refunded,
    /// Refused for good by the payment participant: parked, not retried (SPEC 8.1).
    Failed,
}

impl RefundState {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundState::Pending => "PENDING",
            RefundState::Refunded => "REFUNDED",
            RefundState::Failed => "FAILED",
        }
    }

    pub fn parse(s: &str) -> Option<RefundState> {
        match s {
            "PENDING" => Some(RefundState::Pending),
            "REFUNDED" => Some(RefundState::Refunded),
            "FAILED" => Some(RefundState::Failed),
            _ => None,
        }
    }
}

/// The one refund of a reservation's payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    /// Idempotency key sent to `tcc.v1.Payments/Refund`.
    pub refund_id: Uuid,
    pub state: RefundState,
    pub amount_minor: i64,
    pub currency: String,
    pub reason: String,
    /// Why the payment participant refused it (`Failed` only).
    pub failure: Option<String>,
}

/// A further payment cited by a Confirm of a reservation whose payment was settled already
/// (it is confirmed, with another payment or none, or its payment was refunded): never
/// dropped, always refunded in full (SPEC 7.3). Sent to the payment participant until
/// acknowledged, like the reservation's own refund.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraPayment {
    pub payment: Payment,
    pub refund: Refund,
}

/// What to do with a payment that arrives after the hold expired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LatePaymentPolicy {
    /// Honour it if every resource can still be had by this reservation; refund otherwise.
    #[default]
    HonorIfAvailable,
    /// Always refund it.
    Refund,
}

/// A reservation as stored, with the state every reader should see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: Uuid,
    pub request_id: String,
    pub holder: String,
    /// The state readers see: a `HELD` reservation whose `expires_at` passed (database clock)
    /// reads as `EXPIRED` even before the reaper releases it.
    pub state: State,
    /// The state as stored.
    pub stored_state: State,
    /// Where a `CANCELLING` reservation ends.
    pub release_outcome: Option<State>,
    /// The principal that created it (SPEC 7.2); empty when authentication was off.
    pub owner: String,
    /// What verifies its hold token (the token itself is never stored).
    pub token: TokenCheck,
    pub ttl: Duration,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub extensions_used: i32,
    pub labels: BTreeMap<String, String>,
    pub branches: Vec<Branch>,
    pub rejection: Option<Rejection>,
    pub late_payment_honored: bool,
    pub version: i64,
    /// The payment given to Confirm, if any.
    pub payment: Option<Payment>,
    pub refund: Option<Refund>,
    /// Which placement of the holds `branches` describes (a late payment re-places them).
    pub generation: i32,
    /// Operator actions on it, oldest first: filled for Get/List/Watch and the Admin answers
    /// (`Coordinator::with_audit`), empty as the store's writes answer it.
    pub audit: Vec<admin::AuditEntry>,
    /// Its further payments (each refunded), oldest first, once read
    /// (`Coordinator::with_payments`); `None` as the store's writes answer it, and `Some`
    /// empty where none can exist (see [`Reservation::payments`]).
    pub further_payments: Option<Vec<ExtraPayment>>,
    /// Where it waits, while `QUEUED`: filled for the Reserve and Get answers
    /// (`Coordinator::with_queue`), `None` as the store answers it.
    pub queue: Option<waitlist::QueuePlace>,
}

impl Reservation {
    /// Whether it exists for a caller restricted to `scope`'s reservations (`None`: anyone's).
    /// SPEC 7.2: another principal's reservation reads as not found.
    pub fn visible_to(&self, scope: Option<&str>) -> bool {
        scope.is_none_or(|owner| owner == self.owner)
    }

    /// The branches grouped per participant, in canonical order: one TCC branch each.
    pub fn participant_branches(&self) -> Vec<ParticipantBranch> {
        let mut out: Vec<ParticipantBranch> = Vec::new();
        for b in &self.branches {
            match out.last_mut() {
                Some(last) if last.branch_id == b.branch_id => last.holds.push(b.hold.clone()),
                _ => out.push(ParticipantBranch {
                    branch_id: b.branch_id,
                    participant: b.hold.participant.clone(),
                    holds: vec![b.hold.clone()],
                    state: b.state,
                }),
            }
        }
        out
    }
}

/// One participant's share of a reservation: what one Try/Confirm/Cancel call covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParticipantBranch {
    pub branch_id: Uuid,
    pub participant: String,
    /// Sorted by resource.
    pub holds: Vec<Hold>,
    pub state: BranchState,
}

/// A validated Reserve request, holds in canonical order, with the id it will be recorded
/// under, its owner and what verifies its hold token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewReservation {
    pub id: Uuid,
    /// The principal making the request; with `holder` and `request_id` the idempotency key.
    pub owner: String,
    pub token: TokenCheck,
    pub request_id: RequestId,
    pub holder: String,
    pub ttl: Duration,
    pub holds: Vec<Hold>,
    pub labels: BTreeMap<String, String>,
    /// How long it may wait in a waitlist when refused for capacity (`queue.wait_up_to`);
    /// `None`: it is rejected instead. Carried by the Reserve, not stored with the row.
    pub queue_wait: Option<Duration>,
}

impl NewReservation {
    /// What hold limits count by, and Reserves are serialised on: the owner's holder.
    pub fn limit_key(&self) -> String {
        format!("{}\u{1f}{}", self.owner, self.holder)
    }

    /// Whether an existing reservation was created from the same request body (for idempotency).
    pub fn same_body_as(&self, r: &Reservation) -> bool {
        self.request_id.as_str() == r.request_id
            && self.holder == r.holder
            && self.ttl == r.ttl
            && self.labels == r.labels
            && self.holds.len() == r.branches.len()
            && self
                .holds
                .iter()
                .zip(&r.branches)
                .all(|(h, b)| *h == b.hold)
    }
}

/// Who is asking, as the lifecycle sees it (SPEC 7.2): the principal a new reservation belongs
/// to, and whether it may see other principals' reservations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// The principal's name; empty when authentication is off.
    pub principal: String,
    /// An admin (or anyone, with authentication off) sees every reservation.
    pub sees_all: bool,
}

impl Actor {
    /// Authentication off: one anonymous caller who may do everything.
    pub fn anonymous() -> Actor {
        Actor {
            principal: String::new(),
            sees_all: true,
        }
    }

    /// Whether `r` exists for this actor: its own, or any for an admin.
    pub fn sees(&self, r: &Reservation) -> bool {
        r.visible_to(self.scope())
    }

    /// The owner a store query is restricted to (`None`: unrestricted).
    pub fn scope(&self) -> Option<&str> {
        (!self.sees_all).then_some(self.principal.as_str())
    }
}

/// A participant's answer to Try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TryOutcome {
    Held,
    Rejected {
        reason: String,
    },
    /// The participant found the request malformed (gRPC `INVALID_ARGUMENT`) and applied
    /// nothing. `field` is the field it named, in its own terms (`items[0].quantity`,
    /// `expires_at`), when it named one.
    Invalid {
        field: Option<String>,
        problem: String,
    },
}

/// A participant's answer to Confirm or Cancel: the branch's final state there afterwards
/// (SPEC 3.3). Confirm answers `Confirmed`, `HoldLost` (the hold was gone) or `Cancelled`
/// (refused: Cancel came first); Cancel answers `Cancelled` or `Confirmed` (refused: Confirm
/// came first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchOutcome {
    Confirmed,
    Cancelled,
    HoldLost,
}

/// Filters and paging for listing reservations.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    /// Only this principal's reservations (`None`: everyone's, for an admin).
    pub owner: Option<String>,
    pub holder: Option<String>,
    pub state: Option<State>,
    pub limit: u32,
    /// Keyset cursor: list strictly after this (created_at, id), newest first.
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Only reservations with a branch at this participant.
    pub participant: Option<String>,
    /// Only reservations created at or after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only reservations created before this instant.
    pub created_before: Option<DateTime<Utc>>,
    /// Only reservations carrying every one of these labels with these values.
    pub labels: BTreeMap<String, String>,
    /// A lookup answered instead of the filters above (which must then be unset): ids by
    /// prefix in id order (`after`'s id the cursor), or by request id, newest first.
    pub find: Option<Find>,
}
