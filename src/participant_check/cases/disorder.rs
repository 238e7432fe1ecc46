//! Calls out of order and for branches the participant never saw: a Cancel before its Try
//! (the late Try is `REJECTED` and holds nothing), Confirm after Cancel and Cancel after
//! Confirm (refused: the first decision's state is answered and nothing changes), Confirm
//! and Extend of an unknown branch (`HOLD_LOST`).

use super::{Ctx, Step};
use crate::participant_check::subject::from_now;
use crate::proto::branch::State;
use crate::proto::try_response::Outcome;

/// Cancel of a branch never tried answers CANCELLED; its late Try (and a repeat) REJECTED;
/// nothing is held.
pub(crate) async fn cancel_before_try(c: &mut Ctx<'_>) -> Step {
    let b = c.branch();
    let got = c.cancel(&b).await;
    c.expect_state("Cancel", got, State::Cancelled)?;
    c.expect_try("late Try", &b, Outcome::Rejected).await?;
    c.expect_try("repeated late Try", &b, Outcome::Rejected)
        .await?;
    c.expect_counts("after", 0, 0).await?;
    let got = c.confirm(&b).await;
    c.expect_state("Confirm", got, State::Cancelled)?;
    c.expect_counts("after Confirm", 0, 0).await
}

/// Try, Cancel, then Confirm: answered CANCELLED, nothing confirmed.
pub(crate) async fn confirm_after_cancel(c: &mut Ctx<'_>) -> Step {
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    let got = c.cancel(&b).await;
    c.expect_state("Cancel", got, State::Cancelled)?;
    let got = c.confirm(&b).await;
    c.expect_state("Confirm", got, State::Cancelled)?;
    c.expect_counts("after", 0, 0).await
}

/// Try, Confirm, then Cancel: answered CONFIRMED, the units stay confirmed.
pub(crate) async fn cancel_after_confirm(c: &mut Ctx<'_>) -> Step {
    let q = c.quantity();
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    let got = c.confirm(&b).await;
    c.expect_state("Confirm", got, State::Confirmed)?;
    let got = c.cancel(&b).await;
    c.expect_state("Cancel", got, State::Confirmed)?;
    c.expect_counts("after", 0, q).await
}

/// Confirm and Extend of branches the participant never saw answer HOLD_LOST (a repeat the
/// same); nothing is held.
pub(crate) async fn unknown_branch(c: &mut Ctx<'_>) -> Step {
    let b = c.branch();
    let got = c.confirm(&b).await;
    c.expect_state("Confirm", got, State::HoldLost)?;
    let got = c.confirm(&b).await;
    c.expect_state("repeated Confirm", got, State::HoldLost)?;
    let other = c.branch();
    let got = c
        .extend(&other, from_now(chrono::Duration::minutes(10)))
        .await;
    c.expect_state("Extend", got, State::HoldLost)?;
    c.expect_counts("after", 0, 0).await
}
