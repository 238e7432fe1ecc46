//! Parsers of setting values shared by every role: durations, optional listen addresses, and
//! the masking of passwords in URLs for `--print-config`.

use std::net::SocketAddr;
use std::time::Duration;

/// `url` with any password replaced by `***`.
pub fn mask_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.find('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &rest[at..]),
        None => url.to_owned(),
    }
}

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
    let seconds_per = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => {
            return Err(format!(
                "{s:?} has unknown unit {unit:?}: use ms, s, m or h"
            ));
        }
    };
    // A typo such as 99999999999999999h must be refused, not wrapped into a short duration.
    n.checked_mul(seconds_per)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long a duration"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 5s "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    }

    #[test]
    fn bad_durations_are_refused_with_why() {
        assert!(parse_duration("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("-5s").is_err());
        // Multiplying by the unit overflowed (a panic in debug builds, a wrapped short
        // duration in release) before the check.
        let err = parse_duration("99999999999999999h").unwrap_err();
        assert!(err.contains("too long"), "{err}");
        assert!(
            parse_duration("18446744073709551615m")
                .unwrap_err()
                .contains("too long")
        );
    }
}
