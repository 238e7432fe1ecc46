//! Configuration: one struct per role. Each setting comes from, in order of precedence, its
//! flag, its `HOLDFAST_*` environment variable, the TOML file named by `--config` /
//! `HOLDFAST_CONFIG` (keys are the flag names with `_` for `-`, read by [`file`]), then the
//! built-in default. The file's settings become the flags' defaults before parsing
//! ([`apply_config_file`]), so every value, wherever it came from, is checked by the same parser.
//! The TLS settings of every role live in [`tls`]; identity and secrets in [`auth`].

pub mod auth;
pub mod connections;
mod file;
mod help;
pub mod http;
mod lease;
mod limits;
pub mod nats;
pub mod ops;
mod parse;
pub mod sinks;
pub mod test_mode;
pub mod tls;
pub mod waitlist;
pub mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::coordinator::Policy;
use crate::registry::ParticipantEndpoint;
pub use file::apply_config_file;
pub use help::plain_help;
pub(crate) use parse::{
    format_duration, format_period, mask_password, parse_duration, parse_optional_addr,
};

/// The embedded default of the all-in-one (and the coordinator role): SQLite under `./data`.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://./data/holdfast.db";

/// Parses `NAME=URL`.
pub(crate) fn parse_participant(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=URL (e.g. seats=http://127.0.0.1:50061)"))?;
    let (name, url) = (name.trim(), url.trim());
    if name.is_empty() || url.is_empty() {
        return Err(format!("{s:?} is not NAME=URL"));
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "{s:?}: the URL must start with http:// or https://"
        ));
    }
    Ok((name.to_owned(), url.to_owned()))
}

/// Settings of one reference participant process.
#[derive(clap::Args, Clone, Debug)]
pub struct ParticipantArgs {
    /// Which reference participant to run.
    #[arg(value_enum)]
    pub kind: crate::participants::Kind,

    /// Address the gRPC server listens on (default: the kind's all-in-one port, 5006x).
    #[arg(long, env = "HOLDFAST_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// URL of the participant's database (created and migrated on start): postgres://... or
    /// sqlite://path/to/file.db (not for stock-redis).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/holdfast"
    )]
    pub database_url: String,

    /// How long past `expires_at` an unreleased hold is kept before the participant may
    /// reclaim it on its own.
    #[arg(long, env = "HOLDFAST_ORPHAN_GRACE", default_value = "1h", value_parser = parse_duration)]
    pub orphan_grace: Duration,

    /// How far ahead a Try's `expires_at` may lie: a Try asking to be held longer is refused
    /// (`INVALID_ARGUMENT` naming `expires_at`) and nothing is written.
    #[arg(long, env = "HOLDFAST_MAX_HOLD", default_value = "24h", value_parser = parse_duration)]
    pub max_hold: Duration,

    /// Database connections in the pool.
    #[arg(long, env = "HOLDFAST_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,

    /// Redis URL, required by (and only used by) the `stock-redis` participant.
    #[arg(long, env = "HOLDFAST_REDIS_URL")]
    pub redis_url: Option<String>,

    /// PEM CA file a `rediss://` Redis server's certificate must chain to, trusted alone
    /// (default: the system roots).
    #[arg(long, env = "HOLDFAST_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,

    /// Prefix of every Redis key of the `stock-redis` participant.
    #[arg(long, env = "HOLDFAST_REDIS_PREFIX", default_value = crate::participants::stock_redis::DEFAULT_PREFIX)]
    pub redis_prefix: String,

    /// How long a finished `stock-redis` branch record stays in Redis past its hold's
    /// `expires_at + orphan_grace` (late calls within it answer as before; after it, a
    /// confirmed branch is answered from the durable record).
    #[arg(long, env = "HOLDFAST_REDIS_RETENTION", default_value = "168h", value_parser = parse_duration)]
    pub redis_retention: Duration,

    /// A TOML file of settings (its `[participant]` table); flags and env vars override it.
    #[arg(long, env = "HOLDFAST_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub tls: tls::ServerTlsArgs,

    #[command(flatten)]
    pub auth: auth::ServerAuthArgs,

    #[command(flatten)]
    pub retention: ops::RetentionArgs,

    #[command(flatten)]
    pub metrics: ops::ParticipantMetricsArgs,

    #[command(flatten)]
    pub connections: connections::ConnectionArgs,
}

