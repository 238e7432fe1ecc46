//! Reading what an HTTP caller sent: JSON bodies (bounded, unknown fields refused, every error
//! naming the field by its path, e.g. `holds[1].quantity`), query strings (unknown parameters
//! refused), and the proto3 JSON forms of durations (`"30s"`, `"1.5s"`) and timestamps
//! (RFC 3339). Only the shape is checked here; the rules are the gRPC service's.

use std::collections::HashMap;

use serde::de::DeserializeOwned;

use super::error::{invalid, too_large};

/// Largest request body accepted: the gRPC API's request size limit (SPEC 3.2).
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// The JSON body of a request as `T`; an empty body is `{}` (every field absent, so the gRPC
/// service names what is missing).
pub async fn json<T: DeserializeOwned>(body: axum::body::Body) -> Result<T, tonic::Status> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            || e.to_string().contains("length limit");
        if over {
            too_large(MAX_BODY)
        } else {
            tonic::Status::invalid_argument(format!("reading the request body: {e}"))
        }
    })?;
    parse(&bytes)
}

/// [`json`] on bytes already read.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, tonic::Status> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // The path names the field, an unknown one included (`holds[0].seat`).
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        let inner = e.into_inner();
        let message = inner.to_string();
        if inner.is_syntax() || inner.is_eof() {
            invalid("", format!("the body is not valid JSON: {message}"))
        } else {
            invalid(&field, message)
        }
    })?;
    de.end()
        .map_err(|e| invalid("", format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// A query string's parameters, refusing any not in `known` and any given twice (except
/// those in `repeatable`, kept in order).
pub fn query(
    raw: Option<&str>,
    known: &[&str],
    repeatable: &[&str],
) -> Result<HashMap<String, Vec<String>>, tonic::Status> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let k = k.into_owned();
        if !known.contains(&k.as_str()) {
            return Err(invalid(
                &k,
                format!("unknown query parameter (known: {})", known.join(", ")),
            ));
        }
        let values = out.entry(k.clone()).or_default();
        if !values.is_empty() && !repeatable.contains(&k.as_str()) {
            return Err(invalid(&k, "given more than once"));
        }
        values.push(v.into_owned());
    }
    Ok(out)
}

/// The single value of a query parameter, if given.
pub fn one<'a>(params: &'a HashMap<String, Vec<String>>, name: &str) -> Option<&'a str> {
    params.get(name).and_then(|v| v.first()).map(String::as_str)
}

/// An int32 query parameter (`page_size`), 0 when absent.
pub(crate) fn int32(
    params: &HashMap<String, Vec<String>>,
    name: &str,
) -> Result<i32, tonic::Status> {
    match one(params, name) {
        None | Some("") => Ok(0),
        Some(v) => v
            .parse()
            .map_err(|_| invalid(name, format!("{v:?} is not a whole number"))),
    }
}

/// A proto3 JSON duration (`"600s"`, `"1.5s"`) named `field`.
pub fn duration(field: &str, text: &str) -> Result<prost_types::Duration, tonic::Status> {
    let bad = || {
        invalid(
            field,
            format!("{text:?} is not a duration in seconds such as \"30s\" or \"1.5s\""),
        )
    };
    let number = text.strip_suffix('s').ok_or_else(bad)?;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let seconds: i64 = whole.parse().map_err(|_| bad())?;
    let nanos: i32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().map_err(|_| bad())?
    };
    Ok(prost_types::Duration { seconds, nanos })
}

/// An RFC 3339 timestamp named `field`.
pub fn timestamp(field: &str, text: &str) -> Result<prost_types::Timestamp, tonic::Status> {
    let t = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        invalid(
            field,
            format!("{text:?} is not an RFC 3339 time such as 2026-12-01T10:00:00Z ({e})"),
        )
    })?;
    Ok(prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        #[serde(default)]
        items: Vec<Inner>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        #[serde(default)]
        quantity: i64,
    }

    fn field_of(body: &str) -> String {
        let status = parse::<Outer>(body.as_bytes()).expect_err(body);
        crate::json::error(&status)["metadata"]["field"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    #[test]
    fn errors_name_the_field_by_its_path() {
        assert_eq!(
            field_of(r#"{"items":[{"quantity":"x"}]}"#),
            "items[0].quantity"
        );
        assert_eq!(
            field_of(r#"{"items":[{"quantity":1,"qty":2}]}"#),
            "items[0].qty"
        );
        assert_eq!(field_of(r#"{"itemz":[]}"#), "itemz");
        assert!(parse::<Outer>(b"").is_ok());
        assert!(parse::<Outer>(b"{} {}").is_err());
        assert!(parse::<Outer>(b"{").is_err());
    }

    #[test]
    fn durations_and_times_in_proto_json_form() {
        assert_eq!(duration("ttl", "30s").map(|d| d.seconds).ok(), Some(30));
        assert_eq!(
            duration("ttl", "1.5s").map(|d| d.nanos).ok(),
            Some(500_000_000)
        );
        for bad in ["30", "s", "-1s", "1.1234567891s", "10m"] {
            assert!(duration("ttl", bad).is_err(), "{bad}");
        }
        assert!(timestamp("t", "2026-12-01T10:00:00Z").is_ok());
        assert!(timestamp("t", "yesterday").is_err());
    }
}
