//! The TOML file named by `--config` / `HOLDFAST_CONFIG`, read into one struct per section:
//! the top level holds the coordinator's settings (the all-in-one's too) and its
//! `[participants]` registry, `[participant]` those of `holdfast participant <kind>`. A key is
//! its flag's name with `_` for `-`, of the TOML type the flag takes (a string, an integer, a
//! boolean, a list of strings); an unknown key or a wrong type is refused, naming the key and
//! the file.
//!
//! The file's settings become the defaults of their flags before the command line is parsed
//! ([`apply_config_file`]): flags, then `HOLDFAST_*`/`DATABASE_URL`, beat them by clap's own
//! order, and every value (a duration such as `"10m"`, an address, a policy) is checked by its
//! flag's parser wherever it came from.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

use super::parse_duration;

/// Settings the config file gave that flags cannot carry (per-participant timeouts).
#[derive(Clone, Debug, Default)]
pub struct FileExtras {
    pub participant_timeouts: HashMap<String, Duration>,
}

/// Declares the settings of one section of the file: every key optional, of the TOML type its
/// flag takes, any other key refused. `tables` are keys of the section that are not flags.
/// `flag_defaults` gives the settings present as the words their flag would take.
macro_rules! section {
    (
        $(#[$doc:meta])*
        $name:ident { $($key:ident: $ty:ty,)* }
        $(tables { $($table:ident: $table_ty:ty,)* })?
    ) => {
        $(#[$doc])*
        #[derive(Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            $($key: Option<$ty>,)*
            $($($table: Option<$table_ty>,)*)?
        }

        impl $name {
            /// The keys that set a flag of the same name.
            #[cfg(test)]
            const KEYS: &[&str] = &[$(stringify!($key)),*];

            /// The settings present, each as its flag's id and the values it would take.
            fn flag_defaults(&self) -> Vec<(&'static str, Vec<String>)> {
                let mut present = Vec::new();
                $(if let Some(value) = &self.$key {
                    present.push((stringify!($key), value.flag_values()));
                })*
                present
            }
        }
    };
}

section! {
    /// The top level: the coordinator's settings (and the all-in-one's). Strings are given to
    /// the flag's parser as they are: durations (`"10m"`), addresses (or `"off"`), URLs, the
    /// late payment policy, `retention` (`"30d"`, `"off"`).
    CoordinatorSection {
        listen: String,
        database_url: String,
        metrics_listen: String,
        participant_timeout: String,
        db_pool_size: u32,
        default_ttl: String,
        max_ttl: String,
        max_extensions: i32,
        max_active_holds_per_holder: u32,
        max_active_holds_total: u32,
        sold_out_hint: String,
        late_payment_policy: String,
        lease: String,
        sweep_interval: String,
        retry_base: String,
        retry_cap: String,
        max_concurrent_requests: usize,
        request_timeout: String,
        redis_url: String,
        redis_ca: PathBuf,
        redis_prefix: String,
        redis_retention: String,
        tls_cert: PathBuf,
        tls_key: PathBuf,
        tls_client_ca: PathBuf,
        participant_ca: PathBuf,
        participant_client_cert: PathBuf,
        participant_client_key: PathBuf,
        allow_plaintext_participants: bool,
        auth_keys: PathBuf,
        insecure_no_auth: bool,
        participant_api_key_file: PathBuf,
        token_secret_file: PathBuf,
        ephemeral_token_secret: bool,
        max_watches: usize,
        max_watches_per_connection: usize,
        max_watches_per_principal: usize,
        watch_poll_interval: String,
        max_queue_wait: String,
        max_queue_length: u32,
        queue_sweep: String,
        retention: String,
        http_listen: String,
        http_allowed_hosts: List,
        http_allowed_origins: List,
        test_mode: bool,
        header_timeout: String,
        idle_timeout: String,
        max_connections: usize,
        events_retention: String,
        webhooks: List,
        webhook_filters: List,
        webhook_secret_file: PathBuf,
        webhook_give_up: String,
        webhook_ca: PathBuf,
        events_nats_url: String,
        events_nats_ca: PathBuf,
        events_nats_subject: String,
        events_nats_stream: String,
        events_nats_create_stream: bool,
        events_format: String,
    }
    tables {
        participants: BTreeMap<String, Participant>,
        participant: ParticipantSection,
    }
}

section! {
    /// `[participant]`: the settings of `holdfast participant <kind>`.
    ParticipantSection {
        kind: String,
        listen: String,
        database_url: String,
        orphan_grace: String,
        max_hold: String,
        db_pool_size: u32,
        redis_url: String,
        redis_ca: PathBuf,
        redis_prefix: String,
        redis_retention: String,
        tls_cert: PathBuf,
        tls_key: PathBuf,
        tls_client_ca: PathBuf,
        auth_keys: PathBuf,
        insecure_no_auth: bool,
        retention: String,
        metrics_listen: String,
        header_timeout: String,
        idle_timeout: String,
        max_connections: usize,
    }
}

/// A setting's value in the words its flag takes.
trait FlagValues {
    fn flag_values(&self) -> Vec<String>;
}

macro_rules! flag_value_by_display {
    ($($ty:ty),*) => {$(
        impl FlagValues for $ty {
            fn flag_values(&self) -> Vec<String> {
                vec![self.to_string()]
            }
        }
    )*};
}
flag_value_by_display!(String, bool, u32, i32, usize);

impl FlagValues for PathBuf {
    fn flag_values(&self) -> Vec<String> {
        vec![self.display().to_string()]
    }
}

/// A repeatable flag's values: a list of strings, or one string.
#[derive(Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of strings")]
enum List {
    One(String),
    Many(Vec<String>),
}

impl FlagValues for List {
    fn flag_values(&self) -> Vec<String> {
        match self {
            List::One(one) => vec![one.clone()],
            List::Many(many) => many.clone(),
        }
    }
}

/// One `[participants]` entry: `NAME = "URL"` or `NAME = { url = "URL", timeout = "2s" }`.
struct Participant {
    url: String,
    timeout: Option<Duration>,
}

/// The table form of a [`Participant`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParticipantTable {
    url: String,
    #[serde(default, deserialize_with = "duration")]
    timeout: Option<Duration>,
}