/// The all-in-one port of each reference participant kind (SPEC section 5).
pub(crate) fn default_participant_port(kind: crate::participants::Kind) -> u16 {
    use crate::participants::Kind;
    match kind {
        Kind::Seats => 50061,
        Kind::Stock => 50062,
        Kind::Rooms => 50063,
        Kind::Payments => 50064,
        Kind::Noop => 50065,
        Kind::StockRedis => 50066,
    }
}

/// Settings of the coordinator role.
#[derive(clap::Args, Clone, Debug)]
pub struct CoordinatorArgs {
    /// Address the gRPC server listens on.
    #[arg(long, env = "HOLDFAST_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// URL of the coordinator's database (created and migrated on start): postgres://... or
    /// sqlite://path/to/file.db. The all-in-one puts the participants beside it (SQLite:
    /// `participants/<name>.db` in the same folder; PostgreSQL: the same database).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL
    )]
    pub database_url: String,

    /// Where Prometheus metrics are served (GET /metrics), or `off`.
    #[arg(long, env = "HOLDFAST_METRICS_LISTEN", default_value = "127.0.0.1:9464", value_parser = parse_optional_addr)]
    pub metrics_listen: std::option::Option<SocketAddr>,

    /// A participant, as NAME=URL. Repeatable; the env var takes a comma-separated list.
    #[arg(long = "participant", env = "HOLDFAST_PARTICIPANTS", value_delimiter = ',', value_parser = parse_participant)]
    pub participants: Vec<(String, String)>,

    /// Deadline of each call to a participant.
    #[arg(long, env = "HOLDFAST_PARTICIPANT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub participant_timeout: Duration,

    /// Database connections in the pool.
    #[arg(long, env = "HOLDFAST_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,

    /// Hold duration when Reserve gives no ttl.
    #[arg(long, env = "HOLDFAST_DEFAULT_TTL", default_value = "10m", value_parser = parse_duration)]
    pub default_ttl: Duration,

    /// Longest hold duration, including extensions.
    #[arg(long, env = "HOLDFAST_MAX_TTL", default_value = "1h", value_parser = parse_duration)]
    pub max_ttl: Duration,

    /// How many times a reservation may be extended.
    #[arg(long, env = "HOLDFAST_MAX_EXTENSIONS", default_value_t = 1)]
    pub max_extensions: i32,

    /// Live reservations (placing or held) one holder may have at once.
    #[arg(
        long,
        env = "HOLDFAST_MAX_ACTIVE_HOLDS_PER_HOLDER",
        default_value_t = 5
    )]
    pub max_active_holds_per_holder: u32,

    /// Live reservations across all holders (0: no cap). A cap serialises Reserves.
    #[arg(long, env = "HOLDFAST_MAX_ACTIVE_HOLDS_TOTAL", default_value_t = 0)]
    pub max_active_holds_total: u32,

    /// How long a participant's refusal of a hold refuses the same hold again at once, with
    /// nothing recorded (`recorded` = `false`), until a unit of it is released here; `0s`
    /// turns this off. Units added another way (ResourceAdmin, another replica) are offered
    /// again within it.
    #[arg(long, env = "HOLDFAST_SOLD_OUT_HINT", default_value = "1s", value_parser = parse_duration)]
    pub sold_out_hint: Duration,

    /// What to do with a payment that arrives after the hold expired.
    #[arg(long, env = "HOLDFAST_LATE_PAYMENT_POLICY", value_enum, default_value_t = crate::domain::LatePaymentPolicy::HonorIfAvailable)]
    pub late_payment_policy: crate::domain::LatePaymentPolicy,

    /// How long an instance owns work it drives before another replica may take it over; at
    /// least --request-timeout + 2 x the longest participant timeout.
    #[arg(long, env = "HOLDFAST_LEASE", default_value = "60s", value_parser = parse_duration)]
    pub lease: Duration,

    /// How often the reaper/recovery looks for due work.
    #[arg(long, env = "HOLDFAST_SWEEP_INTERVAL", default_value = "250ms", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// First retry delay of an unfinished confirm/release (doubles per attempt, with jitter).
    #[arg(long, env = "HOLDFAST_RETRY_BASE", default_value = "200ms", value_parser = parse_duration)]
    pub retry_base: Duration,

    /// Longest retry delay.
    #[arg(long, env = "HOLDFAST_RETRY_CAP", default_value = "30s", value_parser = parse_duration)]
    pub retry_cap: Duration,

    /// Requests in flight at once; beyond it, requests are refused at once with
    /// RESOURCE_EXHAUSTED instead of queueing.
    #[arg(long, env = "HOLDFAST_MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,

    /// Longest time one request may take (a shorter client deadline wins).
    #[arg(long, env = "HOLDFAST_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// A TOML file of settings (top-level keys, `[participants]` registry); flags and env vars
    /// override it.
    #[arg(long, env = "HOLDFAST_CONFIG")]
    pub config: Option<PathBuf>,

    /// Redis URL; when set, the all-in-one also runs the `stock-redis` participant on :50066.
    #[arg(long, env = "HOLDFAST_REDIS_URL")]
    pub redis_url: Option<String>,

    /// All-in-one `stock-redis`: PEM CA file a `rediss://` Redis server's certificate must
    /// chain to, trusted alone (default: the system roots).
    #[arg(long, env = "HOLDFAST_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,

    /// All-in-one `stock-redis`: the prefix of every Redis key it owns (two deployments on one
    /// Redis need two prefixes).
    #[arg(long, env = "HOLDFAST_REDIS_PREFIX", default_value = crate::participants::stock_redis::DEFAULT_PREFIX)]
    pub redis_prefix: String,

    /// All-in-one `stock-redis`: how long a finished branch record stays in Redis past its
    /// hold's `expires_at + orphan_grace`.
    #[arg(long, env = "HOLDFAST_REDIS_RETENTION", default_value = "168h", value_parser = parse_duration)]
    pub redis_retention: Duration,

    /// Print the effective settings (after flags, env, file and defaults) and exit.
    #[arg(long)]
    pub print_config: bool,

    #[command(flatten)]
    pub tls: tls::ServerTlsArgs,

    #[command(flatten)]
    pub participant_tls: tls::ParticipantTlsArgs,

    #[command(flatten)]
    pub auth: auth::ServerAuthArgs,

    #[command(flatten)]
    pub secrets: auth::CoordinatorSecretArgs,

    #[command(flatten)]
    pub watch: watch::WatchArgs,

    #[command(flatten)]
    pub waitlist: waitlist::WaitlistArgs,

    #[command(flatten)]
    pub retention: ops::RetentionArgs,

    #[command(flatten)]
    pub http: http::HttpArgs,

    #[command(flatten)]
    pub sinks: sinks::SinkArgs,

    #[command(flatten)]
    pub nats: nats::NatsArgs,

    #[command(flatten)]
    pub test_mode: test_mode::TestModeArgs,

    #[command(flatten)]
    pub connections: connections::ConnectionArgs,

    /// Per-participant call timeouts from the config file.
    #[arg(skip)]
    pub participant_timeouts: HashMap<String, Duration>,
}

