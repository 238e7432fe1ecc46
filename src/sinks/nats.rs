//! The NATS JetStream sink (SPEC 10): each event is published to
//! `<prefix>.reservation.<type in lower case>` with the header `Nats-Msg-Id` = its `event_id`,
//! its payload the JSON API's shape of the event (compact) or its protobuf encoding. A batch is
//! pipelined: every event is sent, then the acknowledgements are awaited in order, and the
//! acknowledged prefix counts as delivered. The stream's duplicate window makes a
//! re-publication after a crash (acknowledged, cursor not yet written) invisible to consumers.
//!
//! Connecting happens in the background (`retry_on_initial_connect`) and async-nats reconnects
//! by itself: a coordinator starts while NATS is down, its sink's lag grows, and the backlog
//! drains once NATS answers again. The stream is created on first use when asked
//! (`--events-nats-create-stream`), not at start, for the same reason.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use tokio::sync::OnceCell;

use super::{Delivered, Sink, SinkError};
use crate::proto;

/// The name of the NATS sink's cursor (Admin `ListSinks`).
pub const NATS_SINK_NAME: &str = "nats";

/// The duplicate window of a stream this sink creates: a re-publication within it is dropped
/// by JetStream. Longer than the sink's lease (a replica taking over a crashed one's sink
/// re-publishes what that one had sent) plus the delivery loop's backoff cap.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(10 * 60);

/// How the event is encoded in a message (`--events-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EventFormat {
    /// The JSON API's shape of the event, compact (application/json).
    #[default]
    Json,
    /// tcc.v1.Event in the protobuf encoding (application/protobuf).
    Protobuf,
}

impl EventFormat {
    /// The name `--events-format` takes.
    pub fn name(self) -> &'static str {
        match self {
            EventFormat::Json => "json",
            EventFormat::Protobuf => "protobuf",
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            EventFormat::Json => "application/json",
            EventFormat::Protobuf => "application/protobuf",
        }
    }

    /// The payload of `event`'s message.
    pub fn encode(self, event: &proto::Event) -> Result<Vec<u8>, SinkError> {
        match self {
            EventFormat::Json => crate::json::event_bytes(event)
                .map_err(|e| SinkError(format!("event {} as JSON: {e}", event.sequence))),
            EventFormat::Protobuf => Ok(prost::Message::encode_to_vec(event)),
        }
    }
}

/// Where and how the NATS sink publishes.
#[derive(Clone, Debug)]
pub struct NatsSettings {
    /// `nats://HOST:PORT` or `tls://HOST:PORT` (a comma-separated list for a cluster).
    pub url: String,
    /// PEM CA file a `tls://` server's certificate must chain to (default: the system roots).
    pub ca: Option<PathBuf>,
    /// The subjects' first part: `<prefix>.reservation.<type>`.
    pub subject_prefix: String,
    /// The JetStream stream that takes `<prefix>.reservation.>`.
    pub stream: String,
    /// Create the stream on first use when it does not exist.
    pub create_stream: bool,
    pub format: EventFormat,
    /// Bounds each connection attempt, each JetStream API call and each acknowledgement.
    pub timeout: Duration,
}

impl NatsSettings {
    /// The settings for `url` with the defaults of the flags.
    pub fn new(url: impl Into<String>) -> NatsSettings {
        NatsSettings {
            url: url.into(),
            ca: None,
            subject_prefix: "holdfast".to_owned(),
            stream: "HOLDFAST_EVENTS".to_owned(),
            create_stream: false,
            format: EventFormat::Json,
            timeout: Duration::from_secs(5),
        }
    }

    /// The subject `event` is published to (`holdfast.reservation.reservation_held`): the
    /// type's SPEC 10 name in lower case (the protobuf enum's names are those names).
    pub fn subject(&self, event: &proto::Event) -> String {
        let suffix = event.r#type().as_str_name().to_ascii_lowercase();
        format!("{}.reservation.{suffix}", self.subject_prefix)
    }

    /// The subjects of the stream: every event subject under the prefix.
    fn stream_subjects(&self) -> String {
        format!("{}.reservation.>", self.subject_prefix)
    }

