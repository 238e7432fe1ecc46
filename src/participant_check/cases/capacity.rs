//! Capacity: many concurrent Trys beyond what the resource holds (no oversell), and one Try
//! past a full resource (`REJECTED`, nothing changed, and a repeat keeps the first answer).
//! Both need a known capacity (`--capacity`, confirmed by `GetResource` when the participant
//! creates resources); else they are skipped, saying why.

use std::sync::Arc;

use tokio::sync::Barrier;

use super::{Ctx, Step, Stop, describe_try};
use crate::proto::TryRequest;
use crate::proto::branch::State;
use crate::proto::try_response::Outcome;

/// The most Trys one capacity case sends in sequence or at once (bounded runs).
const MAX_HOLDS: i64 = 200;
/// Separate connections the concurrent Trys are spread over.
const CONNECTIONS: usize = 8;

/// How many Trys of `--quantity` fit in `--capacity`, or why the case cannot run.
fn holds_that_fit(c: &Ctx<'_>) -> Step<i64> {
    let capacity = c.subject.args.capacity.unwrap_or_default();
    let fit = capacity / c.quantity();
    if fit < 1 {
        return Err(Stop::Skip(format!(
            "--capacity {capacity} holds no Try of --quantity {}",
            c.quantity()
        )));
    }
    if fit > MAX_HOLDS {
        return Err(Stop::Skip(format!(
            "--capacity / --quantity = {fit} holds; the capacity cases send at most {MAX_HOLDS}"
        )));
    }
    Ok(fit)
}

/// Twice as many concurrent Trys as fit (at least 4 more), on several connections, started
/// together: at most `fit` are HELD and the counts never exceed the capacity; all released
/// after.
pub(crate) async fn concurrent_trys(c: &mut Ctx<'_>) -> Step {
    let fit = holds_that_fit(c)?;
    let contenders = usize::try_from((fit * 2).max(fit + 4)).unwrap_or(8);
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS.min(contenders) {
        match c.subject.args.target.channel() {
            Ok(ch) => clients.push(crate::proto::participant_client::ParticipantClient::new(ch)),
            Err(e) => return c.wrong(format!("a connection: {e}")),
        }
    }
    let branches: Vec<TryRequest> = (0..contenders).map(|_| c.branch()).collect();
    let start = Arc::new(Barrier::new(contenders));
    let calls = branches.iter().enumerate().map(|(i, b)| {
        let mut client = clients[i % clients.len()].clone();
        let (b, start) = (b.clone(), start.clone());
        async move {
            start.wait().await;
            client.r#try(b).await.map(|r| r.into_inner())
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let held = answers
        .iter()
        .filter(|a| matches!(a, Ok(t) if t.outcome == Outcome::Held as i32))
        .count();
    let failed: Vec<String> = answers
        .iter()
        .filter(|a| a.is_err())
        .map(describe_try)
        .collect();
    let rejected = contenders - held - failed.len();
    let mut summary = format!("{contenders} Trys at once: {held} HELD, {rejected} REJECTED");
    if let Some(first) = failed.first() {
        summary.push_str(&format!(", {} failed (first: {first})", failed.len()));
    }
    let units = c.quantity();
    let held_now = c.held_now().await?;
    // Release everything, whatever it answered: a failed Try may have landed.
    for b in &branches {
        let got = c.cancel(b).await;
        if !matches!(&got, Ok(r) if r.state == State::Cancelled as i32) {
            return c.wrong(format!(
                "{summary}; Cancel of a contender answered {}",
                super::describe_branch(&got)
            ));
        }
    }
    if i64::try_from(held).unwrap_or(i64::MAX) > fit {
        return c.wrong(format!("{summary} (expected at most {fit} HELD: oversold)"));
    }
    if let Some(h) = held_now {
        let most = (i64::try_from(held + failed.len()).unwrap_or(i64::MAX)) * units;
        if h > fit * units || h > most {
            return c.wrong(format!(
                "{summary}; counts held {h} (expected at most {} units)",
                (fit * units).min(most)
            ));
        }
        summary.push_str(&format!("; counts held {h}"));
    }
    c.saw(summary);
    c.expect_counts("after releasing all", 0, 0).await
}

/// The resource filled by `fit` Trys; one more is REJECTED and changes nothing; after the
/// fill is released, a repeat of the rejected Try still answers REJECTED.
pub(crate) async fn past_capacity(c: &mut Ctx<'_>) -> Step {
    let fit = holds_that_fit(c)?;
    let q = c.quantity();
    let mut fill = Vec::new();
    for i in 0..fit {
        let b = c.branch();
        let got = c.try_(&b).await;
        if !matches!(&got, Ok(t) if t.outcome == Outcome::Held as i32) {
            return c.wrong(format!(
                "filling Try {} of {fit}: {} (expected HELD)",
                i + 1,
                describe_try(&got)
            ));
        }
        fill.push(b);
    }
    c.saw(format!("{fit} filling Trys HELD"));
    let extra = c.branch();
    c.expect_try("one more Try", &extra, Outcome::Rejected)
        .await?;
    c.expect_counts("while full", fit * q, 0).await?;
    for b in &fill {
        let got = c.cancel(b).await;
        if !matches!(&got, Ok(r) if r.state == State::Cancelled as i32) {
            return c.wrong(format!(
                "Cancel of a filling Try: {} (expected CANCELLED)",
                super::describe_branch(&got)
            ));
        }
    }
    c.expect_try(
        "the rejected Try repeated after release",
        &extra,
        Outcome::Rejected,
    )
    .await?;
    let got = c.cancel(&extra).await;
    c.expect_state("its Cancel", got, State::Cancelled)?;
    c.expect_counts("after", 0, 0).await
}