impl CoordinatorArgs {
    /// The participant registry's endpoints.
    pub fn endpoints(&self) -> Vec<ParticipantEndpoint> {
        self.participants
            .iter()
            .map(|(name, url)| ParticipantEndpoint {
                name: name.clone(),
                url: url.clone(),
                timeout: self
                    .participant_timeouts
                    .get(name)
                    .copied()
                    .unwrap_or(self.participant_timeout),
            })
            .collect()
    }

    /// The effective settings, as TOML (without secrets: database, Redis and participant
    /// passwords are masked).
    pub fn describe(&self) -> String {
        let mut out = self.describe_own();
        self.tls.describe(&mut out);
        self.participant_tls.describe(&mut out);
        self.auth.describe(&mut out);
        self.secrets.describe(&mut out);
        self.watch.describe(&mut out);
        self.waitlist.describe(&mut out);
        self.connections.describe(&mut out);
        self.retention.describe(&mut out);
        self.http.describe(&mut out);
        self.sinks.describe(&mut out);
        self.nats.describe(&mut out);
        self.test_mode.describe(&mut out);
        out.push_str("\n[participants]\n");
        for ep in self.endpoints() {
            out.push_str(&format!(
                "{} = {{ url = \"{}\", timeout = \"{}\" }}\n",
                ep.name,
                mask_password(&ep.url),
                format_duration(ep.timeout)
            ));
        }
        out
    }

