//! The event feed (SPEC 10, `tcc.v1.Events`): [`crate::Client::events`] is a
//! [`futures_core::Stream`] of [`Event`]s after a sequence that resumes by itself - when the
//! stream drops (`UNAVAILABLE`: the coordinator restarting or shutting down, the network) it
//! subscribes again after the last sequence it saw, with a small jittered backoff - so a
//! reader gets every event once, in order. Heartbeats move that sequence without being
//! yielded. Any other error (a refusal, a malformed event) is the stream's last item.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures_core::Stream;
use tonic::Code;
use uuid::Uuid;

use crate::connect::Credential;
use crate::types::time;
use crate::{Error, Reason, Reservation, proto};

type EventsClient = proto::events_client::EventsClient<
    tonic::codegen::InterceptedService<tonic::transport::Channel, Credential>,
>;

/// The first wait before subscribing again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What an event says happened (`tcc.v1.Event.Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventType {
    Trying,
    Held,
    Queued,
    Confirming,
    Confirmed,
    Cancelling,
    Cancelled,
    Expired,
    Rejected,
    Failed,
    Extended,
    PaymentRecorded,
    RefundPending,
    RefundRefunded,
    RefundFailed,
    AdminAction,
}

/// Every type, in the order of `tcc.v1.Event.Type`.
const TYPES: [(EventType, proto::event::Type); 16] = {
    use EventType as E;
    use proto::event::Type as P;
    [
        (E::Trying, P::ReservationTrying),
        (E::Held, P::ReservationHeld),
        (E::Queued, P::ReservationQueued),
        (E::Confirming, P::ReservationConfirming),
        (E::Confirmed, P::ReservationConfirmed),
        (E::Cancelling, P::ReservationCancelling),
        (E::Cancelled, P::ReservationCancelled),
        (E::Expired, P::ReservationExpired),
        (E::Rejected, P::ReservationRejected),
        (E::Failed, P::ReservationFailed),
        (E::Extended, P::ReservationExtended),
        (E::PaymentRecorded, P::PaymentRecorded),
        (E::RefundPending, P::RefundPending),
        (E::RefundRefunded, P::RefundRefunded),
        (E::RefundFailed, P::RefundFailed),
        (E::AdminAction, P::AdminAction),
    ]
};

impl EventType {
    /// The wire name (`RESERVATION_HELD`), as the JSON API, NATS and webhooks show it.
    pub fn as_str(self) -> &'static str {
        self.into_proto().as_str_name()
    }

    fn into_proto(self) -> proto::event::Type {
        TYPES
            .iter()
            .find(|(t, _)| *t == self)
            .map_or(proto::event::Type::Unspecified, |(_, p)| *p)
    }

    fn from_proto(p: proto::event::Type) -> Option<EventType> {
        TYPES.iter().find(|(_, q)| *q == p).map(|(t, _)| *t)
    }
}

/// One change of a reservation.
#[derive(Clone, Debug)]
pub struct Event {
    /// Strictly increasing in the order events arrive; resume after it.
    pub sequence: i64,
    /// Unique per event.
    pub event_id: Uuid,
    pub event_type: EventType,
    /// When the change was written (the coordinator database's clock).
    pub occurred_at: SystemTime,
    /// The reservation as the change left it.
    pub reservation: Reservation,
    /// The principal it belongs to (empty when authentication is off).
    pub owner: String,
    /// On a [`EventType::Held`]: a waitlist offer placed it.
    pub from_queue: bool,
}

impl Event {
    fn from_proto(e: proto::Event) -> Result<Event, Error> {
        let bad = || Error::malformed("event");
        Ok(Event {
            sequence: e.sequence,
            event_id: Uuid::parse_str(&e.event_id).map_err(|_| bad())?,
            event_type: EventType::from_proto(e.r#type()).ok_or_else(bad)?,
            occurred_at: time(e.occurred_at)?,
            reservation: Reservation::from_proto(e.reservation.ok_or_else(bad)?)?,
            owner: e.owner,
            from_queue: e.from_queue,
        })
    }
}

/// Which events [`crate::Client::events`] yields: every given criterion must match; an empty
/// one matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Reservations of any of these holders (at most 64).
    pub holders: Vec<String>,
    /// Reservations carrying every one of these labels (at most 16).
    pub labels: BTreeMap<String, String>,
    /// Any of these types.
    pub types: Vec<EventType>,
    /// Reservations holding at any of these participants (at most 64).
    pub participants: Vec<String>,
}