impl<'de> Deserialize<'de> for Participant {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UrlOrTable;
        impl<'de> Visitor<'de> for UrlOrTable {
            type Value = Participant;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a URL or a table { url = \"URL\", timeout = \"2s\" }")
            }

            fn visit_str<E: de::Error>(self, url: &str) -> Result<Participant, E> {
                Ok(Participant {
                    url: url.to_owned(),
                    timeout: None,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Participant, A::Error> {
                let table =
                    ParticipantTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Participant {
                    url: table.url,
                    timeout: table.timeout,
                })
            }
        }
        deserializer.deserialize_any(UrlOrTable)
    }
}

/// A duration such as `"2s"`, read by the flags' own parser.
fn duration<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map(Some).map_err(de::Error::custom)
}

/// Finds the config file named by `--config FILE`, `--config=FILE`, or `HOLDFAST_CONFIG`.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("HOLDFAST_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Reads the config file (if one is named) and makes its settings the defaults of the matching
/// flags of `cmd`. Unknown settings, wrong types and unreadable files are errors naming the file
/// (and the key).
pub fn apply_config_file(
    cmd: clap::Command,
    args: &[OsString],
) -> Result<(clap::Command, FileExtras), String> {
    let Some(path) = config_path(args) else {
        return Ok((cmd, FileExtras::default()));
    };
    let shown = path.display();
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("config file {shown}: cannot read it: {e}"))?;
    let file = read(&text).map_err(|e| format!("config file {shown}{e}"))?;
    Ok(file.apply(cmd))
}

/// The file's sections, or why not (`: ...` or ` line N: ...`, to follow the file's name).
fn read(text: &str) -> Result<CoordinatorSection, String> {
    let deserializer =
        toml::Deserializer::parse(text).map_err(|e| format!(": not valid TOML: {e}"))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| explain(&e, text))
}

/// A refused setting, named by its path in the file (`participants.seats.timeout`).
fn explain(e: &serde_path_to_error::Error<toml::de::Error>, text: &str) -> String {
    let key = e.path().to_string();
    let line = e
        .inner()
        .span()
        .and_then(|span| text.get(..span.start))
        .map_or(String::new(), |before| {
            format!(" line {}", before.matches('\n').count() + 1)
        });
    let message = e.inner().message();
    // serde words an unknown key "unknown field `KEY`, expected one of ...".
    match message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
    {
        Some((_, expected)) => format!("{line}: unknown setting `{key}`{expected}"),
        None => format!("{line}: `{key}`: {message}"),
    }
}

impl CoordinatorSection {
    /// `cmd` with this file's settings as the defaults of their flags: the top level's on the
    /// all-in-one and `holdfast coordinator`, `[participant]`'s on `holdfast participant`.
    fn apply(self, mut cmd: clap::Command) -> (clap::Command, FileExtras) {
        let mut settings = self.flag_defaults();
        let mut extras = FileExtras::default();
        if let Some(registry) = &self.participants {
            let entries = registry
                .iter()
                .map(|(name, p)| format!("{name}={}", p.url))
                .collect();
            settings.push(("participants", entries));
            extras.participant_timeouts = registry
                .iter()
                .filter_map(|(name, p)| Some((name.clone(), p.timeout?)))
                .collect();
        }
        for (key, values) in &settings {
            cmd = with_default(cmd, None, key, values);
            cmd = with_default(cmd, Some("coordinator"), key, values);
        }
        let participant = self.participant.unwrap_or_default();
        for (key, values) in &participant.flag_defaults() {
            cmd = with_default(cmd, Some("participant"), key, values);
        }
        (cmd, extras)
    }
}

/// `cmd` with `values` as the default of its flag `key` (of its subcommand `role`). Every key
/// of a section is a flag of its role (the tests below hold the two lists together).
fn with_default(
    cmd: clap::Command,
    role: Option<&str>,
    key: &str,
    values: &[String],
) -> clap::Command {
    let has_flag = |c: &clap::Command| c.get_arguments().any(|a| a.get_id() == key);
    let set = |c: clap::Command| {
        let values = values.to_vec();
        c.mut_arg(key, move |a| a.default_values(values))
    };
    match role {
        None if has_flag(&cmd) => set(cmd),
        Some(role) if cmd.find_subcommand(role).is_some_and(has_flag) => {
            cmd.mut_subcommand(role, set)
        }
        _ => cmd,
    }
}

#[cfg(test)]
mod tests;
