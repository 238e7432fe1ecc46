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
