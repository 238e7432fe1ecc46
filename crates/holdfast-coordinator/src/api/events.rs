//! The `tcc.v1.Events` service (SPEC 10): thin handlers over the coordinator's event feed.
//! Subscribe parses and checks its request here and scopes it to the caller (a client its own
//! reservations' events, an admin all); the paging and heartbeats are `events/subscription.rs`
//! (behind `coordinator/subscribe.rs`), the filter the domain's.

use std::pin::Pin;

use futures_util::StreamExt;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::convert;
use super::{actor, observed};
use crate::coordinator::{Coordinator, Delivery, Error};
use crate::domain::validate::FieldError;
use crate::domain::{EventFilter, EventType};
use crate::proto;

/// Holders or participants a filter may name.
const MAX_FILTER_NAMES: usize = 64;

/// Labels a filter may require.
const MAX_FILTER_LABELS: usize = 16;

/// The `tcc.v1.Events` service.
#[derive(Clone)]
pub(crate) struct EventsApi {
    coordinator: Coordinator,
}

impl EventsApi {
    pub(crate) fn new(coordinator: Coordinator) -> EventsApi {
        EventsApi { coordinator }
    }

    /// The tonic service, with the request size limit applied.
    pub(crate) fn into_server(self) -> proto::events_server::EventsServer<EventsApi> {
        proto::events_server::EventsServer::new(self).max_decoding_message_size(1024 * 1024)
    }
}

/// A Subscribe request's start and filter, checked.
fn subscription(req: proto::SubscribeRequest) -> Result<(i64, EventFilter), FieldError> {
    if req.after_sequence < 0 {
        return Err(FieldError::new("after_sequence", "must be >= 0"));
    }
    let f = req.filter.unwrap_or_default();
    let at_most = |field: &str, count: usize, max: usize| {
        if count > max {
            Err(FieldError::new(
                field,
                format!("at most {max} (got {count})"),
            ))
        } else {
            Ok(())
        }
    };
    at_most("filter.holders", f.holders.len(), MAX_FILTER_NAMES)?;
    at_most(
        "filter.participants",
        f.participants.len(),
        MAX_FILTER_NAMES,
    )?;
    at_most("filter.labels", f.labels.len(), MAX_FILTER_LABELS)?;
    let mut types = Vec::with_capacity(f.types.len());
    for (i, t) in f.types.iter().enumerate() {
        types.push(event_type(&format!("filter.types[{i}]"), *t)?);
    }
    Ok((
        req.after_sequence,
        EventFilter {
            holders: f.holders,
            labels: f.labels.into_iter().collect(),
            types,
            participants: f.participants,
        },
    ))
}

/// A type a filter may name: a change, not HEARTBEAT or TYPE_UNSPECIFIED.
fn event_type(field: &str, value: i32) -> Result<EventType, FieldError> {
    proto::event::Type::try_from(value)
        .ok()
        .and_then(|t| EventType::parse(t.as_str_name()))
        .filter(|t| *t != EventType::Heartbeat)
        .ok_or_else(|| {
            FieldError::new(
                field,
                format!("{value} is not an event type a filter can name (RESERVATION_HELD, ...; not HEARTBEAT)"),
            )
        })
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, Status>> + Send>>;

#[tonic::async_trait]
impl proto::events_server::Events for EventsApi {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<proto::SubscribeRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let actor = actor(&request)?;
        let connection = super::connection_of(&request);
        let (after, filter) = subscription(request.into_inner()).map_err(Error::from)?;
        let deliveries = self
            .coordinator
            .subscribe_events(&actor, connection, after, filter)?
            .map(|delivery| match delivery {
                Ok(Delivery::Event(e)) => Ok(convert::event(*e)),
                Ok(Delivery::Heartbeat(at)) => Ok(convert::heartbeat(at)),
                Err(e) => Err(Status::from(e)),
            });
        Ok(Response::new(Box::pin(deliveries)))
    }

    async fn get_latest_sequence(
        &self,
        request: Request<proto::GetLatestSequenceRequest>,
    ) -> Result<Response<proto::GetLatestSequenceResponse>, Status> {
        observed("GetLatestSequence", async move {
            let actor = actor(&request)?;
            let back = match request.get_ref().back {
                0 => None,
                n @ 1..=1000 => Some(n.unsigned_abs()),
                n => {
                    let bad = FieldError::new("back", format!("{n} is not between 0 and 1000"));
                    return Err(Error::from(bad).into());
                }
            };
            let sequence = self.coordinator.latest_event_sequence(&actor, back).await?;
            Ok(Response::new(proto::GetLatestSequenceResponse { sequence }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(req: proto::SubscribeRequest) -> String {
        subscription(req).unwrap_err().field
    }

    #[test]
    fn bad_requests_name_their_field() {
        let names = |n: usize| (0..n).map(|i| format!("n{i}")).collect::<Vec<_>>();
        let with = |filter: proto::EventFilter| proto::SubscribeRequest {
            after_sequence: 0,
            filter: Some(filter),
        };
        assert_eq!(
            refused(proto::SubscribeRequest {
                after_sequence: -1,
                filter: None
            }),
            "after_sequence"
        );
        assert_eq!(
            refused(with(proto::EventFilter {
                holders: names(65),
                ..Default::default()
            })),
            "filter.holders"
        );
        assert_eq!(
            refused(with(proto::EventFilter {
                participants: names(65),
                ..Default::default()
            })),
            "filter.participants"
        );
        assert_eq!(
            refused(with(proto::EventFilter {
                labels: names(17).into_iter().map(|n| (n.clone(), n)).collect(),
                ..Default::default()
            })),
            "filter.labels"
        );
        for bad in [0, 17, 99] {
            assert_eq!(
                refused(with(proto::EventFilter {
                    types: vec![2, bad],
                    ..Default::default()
                })),
                "filter.types[1]"
            );
        }
        let (after, filter) = subscription(with(proto::EventFilter {
            holders: names(64),
            types: vec![2, 8],
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(after, 0);
        assert_eq!(filter.types, vec![EventType::Held, EventType::Expired]);
    }
}
