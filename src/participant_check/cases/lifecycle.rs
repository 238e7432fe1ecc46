//! First calls and their repeats: Try then Confirm, Try then Cancel, every call sent twice
//! (a repeat has no further effect and answers the first answer), and Extend of a held
//! branch.

use super::{Ctx, Step};
use crate::participant_check::subject::from_now;
use crate::proto::branch::State;
use crate::proto::try_response::Outcome;

/// Try HELD, Confirm CONFIRMED; the units move from held to confirmed.
pub(crate) async fn try_confirm(c: &mut Ctx<'_>) -> Step {
    let q = c.quantity();
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    c.expect_counts("after Try", q, 0).await?;
    let got = c.confirm(&b).await;
    c.expect_state("Confirm", got, State::Confirmed)?;
    c.expect_counts("after Confirm", 0, q).await
}

/// Try HELD, Cancel CANCELLED; nothing held after.
pub(crate) async fn try_cancel(c: &mut Ctx<'_>) -> Step {
    let q = c.quantity();
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    c.expect_counts("after Try", q, 0).await?;
    let got = c.cancel(&b).await;
    c.expect_state("Cancel", got, State::Cancelled)?;
    c.expect_counts("after Cancel", 0, 0).await
}

/// Try twice holds once; Cancel twice answers CANCELLED twice and releases once.
pub(crate) async fn repeat_try_cancel(c: &mut Ctx<'_>) -> Step {
    let q = c.quantity();
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    c.expect_try("repeated Try", &b, Outcome::Held).await?;
    c.expect_counts("after both", q, 0).await?;
    let got = c.cancel(&b).await;
    c.expect_state("Cancel", got, State::Cancelled)?;
    let got = c.cancel(&b).await;
    c.expect_state("repeated Cancel", got, State::Cancelled)?;
    c.expect_counts("after both Cancels", 0, 0).await
}

/// Confirm twice answers CONFIRMED twice and confirms once.
pub(crate) async fn repeat_confirm(c: &mut Ctx<'_>) -> Step {
    let q = c.quantity();
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    let got = c.confirm(&b).await;
    c.expect_state("Confirm", got, State::Confirmed)?;
    let got = c.confirm(&b).await;
    c.expect_state("repeated Confirm", got, State::Confirmed)?;
    c.expect_try("Try after Confirm", &b, Outcome::Held).await?;
    c.expect_counts("after all", 0, q).await
}

/// Extend of a held branch answers HELD (and again when repeated); once cancelled, Extend
/// answers CANCELLED and holds nothing.
pub async fn extend(c: &mut Ctx<'_>) -> Step {
    let b = c.branch();
    c.expect_try("Try", &b, Outcome::Held).await?;
    let later = from_now(chrono::Duration::minutes(20));
    let got = c.extend(&b, later).await;
    c.expect_state("Extend", got, State::Held)?;
    let got = c.extend(&b, later).await;
    c.expect_state("repeated Extend", got, State::Held)?;
    let got = c.cancel(&b).await;
    c.expect_state("Cancel", got, State::Cancelled)?;
    let got = c.extend(&b, from_now(chrono::Duration::minutes(30))).await;
    c.expect_state("Extend after Cancel", got, State::Cancelled)?;
    c.expect_counts("after all", 0, 0).await
}
