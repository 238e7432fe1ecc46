//! The gRPC API: thin `tcc.v1.Coordinator` handlers that translate messages to domain calls
//! and domain results (or errors, via [`error`]) back to messages.

pub mod convert;
pub mod error;

use std::pin::Pin;
use std::time::Duration;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::coordinator::{Coordinator, Error};
use crate::domain::validate::FieldError;
use crate::proto;
use convert::Token;

/// The `tcc.v1.Coordinator` service.
#[derive(Clone)]
pub struct CoordinatorApi {
    coordinator: Coordinator,
    watch_poll: Duration,
}

impl CoordinatorApi {
    pub fn new(coordinator: Coordinator) -> CoordinatorApi {
        CoordinatorApi {
            coordinator,
            watch_poll: Duration::from_secs(1),
        }
    }

    /// The tonic service, with the request size limit applied.
    pub fn into_server(self) -> proto::coordinator_server::CoordinatorServer<CoordinatorApi> {
        proto::coordinator_server::CoordinatorServer::new(self)
            .max_decoding_message_size(1024 * 1024)
    }
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
            let input = convert::reserve_input(request.into_inner()).map_err(Error::from)?;
            let r = self.coordinator.reserve(input).await?;
            Ok(Response::new(convert::reservation(r, Token::Include)))
        })
        .await
    }

    async fn confirm(
        &self,
        request: Request<proto::ConfirmRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Confirm", async move {
            let req = request.into_inner();
            let r = self
                .coordinator
                .confirm(
                    &req.reservation_id,
                    &req.hold_token,
                    req.payment.map(convert::payment),
                )
                .await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn cancel(
        &self,
        request: Request<proto::CancelRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Cancel", async move {
            let req = request.into_inner();
            let r = self
                .coordinator
                .cancel(&req.reservation_id, &req.hold_token, &req.reason)
                .await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        observed("Extend", async move {
            let req = request.into_inner();
            let ttl = req
                .ttl
                .as_ref()
                .map(|d| convert::from_duration("ttl", d))
                .transpose()
                .map_err(Error::from)?;
            let r = self
                .coordinator
                .extend(&req.reservation_id, &req.hold_token, ttl, &req.request_id)
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
            let r = self
                .coordinator
                .get(&request.get_ref().reservation_id)
                .await?;
            Ok(Response::new(convert::reservation(r, Token::Omit)))
        })
        .await
    }

    async fn list_reservations(
        &self,
        request: Request<proto::ListReservationsRequest>,
    ) -> Result<Response<proto::ListReservationsResponse>, Status> {
        observed("ListReservations", async move {
            let query = convert::list_query(request.into_inner()).map_err(Error::from)?;
            let page = self.coordinator.list(query).await?;
            Ok(Response::new(proto::ListReservationsResponse {
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

    type WatchReservationStream = WatchStream;

    async fn watch_reservation(
        &self,
        request: Request<proto::WatchReservationRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let id = request.get_ref().reservation_id.clone();
        let uuid = Uuid::parse_str(&id)
            .map_err(|_| Error::from(FieldError::new("reservation_id", "must be a UUID")))?;
        // Subscribe before the first read, so no change falls between the two.
        let mut changes = self.coordinator.subscribe(uuid);
        let first = self.coordinator.get(&id).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let coordinator = self.coordinator.clone();
        let poll = self.watch_poll;
        tokio::spawn(async move {
            let mut last = first.version;
            let mut state = first.state;
            let mut expires_at = first.expires_at;
            if tx
                .send(Ok(convert::reservation(first, Token::Omit)))
                .await
                .is_err()
            {
                return;
            }
            while !state.is_terminal() {
                // Changes made here arrive as events, in order; a poll catches other replicas'
                // changes and lazy expiry (which writes nothing), at the latest at expiry.
                let until_expiry = (expires_at - chrono::Utc::now())
                    .to_std()
                    .unwrap_or_default()
                    + Duration::from_millis(20);
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    event = changes.recv() => match event {
                        Ok(r) => Some((*r).clone()),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
                    },
                    _ = tokio::time::sleep(poll.min(until_expiry)) => None,
                };
                let r = match next {
                    Some(r) => r,
                    None => match coordinator.get(&id).await {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = tx.send(Err(Status::from(e))).await;
                            return;
                        }
                    },
                };
                // Versions only grow; a lazily expired read has the same version but a new state.
                if r.version < last || (r.version == last && r.state == state) {
                    continue;
                }
                last = r.version;
                state = r.state;
                expires_at = r.expires_at;
                if tx
                    .send(Ok(convert::reservation(r, Token::Omit)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
