//! The `tcc.v1.Admin` service (SPEC 8.1): thin handlers over `coordinator/admin.rs`. Only
//! principals with the `admin` role reach them (`auth/rules.rs`); answers carry each
//! reservation's audit entries.

use tonic::{Request, Response, Status};

use super::convert::{self, Token};
use super::{actor, observed};
use crate::coordinator::{Coordinator, Error};
use crate::domain::admin::{AuditQuery, StuckQuery, stuck_state};
use crate::domain::validate::{self, FieldError};
use crate::proto;
use crate::proto::retry_request::Target;

/// The `tcc.v1.Admin` service.
#[derive(Clone)]
pub struct AdminApi {
    coordinator: Coordinator,
}

impl AdminApi {
    pub fn new(coordinator: Coordinator) -> AdminApi {
        AdminApi { coordinator }
    }

    /// The tonic service, with the request size limit applied.
    pub fn into_server(self) -> proto::admin_server::AdminServer<AdminApi> {
        proto::admin_server::AdminServer::new(self).max_decoding_message_size(1024 * 1024)
    }
}

/// A page size from the wire (negative is an error).
fn page_size(value: i32) -> Result<u32, FieldError> {
    u32::try_from(value).map_err(|_| FieldError::new("page_size", "must be >= 0"))
}

fn stuck_query(req: proto::ListStuckRequest) -> Result<StuckQuery, FieldError> {
    let mut states = Vec::with_capacity(req.states.len());
    for (i, s) in req.states.iter().enumerate() {
        let field = format!("states[{i}]");
        let state = convert::state_filter(*s)
            .map_err(|e| FieldError::new(field.clone(), e.problem))?
            .ok_or_else(|| {
                FieldError::new(field.clone(), "must be a state, not STATE_UNSPECIFIED")
            })?;
        states.push(stuck_state(&field, state)?);
    }
    Ok(StuckQuery {
        states,
        participant: (!req.participant.is_empty()).then_some(req.participant),
        older_than: req
            .older_than
            .as_ref()
            .map(|d| convert::from_duration("older_than", d))
            .transpose()?
            .unwrap_or_default(),
        limit: page_size(req.page_size)?,
        after: if req.page_token.is_empty() {
            None
        } else {
            Some(convert::from_page_token(&req.page_token)?)
        },
    })
}

fn audit_query(req: &proto::ListAuditRequest) -> Result<AuditQuery, FieldError> {
    Ok(AuditQuery {
        reservation_id: if req.reservation_id.is_empty() {
            None
        } else {
            Some(validate::uuid("reservation_id", &req.reservation_id)?)
        },
        limit: page_size(req.page_size)?,
        before: if req.page_token.is_empty() {
            None
        } else {
            Some(
                req.page_token
                    .strip_prefix("a")
                    .and_then(|n| n.parse::<i64>().ok())
                    .ok_or_else(|| {
                        FieldError::new("page_token", "is not a token from a previous response")
                    })?,
            )
        },
    })
}

#[tonic::async_trait]
impl proto::admin_server::Admin for AdminApi {
    async fn list_stuck(
        &self,
        request: Request<proto::ListStuckRequest>,
    ) -> Result<Response<proto::ListStuckResponse>, Status> {
        observed("ListStuck", async move {
            actor(&request)?;
            let query = stuck_query(request.into_inner()).map_err(Error::from)?;
            let page = self.coordinator.list_stuck(query).await?;
            let ids: Vec<_> = page.reservations.iter().map(|r| r.id).collect();
            let work = self.coordinator.work_of(&ids).await?;
            Ok(Response::new(proto::ListStuckResponse {
                work: work.into_iter().map(convert::stuck_work).collect(),
                reservations: page
                    .reservations
                    .into_iter()
                    .map(|r| convert::reservation(r, Token::Omit))
                    .collect(),
                next_page_token: page
                    .next
                    .map(|(ts, id)| convert::page_token(ts, id))
                    .unwrap_or_default(),
            }))
        })
        .await
    }

    async fn retry(
        &self,
        request: Request<proto::RetryRequest>,
    ) -> Result<Response<proto::RetryResponse>, Status> {
        observed("Retry", async move {
            let actor = actor(&request)?;
            let (id, participant) = match &request.get_ref().target {
                Some(Target::ReservationId(id)) => (Some(id.as_str()), None),
                Some(Target::Participant(p)) => (None, Some(p.as_str())),
                None => (None, None),
            };
            let reason = &request.get_ref().reason;
            let retried = self
                .coordinator
                .retry(&actor, id, participant, reason)
                .await?;
            Ok(Response::new(proto::RetryResponse {
                driven: i32::try_from(retried.driven).unwrap_or(i32::MAX),
                reservations: retried
                    .reservations
                    .into_iter()
                    .map(|r| convert::reservation(r, Token::Omit))
                    .collect(),
            }))
        })
        .await
    }