    /// Refuses settings that cannot work, naming the flag.
    fn check(&self) -> Result<(), NatsError> {
        let bad =
            |reason: &str| NatsError::Config(format!("--events-nats-url {:?}: {reason}", self.url));
        let mut tls = false;
        for server in self.url.split(',').map(str::trim) {
            match server.split_once("://") {
                Some(("nats", rest)) | Some(("tls", rest)) if !rest.is_empty() => {
                    tls |= server.starts_with("tls://");
                    server
                        .parse::<async_nats::ServerAddr>()
                        .map_err(|e| bad(&e.to_string()))?;
                }
                _ => return Err(bad("give nats://HOST:PORT or tls://HOST:PORT")),
            }
        }
        if self.ca.is_some() && !tls {
            return Err(NatsError::Config(
                "--events-nats-ca needs a tls:// --events-nats-url".into(),
            ));
        }
        let subject_part = |s: &str| {
            !s.is_empty() && !s.contains(['*', '>', ' ', '\t', '\r', '\n']) && !s.starts_with('.')
        };
        if !subject_part(&self.subject_prefix) || self.subject_prefix.ends_with('.') {
            return Err(NatsError::Config(format!(
                "--events-nats-subject {:?}: a subject prefix (tokens separated by '.', no wildcards or spaces)",
                self.subject_prefix
            )));
        }
        if self.stream.is_empty() || self.stream.contains(['.', '*', '>', ' ', '/', '\\']) {
            return Err(NatsError::Config(format!(
                "--events-nats-stream {:?}: a stream name has no '.', '*', '>', '/', '\\' or spaces",
                self.stream
            )));
        }
        Ok(())
    }
}

/// Why the NATS sink could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("{0}")]
    Config(String),
    #[error("--events-nats-ca {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
}

/// Publishes events to a JetStream stream.
pub struct NatsSink {
    settings: NatsSettings,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// Set once the stream is known to exist (checked or created), with `create_stream`.
    stream_ready: OnceCell<()>,
}

impl std::fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSink")
            .field("settings", &self.settings)
            .finish()
    }
}

