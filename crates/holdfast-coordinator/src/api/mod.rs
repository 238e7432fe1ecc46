//! The gRPC API: thin `tcc.v1.Coordinator` handlers (and `tcc.v1.Admin`, `tcc.v1.Events`,
//! `tcc.v1.Testing` beside them) that translate messages to domain calls
//! and domain results (or errors, via [`error`]) back to messages. Who is calling comes from
//! the request's [`Caller`], which the server's auth layer put there (`crate::auth`): a
//! request without one is refused, so a server built without the layer fails closed.

pub mod admin;
pub mod convert;
pub mod error;
pub(crate) mod events;
pub mod testing;
mod waitlist;

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::coordinator::{Coordinator, Error};
use crate::domain::Actor;
use crate::proto;
use convert::Token;

/// The `tcc.v1.Coordinator` service.
#[derive(Clone)]
pub struct CoordinatorApi {
    coordinator: Coordinator,
}

impl CoordinatorApi {
    pub fn new(coordinator: Coordinator) -> CoordinatorApi {
        CoordinatorApi { coordinator }
    }

    /// The tonic service, with the request size limit applied.
    pub fn into_server(self) -> proto::coordinator_server::CoordinatorServer<CoordinatorApi> {
        proto::coordinator_server::CoordinatorServer::new(self)
            .max_decoding_message_size(1024 * 1024)
    }
}

/// Who is asking, as the lifecycle sees it.
fn actor<T>(request: &Request<T>) -> Result<Actor, Status> {
    let caller = request.extensions().get::<Caller>().ok_or_else(|| {
        crate::auth::refusal(
            crate::auth::Refused::Unauthenticated,
            "this server authenticates no caller",
        )
    })?;
    Ok(Actor {
        principal: caller.principal().to_owned(),
        sees_all: caller.has(crate::auth::Role::Admin),
    })
}

/// Records an RPC's outcome and latency.
async fn observed<T>(
    method: &'static str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let started = std::time::Instant::now();
    let result = call.await;
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    };
    crate::telemetry::rpc(method, code, started.elapsed());
    result
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::Reservation, Status>> + Send>>;

#[tonic::async_trait]
impl proto::coordinator_server::Coordinator for CoordinatorApi {
    async fn reserve(
        &self,
        request: Request<proto::ReserveRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Reserve", async move {
            let actor = actor(&request)?;
            let input = convert::reserve_input(request.into_inner()).map_err(Error::from)?;
            let r = self.coordinator.reserve(&actor, input).await?;
            let reservation = self.coordinator.with_payments_one(r.reservation).await?;
            Ok(Response::new(convert::reservation(
                reservation,
                Token::Include(r.token.as_ref()),
            )))
        })
        .await
    }

    async fn confirm(
        &self,
        request: Request<proto::ConfirmRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Confirm", async move {
            let actor = actor(&request)?;
            let req = request.into_inner();
            let id = convert::reservation_id(&req.reservation_id).map_err(Error::from)?;
            let token = convert::hold_token(req.hold_token).map_err(Error::from)?;
            let payment = req.payment.map(convert::payment);
            let r = self
                .coordinator
                .confirm(&actor, id, &token, payment)
                .await?;
            let r = self.coordinator.with_payments_one(r).await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn cancel(
        &self,
        request: Request<proto::CancelRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Cancel", async move {
            let actor = actor(&request)?;
            let req = request.into_inner();
            let id = convert::reservation_id(&req.reservation_id).map_err(Error::from)?;
            let token = convert::hold_token(req.hold_token).map_err(Error::from)?;
            let r = self
                .coordinator
                .cancel(&actor, id, &token, &req.reason)
                .await?;
            let r = self.coordinator.with_payments_one(r).await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Extend", async move {
            let actor = actor(&request)?;
            let req = request.into_inner();
            let ttl = req
                .ttl
                .as_ref()
                .map(|d| convert::from_duration("ttl", d))
                .transpose()
                .map_err(Error::from)?;
            let id = convert::reservation_id(&req.reservation_id).map_err(Error::from)?;
            let token = convert::hold_token(req.hold_token).map_err(Error::from)?;
            let max = self.coordinator.limits().max_id_bytes;
            let request_id =
                convert::extend_request_id(&req.request_id, max).map_err(Error::from)?;
            let r = self
                .coordinator
                .extend(&actor, id, &token, ttl, request_id)
                .await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn get_reservation(
        &self,
        request: Request<proto::GetReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("GetReservation", async move {
            let actor = actor(&request)?;
            let id =
                convert::reservation_id(&request.get_ref().reservation_id).map_err(Error::from)?;
            let r = self.coordinator.get(&actor, id).await?;
            let r = self.coordinator.with_audit_one(r).await?;
            let r = self.coordinator.with_payments_one(r).await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn list_reservations(
        &self,
        request: Request<proto::ListReservationsRequest>,
    ) -> Result<Response<proto::ListReservationsResponse>, Status> {
        observed("ListReservations", async move {
            let actor = actor(&request)?;
            let query = convert::list_query(request.into_inner()).map_err(Error::from)?;
            let page = self.coordinator.list(&actor, query).await?;
            let reservations = self.coordinator.with_audit(page.reservations).await?;
            Ok(Response::new(proto::ListReservationsResponse {
                reservations: self
                    .coordinator
                    .with_payments(reservations)
                    .await?
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

    type WatchReservationStream = WatchStream;

    async fn watch_reservation(
        &self,
        request: Request<proto::WatchReservationRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let actor = actor(&request)?;
        let connection = connection_of(&request);
        // An empty id is "not a UUID" here (Get says "is required"): Watch always answered so.
        let id = crate::domain::validate::uuid("reservation_id", &request.get_ref().reservation_id)
            .map_err(Error::from)?;
        let changes = self.coordinator.watch(&actor, id, connection).await?;
        // Each change with the reservation's audit entries and payments (a read per change
        // sent, and one more for its further payments once it left HELD).
        let coordinator = self.coordinator.clone();
        let changes = futures_util::StreamExt::then(changes, move |r| {
            let coordinator = coordinator.clone();
            async move {
                let r = coordinator.with_audit_one(r?).await?;
                let r = coordinator.with_payments_one(r).await?;
                Ok::<_, Status>(convert::reservation(r, Token::Omit))
            }
        });
        Ok(Response::new(Box::pin(changes)))
    }
}

/// The client's connection, for the per-connection stream cap (tonic's connect info: TCP and
/// TLS alike; for the JSON API's streams, the HTTP connection's, carried in-process).
pub(crate) fn connection_of<T>(
    request: &Request<T>,
) -> Option<crate::coordinator::WatchConnection> {
    request
        .remote_addr()
        .map(|remote| crate::coordinator::WatchConnection {
            local: request.local_addr(),
            remote,
        })
}
