//! The NATS JetStream sink's settings (SPEC 10) for the coordinator and the all-in-one:
//! `--events-nats-url` turns it on; `--events-nats-ca` (a `tls://` server's CA),
//! `--events-nats-subject`, `--events-nats-stream`, `--events-nats-create-stream` and
//! `--events-format` say where and how events are published.

use std::path::PathBuf;

use super::mask_password;
use crate::sinks::nats::{EventFormat, NatsSettings};

/// The NATS sink's flags.
#[derive(clap::Args, Clone, Debug)]
pub struct NatsArgs {
    /// A NATS server with JetStream to publish every event to, as nats://HOST:4222 or
    /// tls://HOST:4222 (a comma-separated list for a cluster); not set: no NATS sink.
    #[arg(long, env = "HOLDFAST_EVENTS_NATS_URL")]
    pub events_nats_url: Option<String>,

    /// PEM CA file a tls:// NATS server's certificate must chain to (default: the system
    /// roots).
    #[arg(long, env = "HOLDFAST_EVENTS_NATS_CA")]
    pub events_nats_ca: Option<PathBuf>,

    /// The subjects' prefix: events are published to
    /// `<prefix>.reservation.<type in lower case>` (`holdfast.reservation.reservation_held`).
    #[arg(long, env = "HOLDFAST_EVENTS_NATS_SUBJECT", default_value = "holdfast")]
    pub events_nats_subject: String,

    /// The JetStream stream that takes `<prefix>.reservation.>`.
    #[arg(
        long,
        env = "HOLDFAST_EVENTS_NATS_STREAM",
        default_value = "HOLDFAST_EVENTS"
    )]
    pub events_nats_stream: String,

    /// Create the stream (file storage, a 10-minute duplicate window) when it does not exist.
    #[arg(long, env = "HOLDFAST_EVENTS_NATS_CREATE_STREAM")]
    pub events_nats_create_stream: bool,

    /// The payload of a NATS message: the event as JSON (the JSON API's shape) or as a
    /// protobuf `tcc.v1.Event`.
    #[arg(long, env = "HOLDFAST_EVENTS_FORMAT", value_enum, default_value_t = EventFormat::Json)]
    pub events_format: EventFormat,
}

impl NatsArgs {
    /// The sink's settings; `None` without `--events-nats-url`.
    pub fn settings(&self) -> Option<NatsSettings> {
        let url = self.events_nats_url.clone()?;
        let mut settings = NatsSettings::new(url);
        settings.ca = self.events_nats_ca.clone();
        settings.subject_prefix = self.events_nats_subject.clone();
        settings.stream = self.events_nats_stream.clone();
        settings.create_stream = self.events_nats_create_stream;
        settings.format = self.events_format;
        Some(settings)
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        match &self.events_nats_url {
            Some(url) => out.push_str(&format!("events_nats_url = {:?}\n", mask_password(url))),
            None => out.push_str("# events_nats_url: not set (no NATS sink)\n"),
        }
        match &self.events_nats_ca {
            Some(ca) => out.push_str(&format!(
                "events_nats_ca = {:?}\n",
                ca.display().to_string()
            )),
            None => out.push_str("# events_nats_ca: not set (the system roots)\n"),
        }
        out.push_str(&format!(
            "events_nats_subject = {:?}\nevents_nats_stream = {:?}\nevents_nats_create_stream = {}\nevents_format = {:?}\n",
            self.events_nats_subject,
            self.events_nats_stream,
            self.events_nats_create_stream,
            self.events_format.name()
        ));
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        nats: NatsArgs,
    }

    #[test]
    fn the_flags_make_the_sink_settings() {
        let none = Flags::try_parse_from(["t"]).unwrap().nats;
        assert!(none.settings().is_none());
        let given = Flags::try_parse_from([
            "t",
            "--events-nats-url",
            "nats://127.0.0.1:4222",
            "--events-nats-subject",
            "shop",
            "--events-nats-create-stream",
            "--events-format",
            "protobuf",
        ])
        .unwrap()
        .nats;
        let settings = given.settings().unwrap();
        assert_eq!(settings.subject_prefix, "shop");
        assert_eq!(settings.stream, "HOLDFAST_EVENTS");
        assert!(settings.create_stream);
        assert_eq!(settings.format, EventFormat::Protobuf);
        let mut described = String::new();
        given.describe(&mut described);
        assert!(
            described.contains("events_format = \"protobuf\""),
            "{described}"
        );
    }
}
