//! The conformance cases, by topic: [`lifecycle`] (first calls and their repeats),
//! [`disorder`] (calls out of order, unknown branches), [`capacity`] (concurrent Trys beyond
//! capacity, a Try past it), [`input`] (deadlines, malformed requests, garbage bytes). Each
//! case runs on fresh reservation and branch ids (and a fresh resource when the participant
//! creates them), so a run can be repeated against the same participant.
//!
//! What each case expects is what SPEC 3.3 requires of every participant, the same table the
//! SDK's barrier keeps (`participant` module doc): a repeat answers the first answer; a
//! Cancel before its Try records the branch and the late Try is `REJECTED`, holding nothing;
//! Confirm after Cancel answers `CANCELLED`, Cancel after Confirm `CONFIRMED`, changing
//! nothing; Confirm and Extend of an unknown branch answer `HOLD_LOST`.

pub mod capacity;
pub mod disorder;
pub mod input;
pub mod lifecycle;

use tonic::Status;

use super::subject::{Counts, Subject, describe_status, from_now};
use crate::proto::{
    BranchRequest, BranchResponse, ExtendBranchRequest, Hold, Interval, TryRequest, TryResponse,
    branch, try_response,
};

/// The holder every Try of the checker names.
pub(crate) const HOLDER: &str = "holdfast-participant-check";

/// How a case ended early.
#[derive(Debug)]
pub enum Stop {
    /// An answer was not the one expected; the trail says what came.
    Fail,
    /// The case cannot run against this participant; why.
    Skip(String),
}

/// A step's result: go on, or stop the case.
pub(crate) type Step<T = ()> = Result<T, Stop>;

/// One case's run: the resource it uses, what it saw so far, the counts it started from.
pub struct Ctx<'a> {
    pub subject: &'a Subject,
    pub resource: String,
    pub slot: Option<Interval>,
    base: Option<Counts>,
    /// What the case saw, step by step: the report's "got".
    pub trail: Vec<String>,
}

impl<'a> Ctx<'a> {
    /// A case on `resource` (case number `n`), with the counts it starts from.
    pub async fn new(subject: &'a Subject, resource: String, n: usize) -> Result<Self, Status> {
        let base = subject.counts(&resource).await?;
        Ok(Ctx {
            slot: subject.slot(n),
            subject,
            resource,
            base,
            trail: Vec::new(),
        })
    }

    /// Notes what a step saw.
    pub fn saw(&mut self, what: impl Into<String>) {
        self.trail.push(what.into());
    }

    /// Notes a wrong answer and stops the case.
    pub fn wrong<T>(&mut self, what: impl Into<String>) -> Step<T> {
        self.trail.push(what.into());
        Err(Stop::Fail)
    }

    /// The units one Try holds (`--quantity`).
    pub fn quantity(&self) -> i64 {
        self.subject.args.quantity
    }

    /// One item of the case's resource.
    pub fn item(&self) -> Hold {
        self.subject
            .hold(&self.resource, self.quantity(), self.slot)
    }

    /// A Try of a fresh branch for one item, expiring in ten minutes.
    pub fn branch(&self) -> TryRequest {
        TryRequest {
            reservation_id: format!("check-{}", uuid::Uuid::new_v4()),
            branch_id: format!("check-{}", uuid::Uuid::new_v4()),
            holder: HOLDER.to_owned(),
            items: vec![self.item()],
            expires_at: Some(from_now(chrono::Duration::minutes(10))),
        }
    }

    pub async fn try_(&self, r: &TryRequest) -> Result<TryResponse, Status> {
        Ok(self
            .subject
            .participant()
            .r#try(r.clone())
            .await?
            .into_inner())
    }

    pub async fn confirm(&self, r: &TryRequest) -> Result<BranchResponse, Status> {
        Ok(self
            .subject
            .participant()
            .confirm(branch_request(r))
            .await?
            .into_inner())
    }

    pub async fn cancel(&self, r: &TryRequest) -> Result<BranchResponse, Status> {
        Ok(self
            .subject
            .participant()
            .cancel(branch_request(r))
            .await?
            .into_inner())
    }