    async fn force_cancel(
        &self,
        request: Request<proto::ForceCancelRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("ForceCancel", async move {
            let actor = actor(&request)?;
            let req = request.get_ref();
            let id = convert::reservation_id(&req.reservation_id).map_err(Error::from)?;
            let r = self
                .coordinator
                .force_cancel(&actor, id, &req.reason)
                .await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn resolve(
        &self,
        request: Request<proto::ResolveRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Resolve", async move {
            let actor = actor(&request)?;
            let req = request.get_ref();
            let outcome = convert::state_filter(req.outcome)
                .map_err(|e| Error::from(FieldError::new("outcome", e.problem)))?;
            let id = convert::reservation_id(&req.reservation_id).map_err(Error::from)?;
            let r = self
                .coordinator
                .resolve(&actor, id, outcome, &req.reason)
                .await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn list_sinks(
        &self,
        request: Request<proto::ListSinksRequest>,
    ) -> Result<Response<proto::ListSinksResponse>, Status> {
        observed("ListSinks", async move {
            actor(&request)?;
            let sinks = self.coordinator.list_sinks().await?;
            Ok(Response::new(proto::ListSinksResponse {
                sinks: sinks.into_iter().map(convert::sink).collect(),
            }))
        })
        .await
    }

    async fn count_reservations(
        &self,
        request: Request<proto::CountReservationsRequest>,
    ) -> Result<Response<proto::CountReservationsResponse>, Status> {
        observed("CountReservations", async move {
            actor(&request)?;
            let counts = self.coordinator.count_by_state().await?;
            Ok(Response::new(convert::state_counts(counts)))
        })
        .await
    }

    async fn get_inventory(
        &self,
        request: Request<proto::GetInventoryRequest>,
    ) -> Result<Response<proto::GetInventoryResponse>, Status> {
        observed("GetInventory", async move {
            actor(&request)?;
            let items = request
                .into_inner()
                .resources
                .into_iter()
                .map(|r| (r.participant, r.resource))
                .collect();
            let lines = self.coordinator.inventory(items).await?;
            Ok(Response::new(proto::GetInventoryResponse {
                lines: lines.into_iter().map(convert::inventory_line).collect(),
            }))
        })
        .await
    }

    async fn list_queue(
        &self,
        request: Request<proto::ListQueueRequest>,
    ) -> Result<Response<proto::ListQueueResponse>, Status> {
        observed("ListQueue", async move {
            actor(&request)?;
            let (key, after, size) =
                super::waitlist::list_queue_request(request.get_ref(), self.coordinator.limits())
                    .map_err(Error::InvalidArgument)?;
            let page = self.coordinator.list_queue(&key, after, size).await?;
            Ok(Response::new(super::waitlist::list_queue_response(
                page, size,
            )))
        })
        .await
    }

    async fn resume_webhook(
        &self,
        request: Request<proto::ResumeWebhookRequest>,
    ) -> Result<Response<proto::ResumeWebhookResponse>, Status> {
        observed("ResumeWebhook", async move {
            let actor = actor(&request)?;
            let name = &request.get_ref().name;
            let sink = self.coordinator.resume_webhook(name).await?;
            tracing::info!(principal = %actor.principal, webhook = %name, "webhook resumed");
            Ok(Response::new(proto::ResumeWebhookResponse {
                sink: Some(convert::sink(sink)),
            }))
        })
        .await
    }

    async fn list_audit(
        &self,
        request: Request<proto::ListAuditRequest>,
    ) -> Result<Response<proto::ListAuditResponse>, Status> {
        observed("ListAudit", async move {
            actor(&request)?;
            let query = audit_query(request.get_ref()).map_err(Error::from)?;
            let page = self.coordinator.list_audit(query).await?;
            Ok(Response::new(proto::ListAuditResponse {
                entries: page.entries.into_iter().map(convert::audit_entry).collect(),
                next_page_token: page.next.map(|s| format!("a{s}")).unwrap_or_default(),
            }))
        })
        .await
    }
}
