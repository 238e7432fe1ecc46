//! Event sinks (SPEC 10): the coordinator delivers its event log to NATS JetStream and to
//! webhooks itself. Each sink keeps a durable cursor in the coordinator's database and is
//! delivered by one replica at a time (a lease); the delivery loop (`deliver.rs`) is the same
//! for every sink, which only says how to hand over one event ([`Sink`]). A Kafka or RabbitMQ
//! sink is one more implementation of the trait.

pub(crate) mod deliver;
pub mod webhook;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::proto;

pub use deliver::start;

/// Why a sink could not deliver an event: retried with backoff, in order.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SinkError(pub String);

/// What a [`Sink::deliver`] call achieved: the first `delivered` events of the batch are taken
/// for good; `error`, when set, is why the next one was not.
#[derive(Debug, Default)]
pub struct Delivered {
    pub delivered: usize,
    pub error: Option<SinkError>,
}

/// A destination of events. `deliver` counts an event only once the destination has taken it
/// for good (JetStream's acknowledgement, a webhook's 2xx): the cursor moves after it.
pub trait Sink: Send + Sync + 'static {
    /// The name its cursor is kept under (`nats`, `webhook:<name>`).
    fn name(&self) -> &str;

    /// Whether this sink takes this event at all (a webhook's type filter); the others are
    /// passed over as delivered.
    fn wants(&self, event: &proto::Event) -> bool {
        let _ = event;
        true
    }

    /// How long deliveries may fail without a success between before the sink is paused
    /// (until an operator resumes it); `None`: never paused, retried for as long as it fails.
    fn give_up(&self) -> Option<Duration> {
        None
    }

    /// Hands over `events` (in sequence order, all wanted), in order: a prefix of them is
    /// taken. A sink may also stop early without an error (a time budget): the loop comes back
    /// with the rest. A sink may pipeline (NATS publishes the batch, then awaits the
    /// acknowledgements).
    fn deliver<'a>(
        &'a self,
        events: &'a [proto::Event],
    ) -> Pin<Box<dyn Future<Output = Delivered> + Send + 'a>>;
}
