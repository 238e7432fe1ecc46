//! A typed async client of holdfast's `tcc.v1.Coordinator` (SPEC 3, 9).
//!
//! ```no_run
//! # async fn demo() -> Result<(), holdfast_client::Error> {
//! use std::time::Duration;
//! use holdfast_client::{Client, Hold, Reserve};
//!
//! let client = Client::builder("http://127.0.0.1:50051").api_key("...").connect().await?;
//! let held = client
//!     .reserve(Reserve::new("order-42", "alice").hold(Hold::new("seats", "A1")).ttl(Duration::from_secs(600)))
//!     .await?;
//! client.confirm(held.reservation.id, &held.hold_token, None).await?;
//! # Ok(()) }
//! ```
//!
//! - Values are typed: ids are [`uuid::Uuid`], times [`std::time::SystemTime`], ttls
//!   [`std::time::Duration`], states enums; errors carry a [`Reason`] parsed from the
//!   ErrorInfo the coordinator sends, the reservation id, and the server's retry hint.
//! - [`Client::reserve`] is retried with the same `request_id` when the coordinator is
//!   unavailable (a repeat is idempotent on the coordinator), with jittered exponential backoff
//!   that honours RetryInfo; nothing else is retried behind your back.
//! - [`Client::watch`] is a [`futures_core::Stream`] of the reservation's states.
//! - [`Client::events`] is a [`futures_core::Stream`] of every change the caller may see
//!   (SPEC 10: its own reservations', an admin's all) after a sequence, live, resuming by
//!   itself after the last sequence when the stream drops; [`Client::latest_sequence`] is
//!   where the log is now.
//!
//! ```no_run
//! # async fn demo(client: holdfast_client::Client) -> Result<(), holdfast_client::Error> {
//! use holdfast_client::{EventFilter, EventType};
//! let filter = EventFilter { types: vec![EventType::Expired], ..Default::default() };
//! let mut expiries = client.events(0, filter);
//! while let Some(event) = expiries.next().await {
//!     let event = event?;
//!     println!("{} expired (resume after {})", event.reservation.id, event.sequence);
//! }
//! # Ok(()) }
//! ```
//!
//! Its dependency tree is the generated API, tonic and a few small crates: no database driver,
//! no Redis, no OpenTelemetry SDK.

mod connect;
mod error;
mod events;
mod retry;
mod types;
mod watch;

pub use connect::ClientBuilder;
pub use error::{Error, Reason};
pub use events::{Event, EventFilter, EventType, Events};
pub use holdfast_proto as proto;
pub use retry::RetryPolicy;
pub use types::*;
pub use watch::Watch;

use std::time::Duration;

use tonic::codegen::InterceptedService;
use tonic::transport::Channel;
use uuid::Uuid;

use connect::Credential;
use proto::coordinator_client::CoordinatorClient;

type Inner = CoordinatorClient<InterceptedService<Channel, Credential>>;

/// A connection to one coordinator. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Inner,
    events: proto::events_client::EventsClient<InterceptedService<Channel, Credential>>,
    retry: RetryPolicy,
}

impl Client {
    /// Settings for a connection to the coordinator at `url` (`http://` or `https://`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url.into())
    }

    /// Connects to `url` with the defaults: no key, system roots for `https://`.
    pub async fn connect(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder(url).connect().await
    }

    /// Places every hold, all or nothing. Retried with the same `request_id` while the
    /// coordinator is unavailable (see [`RetryPolicy`]).
    pub async fn reserve(&self, request: Reserve) -> Result<Reserved, Error> {
        let message = request.into_proto();
        let mut attempt = 0;
        loop {
            let mut inner = self.inner.clone();
            match inner.reserve(message.clone()).await {
                Ok(answer) => return Reserved::from_proto(answer.into_inner()),
                Err(status) => {
                    let error = Error::from_status(&status);
                    match self.retry.delay(attempt, &error) {
                        Some(delay) => tokio::time::sleep(delay).await,
                        None => return Err(error),
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Confirms a held reservation, optionally with the payment that pays for it.
    pub async fn confirm(
        &self,
        id: Uuid,
        token: &HoldToken,
        payment: Option<Payment>,
    ) -> Result<Reservation, Error> {
        let request = proto::ConfirmRequest {
            reservation_id: id.to_string(),
            hold_token: token.expose().to_owned(),
            payment: payment.map(Payment::into_proto),
        };
        let answer = self.inner.clone().confirm(request).await;
        Reservation::from_answer(answer)
    }

    /// Releases a reservation (idempotent).
    pub async fn cancel(
        &self,
        id: Uuid,
        token: &HoldToken,
        reason: Option<&str>,
    ) -> Result<Reservation, Error> {
        let request = proto::CancelRequest {
            reservation_id: id.to_string(),
            hold_token: token.expose().to_owned(),
            reason: reason.unwrap_or_default().to_owned(),
        };
        Reservation::from_answer(self.inner.clone().cancel(request).await)
    }

    /// Pushes `expires_at` further out by `by` (default: the original ttl). With a
    /// `request_id`, a repeat of the same extension does not extend twice.
    pub async fn extend(
        &self,
        id: Uuid,
        token: &HoldToken,
        by: Option<Duration>,
        request_id: Option<&str>,
    ) -> Result<Reservation, Error> {
        let request = proto::ExtendRequest {
            reservation_id: id.to_string(),
            hold_token: token.expose().to_owned(),
            ttl: by.map(types::duration),
            request_id: request_id.unwrap_or_default().to_owned(),
        };
        Reservation::from_answer(self.inner.clone().extend(request).await)
    }

    /// Reads one reservation.
    pub async fn get(&self, id: Uuid) -> Result<Reservation, Error> {
        let request = proto::GetReservationRequest {
            reservation_id: id.to_string(),
        };
        Reservation::from_answer(self.inner.clone().get_reservation(request).await)
    }

    /// One page of reservations, newest first.
    pub async fn list(&self, filter: ListFilter) -> Result<Page, Error> {
        let answer = self
            .inner
            .clone()
            .list_reservations(filter.into_proto())
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner();
        Page::from_proto(answer)
    }

    /// The reservation's states as they change: the current one first, then one per change,
    /// ending after a terminal state.
    pub async fn watch(&self, id: Uuid) -> Result<Watch, Error> {
        let request = proto::WatchReservationRequest {
            reservation_id: id.to_string(),
        };
        let stream = self
            .inner
            .clone()
            .watch_reservation(request)
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner();
        Ok(Watch::new(stream))
    }

    /// The events after sequence `after` (0: from the oldest kept) that `filter` matches and
    /// this caller may see, oldest first, then live. Resumes by itself after the last
    /// sequence when the stream drops; ends only after an error that is not an outage (its
    /// last item).
    pub fn events(&self, after: i64, filter: EventFilter) -> Events {
        Events::new(self.events.clone(), after, &filter)
    }

    /// The latest sequence of the event log (0 when it is empty).
    pub async fn latest_sequence(&self) -> Result<i64, Error> {
        let answer = self
            .events
            .clone()
            .get_latest_sequence(proto::GetLatestSequenceRequest::default())
            .await
            .map_err(|s| Error::from_status(&s))?;
        Ok(answer.into_inner().sequence)
    }
}
