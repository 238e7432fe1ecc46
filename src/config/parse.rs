//! Parsers of setting values shared by every role: durations, optional listen addresses, and
//! the masking of passwords in URLs for `--print-config`.

use std::net::SocketAddr;
use std::time::Duration;

/// `url` with every password replaced by `***`: the user part's (`user:pw@`) and the query's
/// `password=` and `sslpassword=` parameters (libpq reads both from the query).
pub(crate) fn mask_password(url: &str) -> String {
    let (before_fragment, fragment) = match url.find('#') {
        Some(at) => url.split_at(at),
        None => (url, ""),
    };
    let (base, query) = match before_fragment.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (before_fragment, None),
    };
    let mut masked = mask_user_password(base);
    if let Some(query) = query {
        masked.push('?');
        masked.push_str(&mask_query_passwords(query));
    }
    masked.push_str(fragment);
    masked
}

/// The URL's `user:password@` part with the password masked.
fn mask_user_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &rest[at..]),
        None => url.to_owned(),
    }
}

/// A query string with the values of `password` and `sslpassword` masked (names matched
/// without regard to case).
fn mask_query_passwords(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _))
                if name.eq_ignore_ascii_case("password")
                    || name.eq_ignore_ascii_case("sslpassword") =>
            {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Parses durations such as `250ms`, `5s`, `10m`, `1h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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

/// `d` as `--print-config` shows it, in the largest unit it is a whole number of, as it would
/// be written (`10m`, `90s`, `250ms`, `0s`): [`parse_duration`] reads it back.
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    match s {
        0 => "0s".to_owned(),
        s if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        s if s.is_multiple_of(60) => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// [`format_duration`] with days (`30d`), for the settings whose parser reads them
/// (`--retention`, `--events-retention`, `--webhook-give-up`).
pub(crate) fn format_period(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(86_400) && d.subsec_nanos() == 0 {
        return format!("{}d", s / 86_400);
    }
    format_duration(d)
}

/// Parses a listen address, or `off`.
pub(crate) fn parse_optional_addr(s: &str) -> Result<Option<SocketAddr>, String> {
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
    fn durations_print_as_they_are_written_and_read_back() {
        for (d, shown) in [
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(7200 + 60), "121m"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_duration(d), shown);
            assert_eq!(parse_duration(shown), Ok(d), "{shown}");
        }
        assert_eq!(format_period(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(format_period(Duration::from_secs(86_400 + 3600)), "25h");
    }

    #[test]
    fn passwords_are_masked_in_the_user_part_and_in_the_query() {
        assert_eq!(
            mask_password("postgres://app:s3cret@db:5432/holdfast"),
            "postgres://app:***@db:5432/holdfast"
        );
        assert_eq!(
            mask_password("postgres://app@db/holdfast?sslmode=require&password=s3cret&x=1"),
            "postgres://app@db/holdfast?sslmode=require&password=***&x=1"
        );
        assert_eq!(
            mask_password("postgres://db/h?PassWord=a%40b&sslpassword=k3y"),
            "postgres://db/h?PassWord=***&sslpassword=***"
        );
        // Both at once, and a `#fragment` kept as it was.
        assert_eq!(
            mask_password("redis://:pw@cache:6379/0?password=pw2#x"),
            "redis://:***@cache:6379/0?password=***#x"
        );
        assert_eq!(mask_password("sqlite://./data"), "sqlite://./data");
    }

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