impl EventFilter {
    fn to_proto(&self) -> proto::EventFilter {
        proto::EventFilter {
            holders: self.holders.clone(),
            labels: self.labels.clone().into_iter().collect(),
            types: self.types.iter().map(|t| t.into_proto() as i32).collect(),
            participants: self.participants.clone(),
        }
    }
}

/// Whether a failed or ended subscription is worth taking up again after the last sequence:
/// the coordinator unavailable (down, restarting, shutting down) or the connection dropped
/// under the stream (reported as CANCELLED or UNKNOWN, without a coordinator's reason).
fn resumable(error: &Error) -> bool {
    match error.code() {
        Code::Unavailable => true,
        Code::Cancelled | Code::Unknown => *error.reason() == Reason::Unspecified,
        _ => false,
    }
}

/// A subscription's state between items.
struct Reader {
    client: EventsClient,
    filter: proto::EventFilter,
    after: i64,
    open: Option<tonic::Streaming<proto::Event>>,
    backoff: Duration,
}

impl Reader {
    /// The next event, subscribing (again) as needed; `Err` ends the stream.
    async fn next(&mut self) -> Result<Event, Error> {
        loop {
            let dropped = match self.open.as_mut() {
                None => match self.subscribe().await {
                    Ok(stream) => {
                        self.open = Some(stream);
                        continue;
                    }
                    Err(status) => status,
                },
                Some(stream) => match stream.message().await {
                    Ok(Some(e)) => {
                        self.backoff = FIRST_BACKOFF;
                        self.after = self.after.max(e.sequence);
                        if e.r#type() == proto::event::Type::Heartbeat {
                            continue;
                        }
                        return Event::from_proto(e);
                    }
                    Ok(None) => tonic::Status::unavailable("the coordinator ended the stream"),
                    Err(status) => status,
                },
            };
            self.open = None;
            let error = Error::from_status(&dropped);
            if !resumable(&error) {
                return Err(error);
            }
            let wait = self.backoff.mul_f64(0.5 + fastrand::f64() / 2.0);
            tokio::time::sleep(wait.max(error.retry_after().unwrap_or_default())).await;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn subscribe(&mut self) -> Result<tonic::Streaming<proto::Event>, tonic::Status> {
        let request = proto::SubscribeRequest {
            after_sequence: self.after,
            filter: Some(self.filter.clone()),
        };
        Ok(self.client.subscribe(request).await?.into_inner())
    }
}

/// The events after a sequence, live, resuming by itself ([`crate::Client::events`]).
pub struct Events {
    inner: Pin<Box<dyn Stream<Item = Result<Event, Error>> + Send>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    pub(crate) fn new(client: EventsClient, after: i64, filter: &EventFilter) -> Events {
        let reader = Reader {
            client,
            filter: filter.to_proto(),
            after: after.max(0),
            open: None,
            backoff: FIRST_BACKOFF,
        };
        let inner = futures_util::stream::unfold(Some(reader), |reader| async move {
            let mut reader = reader?;
            match reader.next().await {
                Ok(event) => Some((Ok(event), Some(reader))),
                Err(error) => Some((Err(error), None)),
            }
        });
        Events {
            inner: Box::pin(inner),
        }
    }

    /// The next event, or `None` after the stream ended with an error.
    pub async fn next(&mut self) -> Option<Result<Event, Error>> {
        std::future::poll_fn(|cx| self.inner.as_mut().poll_next(cx)).await
    }
}

impl Stream for Events {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_wire_name_and_only_drops_and_outages_resume() {
        for (t, p) in TYPES {
            assert_eq!(EventType::from_proto(p), Some(t));
            assert_eq!(t.as_str(), p.as_str_name());
        }
        assert_eq!(EventType::from_proto(proto::event::Type::Heartbeat), None);
        let e = |code, reason| Error::for_test(code, reason, None);
        assert!(resumable(&e(Code::Unavailable, Reason::ShuttingDown)));
        assert!(resumable(&e(Code::Cancelled, Reason::Unspecified)));
        assert!(resumable(&e(Code::Unknown, Reason::Unspecified)));
        assert!(!resumable(&e(
            Code::InvalidArgument,
            Reason::InvalidArgument
        )));
        assert!(!resumable(&e(
            Code::PermissionDenied,
            Reason::PermissionDenied
        )));
    }
}
