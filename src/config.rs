//! Command-line and environment configuration: one struct per role, flags over `HOLDFAST_*`
//! environment variables over defaults.

use std::net::SocketAddr;
use std::time::Duration;

use crate::coordinator::Policy;
use crate::domain::validate::Limits;
use crate::registry::ParticipantEndpoint;

/// Parses durations such as `250ms`, `5s`, `10m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?} needs a unit: ms, s, m or h"))?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 5s, 10m, 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!(
            "{s:?} has unknown unit {unit:?}: use ms, s, m or h"
        )),
    }
}

/// Parses a listen address, or `off`.
pub fn parse_optional_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("{s:?} is not an address such as 127.0.0.1:9464 (or \"off\")"))
}

/// Parses `NAME=URL`.
pub fn parse_participant(s: &str) -> Result<(String, String), String> {
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

    /// PostgreSQL URL of the participant's database (created and migrated on start).
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

    /// Database connections in the pool.
    #[arg(long, env = "HOLDFAST_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,
}

/// The all-in-one port of each reference participant kind (SPEC section 5).
pub fn default_participant_port(kind: crate::participants::Kind) -> u16 {
    use crate::participants::Kind;
    match kind {
        Kind::Seats => 50061,
        Kind::Stock => 50062,
        Kind::Rooms => 50063,
        Kind::Payments => 50064,
        Kind::Noop => 50065,
    }
}

/// Settings of the coordinator role.
#[derive(clap::Args, Clone, Debug)]
pub struct CoordinatorArgs {
    /// Address the gRPC server listens on.
    #[arg(long, env = "HOLDFAST_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// PostgreSQL URL of the coordinator's database (created and migrated on start).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/holdfast"
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

    /// What to do with a payment that arrives after the hold expired.
    #[arg(long, env = "HOLDFAST_LATE_PAYMENT_POLICY", value_enum, default_value_t = crate::domain::LatePaymentPolicy::HonorIfAvailable)]
    pub late_payment_policy: crate::domain::LatePaymentPolicy,

    /// How long an instance owns work it drives before another replica may take it over.
    #[arg(long, env = "HOLDFAST_LEASE", default_value = "30s", value_parser = parse_duration)]
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
}

impl CoordinatorArgs {
    /// The participant registry's endpoints.
    pub fn endpoints(&self) -> Vec<ParticipantEndpoint> {
        self.participants
            .iter()
            .map(|(name, url)| ParticipantEndpoint {
                name: name.clone(),
                url: url.clone(),
                timeout: self.participant_timeout,
            })
            .collect()
    }

    /// Input limits, with this configuration's ttl bounds.
    pub fn limits(&self) -> Result<Limits, String> {
        let limits = Limits {
            default_ttl: self.default_ttl,
            max_ttl: self.max_ttl,
            ..Limits::default()
        };
        if limits.max_ttl < limits.min_ttl {
            return Err(format!("--max-ttl must be at least {:?}", limits.min_ttl));
        }
        if limits.default_ttl < limits.min_ttl || limits.default_ttl > limits.max_ttl {
            return Err("--default-ttl must be between 1s and --max-ttl".into());
        }
        Ok(limits)
    }

    /// Lifecycle policy.
    pub fn policy(&self) -> Result<Policy, String> {
        if self.max_extensions < 0 {
            return Err("--max-extensions must be >= 0".into());
        }
        if self.lease < self.participant_timeout * 2 {
            return Err("--lease must be at least twice --participant-timeout".into());
        }
        if self.retry_base.is_zero() || self.retry_cap < self.retry_base {
            return Err("--retry-base must be > 0 and <= --retry-cap".into());
        }
        if self.sweep_interval.is_zero() {
            return Err("--sweep-interval must be > 0".into());
        }
        Ok(Policy {
            max_extensions: self.max_extensions,
            lease: self.lease,
            backoff: crate::store::Backoff {
                base: self.retry_base,
                cap: self.retry_cap,
            },
            sweep_interval: self.sweep_interval,
            late_payment: self.late_payment_policy,
            hold_limits: crate::store::HoldLimits {
                per_holder: self.max_active_holds_per_holder,
                total: self.max_active_holds_total,
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