    /// The settings of this struct's own fields (not the flattened groups'), as TOML lines.
    fn describe_own(&self) -> String {
        let ms = |d: Duration| format!("\"{}\"", format_duration(d));
        let quoted = |s: &str| format!("{s:?}");
        let policy = match self.late_payment_policy {
            crate::domain::LatePaymentPolicy::HonorIfAvailable => "honor-if-available",
            crate::domain::LatePaymentPolicy::Refund => "refund",
        };
        let metrics = self
            .metrics_listen
            .map_or("off".to_owned(), |a| a.to_string());
        let lines = [
            ("listen", quoted(&self.listen.to_string())),
            ("database_url", quoted(&mask_password(&self.database_url))),
            ("metrics_listen", quoted(&metrics)),
            ("participant_timeout", ms(self.participant_timeout)),
            ("db_pool_size", self.db_pool_size.to_string()),
            ("default_ttl", ms(self.default_ttl)),
            ("max_ttl", ms(self.max_ttl)),
            ("max_extensions", self.max_extensions.to_string()),
            (
                "max_active_holds_per_holder",
                self.max_active_holds_per_holder.to_string(),
            ),
            (
                "max_active_holds_total",
                self.max_active_holds_total.to_string(),
            ),
            ("sold_out_hint", ms(self.sold_out_hint)),
            ("late_payment_policy", quoted(policy)),
            ("lease", ms(self.lease)),
            ("sweep_interval", ms(self.sweep_interval)),
            ("retry_base", ms(self.retry_base)),
            ("retry_cap", ms(self.retry_cap)),
            (
                "max_concurrent_requests",
                self.max_concurrent_requests.to_string(),
            ),
            ("request_timeout", ms(self.request_timeout)),
            ("redis_retention", ms(self.redis_retention)),
            ("redis_prefix", quoted(&self.redis_prefix)),
        ];
        let mut out: String = lines.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        match &self.redis_url {
            Some(url) => out.push_str(&format!("redis_url = {}\n", quoted(&mask_password(url)))),
            None => out.push_str("# redis_url: not set (no stock-redis participant)\n"),
        }
        out
    }

    /// Lifecycle policy.
    pub fn policy(&self) -> Result<Policy, String> {
        if self.max_extensions < 0 {
            return Err("--max-extensions must be >= 0".into());
        }
        lease::check(self)?;
        if self.retry_base.is_zero() || self.retry_cap < self.retry_base {
            return Err("--retry-base must be > 0 and <= --retry-cap".into());
        }
        if self.sweep_interval.is_zero() {
            return Err("--sweep-interval must be > 0".into());
        }
        Ok(Policy {
            max_extensions: self.max_extensions,
            lease: self.lease,
            backoff: crate::domain::policy::Backoff {
                base: self.retry_base,
                cap: self.retry_cap,
            },
            sweep_interval: self.sweep_interval,
            late_payment: self.late_payment_policy,
            hold_limits: crate::domain::policy::HoldLimits {
                per_holder: self.max_active_holds_per_holder,
                total: self.max_active_holds_total,
            },
            watch: self.watch.limits()?,
            queue: self.waitlist.policy()?,
            sold_out_hint: self.sold_out_hint,
            retention: crate::coordinator::Retention {
                keep: self.retention.keep(),
                events_keep: self.sinks.events_retention,
                ..Default::default()
            },
            ..Policy::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_participants_parse_or_explain() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("10").unwrap_err().contains("unit"));
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert_eq!(
            parse_participant("seats=http://127.0.0.1:50061").unwrap(),
            ("seats".into(), "http://127.0.0.1:50061".into())
        );
        assert!(parse_participant("seats").is_err());
        assert!(parse_participant("seats=127.0.0.1:1").is_err());
    }
}
