//! The stored shape of a reservation, shared by every backend: each backend reads its rows into
//! these plain values (its own column types converted), and one function turns them into the
//! domain type, so what a stored row means is written once.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::domain::{
    Branch, BranchState, Hold, Interval, Payment, Refund, RefundState, Rejection, Reservation,
    State, TokenCheck,
};

/// A `reservations` row, backend-neutral.
pub(crate) struct StoredReservation {
    pub id: Uuid,
    pub request_id: String,
    pub holder: String,
    pub state: String,
    pub release_outcome: Option<String>,
    pub owner: String,
    /// `None` only for a row an earlier version wrote, before `migrate` replaced its token.
    pub token_digest: Option<Vec<u8>>,
    pub token_key_id: Option<String>,
    pub ttl_ms: i64,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub extensions_used: i32,
    pub labels: BTreeMap<String, String>,
    pub rejection_participant: Option<String>,
    pub rejection_resource: Option<String>,
    pub rejection_reason: Option<String>,
    pub late_payment_honored: bool,
    pub version: i64,
    pub payment_participant: Option<String>,
    pub payment_ref: Option<String>,
    pub payment_amount_minor: Option<i64>,
    pub payment_currency: Option<String>,
    pub refund_id: Option<Uuid>,
    pub refund_state: Option<String>,
    pub refund_reason: Option<String>,
    pub refund_failure: Option<String>,
    pub generation: i32,
    /// HELD with `expires_at` passed by the database clock, computed by the reading query.
    pub lapsed: bool,
}

/// A `branches` row, backend-neutral.
pub(crate) struct StoredBranch {
    pub branch_id: Uuid,
    pub participant: String,
    pub resource: String,
    pub quantity: i64,
    pub during_start: Option<DateTime<Utc>>,
    pub during_end: Option<DateTime<Utc>>,
    pub state: String,
    pub attempts: i32,
    pub last_error: Option<String>,
}

pub(crate) fn parse_state(s: &str) -> Result<State, StoreError> {
    State::parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown reservation state {s:?}")))
}

impl StoredBranch {
    pub(crate) fn into_domain(self) -> Result<Branch, StoreError> {
        let state = BranchState::parse(&self.state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown branch state {:?}", self.state)))?;
        let during = match (self.during_start, self.during_end) {
            (Some(start), Some(end)) => Some(Interval { start, end }),
            _ => None,
        };
        Ok(Branch {
            branch_id: self.branch_id,
            hold: Hold {
                participant: self.participant,
                resource: self.resource,
                quantity: self.quantity,
                during,
            },
            state,
            attempts: self.attempts,
            last_error: self.last_error,
        })
    }
}

impl StoredReservation {
    /// The domain reservation; a lapsed HELD one reads as EXPIRED (lazy expiry).
    pub(crate) fn into_domain(self, branches: Vec<Branch>) -> Result<Reservation, StoreError> {
        let stored_state = parse_state(&self.state)?;
        let release_outcome = self
            .release_outcome
            .as_deref()
            .map(parse_state)
            .transpose()?;
        let rejection = rejection_of(
            self.rejection_participant,
            self.rejection_resource,
            self.rejection_reason,
        );
        let payment = payment_of(
            self.payment_participant,
            self.payment_ref,
            self.payment_amount_minor,
            self.payment_currency,
        );
        let refund = refund_of(
            self.refund_id,
            self.refund_state.as_deref(),
            payment.as_ref(),
            self.refund_reason,
            self.refund_failure,
        )?;
        let token = self
            .token_digest
            .as_deref()
            .and_then(|d| TokenCheck::from_stored(d, self.token_key_id))
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "reservation {}: no usable token digest (run the migrations)",
                    self.id
                ))
            })?;
        Ok(Reservation {
            id: self.id,
            request_id: self.request_id,
            holder: self.holder,
            state: if self.lapsed {
                State::Expired
            } else {
                stored_state
            },
            stored_state,
            release_outcome,
            owner: self.owner,
            token,
            ttl: Duration::from_millis(u64::try_from(self.ttl_ms).unwrap_or(0)),
            created_at: self.created_at,
            expires_at: self.expires_at,
            extensions_used: self.extensions_used,
            labels: self.labels,
            branches,
            rejection,
            late_payment_honored: self.late_payment_honored,
            version: self.version,
            payment,
            refund,
            generation: self.generation,
            audit: Vec::new(),
            further_payments: None,
            queue: None,
        })
    }
}

/// The rejection a row records: a participant and resource, the reason possibly empty.
fn rejection_of(
    participant: Option<String>,
    resource: Option<String>,
    reason: Option<String>,
) -> Option<Rejection> {
    match (participant, resource, reason) {
        (Some(participant), Some(resource), reason) => Some(Rejection {
            participant,
            resource,
            reason: reason.unwrap_or_default(),
        }),
        _ => None,
    }
}

/// The payment a row records: all four columns, or none.
fn payment_of(
    participant: Option<String>,
    payment_ref: Option<String>,
    amount_minor: Option<i64>,
    currency: Option<String>,
) -> Option<Payment> {
    match (participant, payment_ref, amount_minor, currency) {
        (Some(participant), Some(payment_ref), Some(amount_minor), Some(currency)) => {
            Some(Payment {
                participant,
                payment_ref,
                amount_minor,
                currency,
            })
        }
        _ => None,
    }
}

/// The refund a row records, of its payment's amount; only with a payment.
fn refund_of(
    refund_id: Option<Uuid>,
    state: Option<&str>,
    payment: Option<&Payment>,
    reason: Option<String>,
    failure: Option<String>,
) -> Result<Option<Refund>, StoreError> {
    let (Some(refund_id), Some(state), Some(p)) = (refund_id, state, payment) else {
        return Ok(None);
    };
    Ok(Some(Refund {
        refund_id,
        state: RefundState::parse(state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown refund state {state:?}")))?,
        amount_minor: p.amount_minor,
        currency: p.currency.clone(),
        reason: reason.unwrap_or_default(),
        failure,
    }))
}
