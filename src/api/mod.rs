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
use crate::domain::ListQuery;
use crate::domain::validate::{self, FieldError};
use crate::proto;
use crate::registry::Registry;
use convert::Token;

/// The `tcc.v1.Coordinator` service.
#[derive(Clone)]
pub struct CoordinatorApi {
    coordinator: Coordinator,
    registry: Registry,
    watch_poll: Duration,
}

impl CoordinatorApi {
    pub fn new(coordinator: Coordinator, registry: Registry) -> CoordinatorApi {
        CoordinatorApi {
            coordinator,
            registry,
            watch_poll: Duration::from_secs(1),
        }
    }

    /// The tonic service, with the request size limit applied.
    pub fn into_server(self) -> proto::coordinator_server::CoordinatorServer<CoordinatorApi> {
        proto::coordinator_server::CoordinatorServer::new(self)
            .max_decoding_message_size(1024 * 1024)
    }

    fn check_payment(&self, p: &proto::Payment) -> Result<(), FieldError> {
        let limits = self.coordinator.limits();
        validate::identifier("payment.participant", &p.participant, limits.max_id_bytes)?;
        if self.registry.get(&p.participant).is_none() {
            return Err(FieldError::new(
                "payment.participant",
                format!("names no registered participant ({:?})", p.participant),
            ));
        }
        validate::identifier("payment.payment_ref", &p.payment_ref, limits.max_id_bytes)?;
        if p.amount_minor <= 0 {
            return Err(FieldError::new("payment.amount_minor", "must be > 0"));
        }
        if p.currency.len() != 3 || !p.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(FieldError::new(
                "payment.currency",
                "must be an ISO 4217 code such as \"EUR\"",
            ));
        }
        Ok(())
    }
}

fn encode_page_token(created_at: chrono::DateTime<chrono::Utc>, id: Uuid) -> String {
    format!("{}.{}", created_at.timestamp_micros(), id.simple())
}

fn decode_page_token(token: &str) -> Result<(chrono::DateTime<chrono::Utc>, Uuid), FieldError> {
    let bad = || FieldError::new("page_token", "is not a token from a previous response");
    let (micros, id) = token.split_once('.').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let ts = chrono::DateTime::from_timestamp_micros(micros).ok_or_else(bad)?;
    let id = Uuid::parse_str(id).map_err(|_| bad())?;
    Ok((ts, id))
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
            if let Some(p) = &req.payment {
                self.check_payment(p).map_err(Error::from)?;
            }
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
            let req = request.into_inner();
            if req.page_size < 0 {
                return Err(Error::from(FieldError::new("page_size", "must be >= 0")).into());
            }
            let query = ListQuery {
                holder: (!req.holder.is_empty()).then_some(req.holder),
                state: convert::state_filter(req.state).map_err(Error::from)?,
                limit: u32::try_from(req.page_size).unwrap_or(0),
                after: if req.page_token.is_empty() {
                    None
                } else {
                    Some(decode_page_token(&req.page_token).map_err(Error::from)?)
                },
            };
            let page = self.coordinator.list(query).await?;
            Ok(Response::new(proto::ListReservationsResponse {
                reservations: page
                    .reservations
                    .into_iter()
                    .map(|r| convert::reservation(r, Token::Omit))
                    .collect(),
                next_page_token: page
                    .next
                    .map(|(ts, id)| encode_page_token(ts, id))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let ts = chrono::DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(
            decode_page_token(&encode_page_token(ts, id)).unwrap(),
            (ts, id)
        );
        for bad in ["", "x", "1.2", "abc.0190f5c2-0000-7000-8000-000000000000"] {
            assert_eq!(decode_page_token(bad).unwrap_err().field, "page_token");
        }
    }
}