    pub async fn extend(
        &self,
        r: &TryRequest,
        expires_at: prost_types::Timestamp,
    ) -> Result<BranchResponse, Status> {
        Ok(self
            .subject
            .participant()
            .extend(ExtendBranchRequest {
                reservation_id: r.reservation_id.clone(),
                branch_id: r.branch_id.clone(),
                expires_at: Some(expires_at),
            })
            .await?
            .into_inner())
    }

    /// `step` (a Try of `r`) must answer `want`.
    pub(crate) async fn expect_try(
        &mut self,
        step: &str,
        r: &TryRequest,
        want: try_response::Outcome,
    ) -> Step {
        let got = self.try_(r).await;
        let seen = describe_try(&got);
        if matches!(&got, Ok(t) if t.outcome == want as i32) {
            self.saw(format!("{step} {seen}"));
            Ok(())
        } else {
            self.wrong(format!("{step} {seen} (expected {})", want.as_str_name()))
        }
    }

    /// `step` (a Confirm, Cancel or Extend answer) must be `want`.
    pub(crate) fn expect_state(
        &mut self,
        step: &str,
        got: Result<BranchResponse, Status>,
        want: branch::State,
    ) -> Step {
        let seen = describe_branch(&got);
        if matches!(&got, Ok(b) if b.state == want as i32) {
            self.saw(format!("{step} {seen}"));
            Ok(())
        } else {
            self.wrong(format!("{step} {seen} (expected {})", want.as_str_name()))
        }
    }

    /// The resource's counts must have moved by `held` and `confirmed` units since the case
    /// began (not checked when the participant's counts cannot be read per resource).
    pub(crate) async fn expect_counts(&mut self, step: &str, held: i64, confirmed: i64) -> Step {
        let Some(base) = self.base else {
            return Ok(());
        };
        let now = match self.subject.counts(&self.resource).await {
            Ok(Some(now)) => now,
            Ok(None) => return Ok(()),
            Err(s) => return self.wrong(format!("{step}: GetResource {}", describe_status(&s))),
        };
        let (dh, dc) = (now.held - base.held, now.confirmed - base.confirmed);
        if (dh, dc) == (held, confirmed) {
            self.saw(format!("{step}: held {dh}, confirmed {dc}"));
            Ok(())
        } else {
            self.wrong(format!(
                "{step}: held {dh}, confirmed {dc} (expected held {held}, confirmed {confirmed})"
            ))
        }
    }

    /// The units held now beyond the case's start, when counts can be read.
    pub async fn held_now(&mut self) -> Step<Option<i64>> {
        let Some(base) = self.base else {
            return Ok(None);
        };
        match self.subject.counts(&self.resource).await {
            Ok(now) => Ok(now.map(|n| n.held - base.held)),
            Err(s) => self.wrong(format!("GetResource {}", describe_status(&s))),
        }
    }
}

/// The Confirm/Cancel request naming `r`'s branch.
pub fn branch_request(r: &TryRequest) -> BranchRequest {
    BranchRequest {
        reservation_id: r.reservation_id.clone(),
        branch_id: r.branch_id.clone(),
    }
}

/// A Try's answer for the report: `HELD`, `REJECTED ("sold out")`, `INVALID_ARGUMENT: ...`.
pub(crate) fn describe_try(got: &Result<TryResponse, Status>) -> String {
    match got {
        Ok(t) => match try_response::Outcome::try_from(t.outcome) {
            Ok(try_response::Outcome::Rejected) if !t.reason.is_empty() => {
                format!("REJECTED ({:?})", t.reason)
            }
            Ok(o) => o.as_str_name().to_owned(),
            Err(_) => format!("outcome {} (not a TryResponse.Outcome)", t.outcome),
        },
        Err(s) => describe_status(s),
    }
}

/// A Confirm/Cancel/Extend answer for the report: the state's name, or the error.
pub(crate) fn describe_branch(got: &Result<BranchResponse, Status>) -> String {
    match got {
        Ok(b) => match branch::State::try_from(b.state) {
            Ok(s) => s.as_str_name().to_owned(),
            Err(_) => format!("state {} (not a Branch.State)", b.state),
        },
        Err(s) => describe_status(s),
    }
}
