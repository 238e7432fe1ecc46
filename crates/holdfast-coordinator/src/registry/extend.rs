//! Extend: a branch's later deadline told to its participant (`tcc.v1.Participant/Extend`)
//! before the coordinator records it.

use chrono::{DateTime, Utc};
use tracing::Instrument;
use uuid::Uuid;

use super::{CallError, ParticipantHandle, invalid_parts, to_timestamp};
use crate::domain::BranchOutcome;
use crate::proto;

/// What a participant answered to Extend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// It holds the branch at least until the new deadline + its orphan grace.
    Held,
    /// The branch no longer holds there (confirmed, cancelled, or the hold is gone); nothing
    /// changed.
    Settled(BranchOutcome),
    /// It refused the deadline (e.g. beyond its `--max-hold`) and changed nothing: the field
    /// it named and the problem.
    Invalid {
        field: Option<String>,
        problem: String,
    },
}

impl ParticipantHandle {
    /// Tells the participant the branch's new deadline. `Err`: no answer (unreachable, timed
    /// out, failed, or refused otherwise); the branch may or may not hold longer there.
    pub async fn extend(
        &self,
        reservation_id: Uuid,
        branch_id: Uuid,
        expires_at: DateTime<Utc>,
    ) -> Result<ExtendOutcome, CallError> {
        let span = self.span("extend", reservation_id, Some(branch_id));
        async move {
            let req = self.request(proto::ExtendBranchRequest {
                reservation_id: reservation_id.to_string(),
                branch_id: branch_id.to_string(),
                expires_at: Some(to_timestamp(expires_at)),
            });
            let started = std::time::Instant::now();
            let answer = self.client.clone().extend(req).await;
            crate::telemetry::branch_call(&self.name, "extend", started.elapsed());
            let result = match answer {
                Ok(resp) => outcome(resp.get_ref().state),
                Err(s) if s.code() == tonic::Code::InvalidArgument => {
                    let (field, problem) = invalid_parts(&s);
                    Ok(ExtendOutcome::Invalid { field, problem })
                }
                Err(s) => Err(CallError::from_status(&s)),
            };
            self.observe(&result);
            result
        }
        .instrument(span)
        .await
    }
}

/// The participant's answer in domain terms; a state that is no answer to Extend is a failed
/// call.
fn outcome(state: i32) -> Result<ExtendOutcome, CallError> {
    use proto::branch::State as P;
    match P::try_from(state) {
        Ok(P::Held) => Ok(ExtendOutcome::Held),
        Ok(P::Confirmed) => Ok(ExtendOutcome::Settled(BranchOutcome::Confirmed)),
        Ok(P::Cancelled) => Ok(ExtendOutcome::Settled(BranchOutcome::Cancelled)),
        Ok(P::HoldLost) => Ok(ExtendOutcome::Settled(BranchOutcome::HoldLost)),
        _ => Err(CallError::protocol(format!(
            "participant answered extend with state {state}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_answers_map_to_outcomes() {
        use proto::branch::State as P;
        assert_eq!(outcome(P::Held.into()).ok(), Some(ExtendOutcome::Held));
        assert_eq!(
            outcome(P::HoldLost.into()).ok(),
            Some(ExtendOutcome::Settled(BranchOutcome::HoldLost))
        );
        let rejected = outcome(P::Rejected.into()).unwrap_err();
        assert!(!rejected.refused);
        assert_eq!(rejected.message, "participant answered extend with state 3");
    }
}
