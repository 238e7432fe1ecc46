//! A late payment whose holds were all released: the holds are placed again as a new
//! generation of branches and confirmed, or, if any cannot be had, released and refunded.

use super::{Coordinator, Error, entered, faults, refund_recorded};
use crate::domain::{Reservation, State};

impl Coordinator {
    /// Honours a payment that arrived after every hold was released: places the holds again
    /// as new branches, in order; all held -> confirmed (`late_payment_honored`), otherwise
    /// releases what it re-took and refunds the payment.
    ///
    /// Each step's conditional write decides against recovery, which takes the reservation
    /// over (refund, release) if this retake outlives its lease: a retake that did not begin,
    /// or did not finish, has lost it and confirms nothing; the payment is being refunded.
    pub(super) async fn retake(&self, r: Reservation) -> Result<Reservation, Error> {
        let r = self.store.begin_retake(r.id).await?;
        faults::store("coord.begin_retake.after")?;
        if r.stored_state != State::Expired || r.refund.is_some() {
            return Err(taken_over(r));
        }
        let placement = self.place_in_order(&r).await?;
        match placement.failure {
            None => {
                faults::store("coord.finish_retake.before")?;
                let r = self.store.finish_retake(r.id, &placement.reports).await?;
                faults::store("coord.finish_retake.after")?;
                if r.stored_state != State::Confirming {
                    return Err(taken_over(r));
                }
                entered(&r, State::Confirming);
                self.drive_confirm(r).await
            }
            Some(failure) => {
                let reason = format!(
                    "the payment arrived after the hold expired and {} could no longer hold {}: {}",
                    failure.rejection.participant,
                    failure.rejection.resource,
                    failure.rejection.reason
                );
                let r = self
                    .store
                    .fail_retake(r.id, &placement.reports, &reason)
                    .await?;
                faults::store("coord.fail_retake.after")?;
                entered(&r, State::Cancelling);
                refund_recorded(&r);
                let r = self.drive_release(r).await?;
                let r = self.drive_refund(r).await?;
                Err(Error::HoldExpired {
                    id: r.id,
                    refund: r.refund,
                })
            }
        }
    }
}

/// The answer of a retake that recovery took over: the late payment is refunded.
fn taken_over(r: Reservation) -> Error {
    tracing::warn!(reservation_id = %r.id, state = %r.stored_state, "a late payment's retake was taken over by recovery; the payment is refunded");
    Error::HoldExpired {
        id: r.id,
        refund: r.refund,
    }
}
