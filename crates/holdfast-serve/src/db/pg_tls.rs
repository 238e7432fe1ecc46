//! PostgreSQL connections that verify the server, with libpq's trust rules (SPEC 7.4): with
//! `sslrootcert=FILE` the server is trusted only if that file vouches for it, never the system
//! store; without `sslrootcert` (or with `sslrootcert=system`) the system roots. sqlx always
//! starts from the system store and only adds the named file, so for a verifying mode
//! (`verify-ca`, `verify-full`, and `require` with a root file, which libpq treats as
//! `verify-ca`) holdfast does the TLS itself: sqlx connects in plaintext to a private Unix
//! socket of this process ([`super::pg_tunnel`]), which opens each connection to the server,
//! negotiates TLS with holdfast's verifier and relays the bytes. Modes that verify nothing
//! (`disable`, `allow`, `prefer`, `require` without a root file) stay with sqlx.

use std::path::Path;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::tls::{DatabaseRoots, DatabaseTrust};
use crate::watched::Source;

/// The TLS parameters of a connection string (libpq's names and sqlx's aliases), the URL's
/// query first, else libpq's environment variables.
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsParams {
    root: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl TlsParams {
    fn of(url: &str) -> TlsParams {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut params = TlsParams {
            root: env("PGSSLROOTCERT"),
            cert: env("PGSSLCERT"),
            key: env("PGSSLKEY"),
        };
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let query = query.split_once('#').map_or(query, |(q, _)| q);
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = Some(form_decode(value));
            match key {
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => params.root = value,
                "sslcert" | "ssl-cert" => params.cert = value,
                "sslkey" | "ssl-key" => params.key = value,
                _ => {}
            }
        }
        params
    }
}

/// `application/x-www-form-urlencoded` decoding, as sqlx reads the query (`+` is a space).
fn form_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How holdfast must verify the server `options` (parsed from `url`) connect to, or `None`
/// when sqlx's own TLS (or none) is what the URL asks for.
pub(super) fn verified_tls(
    url: &str,
    options: &PgConnectOptions,
) -> Result<Option<DatabaseTrust>, sqlx::Error> {
    let params = TlsParams::of(url);
    let system = params.root.as_deref() == Some("system");
    if system && !matches!(options.get_ssl_mode(), PgSslMode::VerifyFull) {
        // As libpq: any publicly trusted certificate would do without the host name check.
        return Err(sqlx::Error::Configuration(
            "sslrootcert=system needs sslmode=verify-full".into(),
        ));
    }
    let root_file = params.root.as_deref().filter(|_| !system);
    let (check_host_name, mode) = match options.get_ssl_mode() {
        PgSslMode::VerifyFull => (true, "sslmode=verify-full"),
        PgSslMode::VerifyCa => (false, "sslmode=verify-ca"),
        PgSslMode::Require if root_file.is_some() => (false, "sslmode=require with sslrootcert"),
        _ => return Ok(None),
    };
    if options.get_socket().is_some() {
        // A Unix-socket server: PostgreSQL does not speak TLS there.
        return Err(sqlx::Error::Configuration(
            format!("{mode}: TLS is for TCP hosts, not a Unix socket").into(),
        ));
    }
    let roots = match root_file {
        Some(path) => DatabaseRoots::File(Source::new("sslrootcert", Path::new(path))),
        None => DatabaseRoots::System,
    };
    let identity = match (params.cert, params.key) {
        (Some(cert), Some(key)) => Some([
            Source::new("sslcert", Path::new(&cert)),
            Source::new("sslkey", Path::new(&key)),
        ]),
        (None, None) => None,
        _ => {
            return Err(sqlx::Error::Configuration(
                "sslcert and sslkey go together: give both or neither".into(),
            ));
        }
    };
    let trust = DatabaseTrust {
        roots,
        check_host_name,
        identity,
        mode: mode.to_owned(),
    };
    // Unusable files are refused now, naming the parameter, rather than at each connection.
    trust
        .client_config()
        .map_err(|e| sqlx::Error::Configuration(e.to_string().into()))?;
    Ok(Some(trust))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_read_with_sqlx_aliases_and_decoded() {
        let params = TlsParams::of(
            "postgres://u@h/db?sslmode=verify-ca&ssl-ca=%2Ftmp%2Fa+b.pem&sslcert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(params.root.as_deref(), Some("/tmp/a b.pem"));
        assert_eq!(params.cert.as_deref(), Some("/c.pem"));
        assert_eq!(params.key.as_deref(), Some("/k.pem"));
        assert_eq!(form_decode("100%"), "100%");
        assert_eq!(form_decode("%4"), "%4");
        assert_eq!(form_decode("%zz"), "%zz");
    }
}
