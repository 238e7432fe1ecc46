//! Operator settings (#17): `--retention` (SPEC 8.3) for the coordinator, the participants
//! and the all-in-one, and a participant's `--metrics-listen` (SPEC 8.5).

use std::net::SocketAddr;
use std::time::Duration;

use super::{parse_duration, parse_optional_addr};

/// The shortest `--retention` a participant takes. A barrier row (a Cancel-before-Try
/// tombstone above all) must outlive any Try still on its way to the participant: a request
/// lives at most the server's request cap (30 s) after it arrives, and a connection that stops
/// answering is dropped by HTTP/2 keepalive within 40 s, so ten minutes leaves a wide margin
/// (ARCHITECTURE.md, invariants).
pub(crate) const MIN_PARTICIPANT_RETENTION: Duration = Duration::from_secs(600);

/// `--retention`.
#[derive(clap::Args, Clone, Debug)]
pub struct RetentionArgs {
    /// How long finished reservations (and, at participants, finished branches' barrier and
    /// released hold rows) are kept before they are deleted, such as 30d, 12h or 90m; `off`
    /// keeps everything. A Reserve repeated after its reservation was deleted creates a new
    /// one: keep longer than any client retries.
    #[arg(long, env = "HOLDFAST_RETENTION", default_value = "30d", value_parser = parse_retention)]
    pub retention: Retention,
}

/// A parsed `--retention`: how long, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention(pub Option<Duration>);

/// Parses `off` or a duration with unit d, h, m, s or ms (`30d`).
pub(crate) fn parse_retention(s: &str) -> Result<Retention, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(Retention(None));
    }
    let keep = match s.strip_suffix('d') {
        Some(days) if !days.is_empty() && days.bytes().all(|b| b.is_ascii_digit()) => days
            .parse::<u64>()
            .ok()
            .and_then(|d| d.checked_mul(24 * 3600))
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{s:?} is too long"))?,
        _ => parse_duration(s).map_err(|e| format!("{e}, d, or \"off\""))?,
    };
    if keep.is_zero() {
        return Err("must be more than 0 (or \"off\")".into());
    }
    Ok(Retention(Some(keep)))
}

impl RetentionArgs {
    /// The coordinator's retention.
    pub fn keep(&self) -> Option<Duration> {
        self.retention.0
    }

    /// The retention of a role that runs participants (a participant, the all-in-one):
    /// at least [`MIN_PARTICIPANT_RETENTION`].
    pub(crate) fn participant_keep(&self) -> Result<Option<Duration>, String> {
        match self.retention.0 {
            Some(keep) if keep < MIN_PARTICIPANT_RETENTION => Err(format!(
                "--retention must be at least {}m where participants run (a late Try must still \
                 meet its branch's barrier row), or \"off\"",
                MIN_PARTICIPANT_RETENTION.as_secs() / 60
            )),
            keep => Ok(keep),
        }
    }

    /// The setting as a TOML line for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        match self.retention.0 {
            None => out.push_str("retention = \"off\"\n"),
            Some(d) => out.push_str(&format!("retention = \"{}\"\n", super::format_period(d))),
        }
    }
}

/// A participant's `--metrics-listen`.
#[derive(clap::Args, Clone, Debug)]
pub struct ParticipantMetricsArgs {
    /// Where Prometheus metrics are served (GET /metrics, over TLS when the participant has a
    /// certificate), or `off`.
    #[arg(long, env = "HOLDFAST_METRICS_LISTEN", default_value = "off", value_parser = parse_optional_addr)]
    // Spelled out so clap takes the parser's `Option` (`off`) as the value, not as "optional".
    pub metrics_listen: std::option::Option<SocketAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_parses_days_off_and_explains() {
        let days = |n: u64| Retention(Some(Duration::from_secs(n * 86_400)));
        assert_eq!(parse_retention("30d"), Ok(days(30)));
        assert_eq!(parse_retention("OFF"), Ok(Retention(None)));
        assert_eq!(
            parse_retention("90m"),
            Ok(Retention(Some(Duration::from_secs(5400))))
        );
        for bad in ["3x", "d", "0s", "-1d", "30"] {
            assert!(parse_retention(bad).is_err(), "{bad}");
        }
        let short = RetentionArgs {
            retention: Retention(Some(Duration::from_secs(60))),
        };
        assert!(
            short
                .participant_keep()
                .unwrap_err()
                .contains("--retention")
        );
        assert_eq!(short.keep(), Some(Duration::from_secs(60)));
    }
}
