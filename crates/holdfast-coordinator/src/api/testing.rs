//! The `tcc.v1.Testing` service (SPEC 9, `holdfast --test-mode` only): thin handlers over
//! `crate::testing` and `coordinator/on_demand.rs`. Admin-only when authentication is on
//! (`auth/rules.rs`).

use std::time::Duration;

use tonic::{Request, Response, Status};

use super::convert::{self, Token};
use super::{actor, observed};
use crate::coordinator::{Coordinator, Error};
use crate::domain::validate::FieldError;
use crate::proto;
use crate::testing::{self, AdvanceError, TestClock, TestingError};

/// The `tcc.v1.Testing` service: the test deployment's clock and its coordinator.
#[derive(Clone)]
pub struct TestingApi {
    coordinator: Coordinator,
    clock: TestClock,
}

impl TestingApi {
    pub fn new(coordinator: Coordinator, clock: TestClock) -> TestingApi {
        TestingApi { coordinator, clock }
    }

    /// The tonic service, with the request size limit applied.
    pub fn into_server(self) -> proto::testing_server::TestingServer<TestingApi> {
        proto::testing_server::TestingServer::new(self).max_decoding_message_size(64 * 1024)
    }
}

/// `by` from the wire: required, > 0, at most [`testing::MAX_ADVANCE`].
fn advance_by(by: Option<&prost_types::Duration>) -> Result<Duration, FieldError> {
    let by = by.ok_or_else(|| FieldError::new("by", "is required"))?;
    let by = convert::from_duration("by", by)?;
    if by.is_zero() {
        return Err(FieldError::new("by", "must be > 0"));
    }
    if by > testing::MAX_ADVANCE {
        return Err(FieldError::new("by", "must be at most 366 days"));
    }
    Ok(by)
}

fn advance_error(e: AdvanceError) -> Status {
    match e {
        AdvanceError::Clock(TestingError::InvalidAdvance(problem)) => {
            Error::from(FieldError::new("by", problem)).into()
        }
        AdvanceError::Clock(e) => {
            tracing::error!(error = %e, "moving the test clock failed");
            Status::unavailable(format!("moving the test clock failed: {e}"))
        }
        AdvanceError::Coordinator(e) => e.into(),
    }
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[tonic::async_trait]
impl proto::testing_server::Testing for TestingApi {
    async fn advance_clock(
        &self,
        request: Request<proto::AdvanceClockRequest>,
    ) -> Result<Response<proto::AdvanceClockResponse>, Status> {
        observed("AdvanceClock", async move {
            // No caller, no move: a server assembled without the auth layer fails closed.
            actor(&request)?;
            let by = advance_by(request.get_ref().by.as_ref()).map_err(Error::from)?;
            let advanced = testing::advance(&self.clock, &self.coordinator, by)
                .await
                .map_err(advance_error)?;
            tracing::info!(by = ?by, offset = ?advanced.offset, expired = advanced.expired, reclaimed = advanced.reclaimed, "test clock advanced");
            Ok(Response::new(proto::AdvanceClockResponse {
                offset: Some(proto_duration(advanced.offset)),
                now: Some(convert::timestamp(advanced.now)),
                expired: i32::try_from(advanced.expired).unwrap_or(i32::MAX),
            }))
        })
        .await
    }

    async fn expire_now(
        &self,
        request: Request<proto::ExpireNowRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("ExpireNow", async move {
            let actor = actor(&request)?;
            let id =
                convert::reservation_id(&request.get_ref().reservation_id).map_err(Error::from)?;
            let r = self.coordinator.expire_now(&actor, id).await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_is_required_positive_and_bounded() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        for (by, problem) in [
            (None, "is required"),
            (Some(d(0, 0)), "must be > 0"),
            (Some(d(-1, 0)), "must be a positive duration"),
            (Some(d(366 * 86_400, 1)), "must be at most 366 days"),
        ] {
            let e = advance_by(by.as_ref()).unwrap_err();
            assert_eq!(e.field, "by");
            assert!(e.problem.contains(problem), "{e:?}");
        }
        assert_eq!(
            advance_by(Some(&d(660, 0))).unwrap(),
            Duration::from_secs(660)
        );
    }
}
