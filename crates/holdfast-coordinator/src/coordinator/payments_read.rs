//! A reservation's money trail for its answer (SPEC 3.1 `Reservation.payments`): its further
//! payments read from the store, in one read for a page, and only for reservations that may
//! have any - a `TRYING` or `HELD` one cannot, nor one this call just decided out of `HELD`.

use std::collections::HashMap;

use uuid::Uuid;

use super::{Coordinator, Error};
use crate::domain::{ExtraPayment, Reservation};

impl Coordinator {
    /// Fills each reservation's further payments (oldest first) where they are not known yet,
    /// in one store read; no read when none may have any.
    pub async fn with_payments(&self, mut rs: Vec<Reservation>) -> Result<Vec<Reservation>, Error> {
        let ids: Vec<Uuid> = rs
            .iter()
            .filter(|r| r.may_have_further_payments())
            .map(|r| r.id)
            .collect();
        if ids.is_empty() {
            return Ok(rs);
        }
        let mut by_id: HashMap<Uuid, Vec<ExtraPayment>> = HashMap::new();
        for (id, extra) in self.store.further_payments_of(&ids).await? {
            by_id.entry(id).or_default().push(extra);
        }
        for r in rs.iter_mut().filter(|r| r.may_have_further_payments()) {
            r.further_payments = Some(by_id.remove(&r.id).unwrap_or_default());
        }
        Ok(rs)
    }

    /// One reservation with its further payments.
    pub async fn with_payments_one(&self, r: Reservation) -> Result<Reservation, Error> {
        let mut rs = self.with_payments(vec![r]).await?;
        rs.pop().ok_or_else(|| {
            Error::Internal("a reservation went missing while reading its payments".into())
        })
    }
}

/// `r` as answered by the call that decided it out of `HELD`: when that decision was taken it
/// had no further payment (they are recorded only once a reservation left `HELD`), so none is
/// read for the answer.
pub(super) fn decided_from_held(mut r: Reservation) -> Reservation {
    r.further_payments.get_or_insert_with(Vec::new);
    r
}