impl NatsSink {
    /// Checks `settings` (the URL, the CA file, the subject prefix, the stream name) and
    /// starts connecting in the background: NATS need not be up yet.
    pub async fn connect(settings: NatsSettings) -> Result<NatsSink, NatsError> {
        settings.check()?;
        let mut options = async_nats::ConnectOptions::new()
            .name("holdfast")
            .connection_timeout(settings.timeout)
            .request_timeout(Some(settings.timeout))
            .retry_on_initial_connect()
            .max_reconnects(None)
            // Back to NATS within a second of its return, at most.
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(100 * attempts.min(10) as u64)
            });
        if let Some(ca) = &settings.ca {
            check_ca(ca)?;
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        } else if settings.url.contains("tls://") {
            options = options.require_tls(true);
        }
        let client =
            options
                .connect(settings.url.as_str())
                .await
                .map_err(|e| NatsError::Connect {
                    url: settings.url.clone(),
                    reason: e.to_string(),
                })?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(settings.timeout)
            .build(client.clone());
        Ok(NatsSink {
            settings,
            client,
            jetstream,
            stream_ready: OnceCell::new(),
        })
    }

    /// The settings it publishes with.
    pub fn settings(&self) -> &NatsSettings {
        &self.settings
    }

    /// With `create_stream`: makes sure the stream exists (once per process, retried on
    /// each delivery until it succeeds).
    async fn ensure_stream(&self) -> Result<(), SinkError> {
        if !self.settings.create_stream {
            return Ok(());
        }
        self.stream_ready
            .get_or_try_init(|| async {
                let config = jetstream::stream::Config {
                    name: self.settings.stream.clone(),
                    subjects: vec![self.settings.stream_subjects()],
                    duplicate_window: DUPLICATE_WINDOW,
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                };
                let mut stream = self.jetstream.get_or_create_stream(config).await.map_err(
                    |e| SinkError(format!("stream {}: {e}", self.settings.stream)),
                )?;
                let window = stream
                    .info()
                    .await
                    .map(|info| info.config.duplicate_window)
                    .unwrap_or(DUPLICATE_WINDOW);
                if window < Duration::from_secs(120) {
                    tracing::warn!(stream = %self.settings.stream, ?window, "the NATS stream's duplicate window is short: an event re-published after a crash may be seen twice");
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Sends `event` (not yet acknowledged).
    async fn send(&self, event: &proto::Event) -> Result<PublishAckFuture, SinkError> {
        let message = PublishMessage::build()
            .message_id(&event.event_id)
            .header("Holdfast-Sequence", event.sequence.to_string().as_str())
            .header("Content-Type", self.settings.format.content_type())
            .payload(self.settings.format.encode(event)?.into());
        let subject = self.settings.subject(event);
        self.jetstream
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| self.publish_error(&subject, &e))
    }

    /// A publish failure, said for operators.
    fn publish_error(
        &self,
        subject: &str,
        e: &async_nats::jetstream::context::PublishError,
    ) -> SinkError {
        match e.kind() {
            PublishErrorKind::StreamNotFound => SinkError(format!(
                "no JetStream stream takes {subject} (create one for {}, or run with --events-nats-create-stream)",
                self.settings.stream_subjects()
            )),
            PublishErrorKind::TimedOut => SinkError(format!(
                "NATS did not acknowledge {subject} within {:?}",
                self.settings.timeout
            )),
            _ => SinkError(format!("publishing {subject} to NATS: {e}")),
        }
    }

    /// Publishes `events`, then awaits their acknowledgements in order.
    async fn publish(&self, events: &[proto::Event]) -> Delivered {
        if let Err(error) = self.ensure_stream().await {
            return failed(0, error);
        }
        let mut pending = Vec::with_capacity(events.len());
        let mut send_error = None;
        for event in events {
            match self.send(event).await {
                Ok(ack) => pending.push(ack),
                Err(e) => {
                    send_error = Some(e);
                    break;
                }
            }
        }
        let mut delivered = 0;
        for (ack, event) in pending.into_iter().zip(events) {
            if let Err(e) = ack.await {
                return failed(
                    delivered,
                    self.publish_error(&self.settings.subject(event), &e),
                );
            }
            delivered += 1;
        }
        if acknowledged_but_lost(&self.settings.subject_prefix) {
            return failed(0, SinkError("failpoint sinks.nats.acked".into()));
        }
        Delivered {
            delivered,
            error: send_error,
        }
    }
}

/// A [`Delivered`] of `delivered` events that stopped at `error`.
fn failed(delivered: usize, error: SinkError) -> Delivered {
    Delivered {
        delivered,
        error: Some(error),
    }
}

/// Failpoint `sinks.nats.acked` (tests): configured `return(<subject prefix>)`, the sink with
/// that prefix reports a batch JetStream acknowledged as not delivered, as a process that died
/// between the acknowledgements and the cursor write would leave it.
#[cfg(feature = "failpoints")]
fn acknowledged_but_lost(subject_prefix: &str) -> bool {
    fail::eval("sinks.nats.acked", |arg| {
        arg.as_deref() == Some(subject_prefix)
    }) == Some(true)
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn acknowledged_but_lost(_subject_prefix: &str) -> bool {
    false
}

/// Refuses a CA file that is missing or holds no PEM certificate.
fn check_ca(path: &std::path::Path) -> Result<(), NatsError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let bad = |reason: String| NatsError::Ca {
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(())
}

impl Sink for NatsSink {
    fn name(&self) -> &str {
        NATS_SINK_NAME
    }

    fn deliver<'a>(
        &'a self,
        events: &'a [proto::Event],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Delivered> + Send + 'a>> {
        Box::pin(async move {
            if self.client.connection_state() != async_nats::connection::State::Connected {
                return failed(
                    0,
                    SinkError(format!("not connected to NATS at {}", self.settings.url)),
                );
            }
            self.publish(events).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(t: proto::event::Type) -> proto::Event {
        proto::Event {
            sequence: 7,
            event_id: "0190b5b2-0000-7000-8000-000000000007".into(),
            r#type: t.into(),
            ..Default::default()
        }
    }

    #[test]
    fn subjects_are_the_prefix_and_the_type_in_lower_case() {
        let mut settings = NatsSettings::new("nats://127.0.0.1:4222");
        settings.subject_prefix = "shop.events".into();
        assert_eq!(
            settings.subject(&event(proto::event::Type::ReservationHeld)),
            "shop.events.reservation.reservation_held"
        );
        assert_eq!(
            settings.subject(&event(proto::event::Type::PaymentRecorded)),
            "shop.events.reservation.payment_recorded"
        );
        assert_eq!(settings.stream_subjects(), "shop.events.reservation.>");
    }

    #[test]
    fn settings_that_cannot_work_are_refused_naming_the_flag() {
        let with = |f: fn(&mut NatsSettings)| {
            let mut s = NatsSettings::new("nats://127.0.0.1:4222");
            f(&mut s);
            s.check().map_err(|e| e.to_string())
        };
        assert!(with(|_| {}).is_ok());
        assert!(with(|s| s.url = "tls://a:4222,tls://b:4222".into()).is_ok());
        let refused = [
            (
                with(|s| s.url = "http://127.0.0.1:4222".into()),
                "--events-nats-url",
            ),
            (with(|s| s.ca = Some("ca.pem".into())), "--events-nats-ca"),
            (
                with(|s| s.subject_prefix = "a.*".into()),
                "--events-nats-subject",
            ),
            (
                with(|s| s.subject_prefix = "a.".into()),
                "--events-nats-subject",
            ),
            (with(|s| s.stream = "A.B".into()), "--events-nats-stream"),
        ];
        for (answer, flag) in refused {
            assert!(
                answer.as_ref().is_err_and(|e| e.contains(flag)),
                "{answer:?}"
            );
        }
    }

    #[test]
    fn the_payload_is_the_json_shape_or_the_protobuf() {
        let e = event(proto::event::Type::ReservationConfirmed);
        let json: serde_json::Value =
            serde_json::from_slice(&EventFormat::Json.encode(&e).unwrap()).unwrap();
        assert_eq!(json["type"], "RESERVATION_CONFIRMED");
        assert_eq!(json["sequence"], 7);
        let decoded: proto::Event =
            prost::Message::decode(EventFormat::Protobuf.encode(&e).unwrap().as_slice()).unwrap();
        assert_eq!(decoded, e);
    }
}
