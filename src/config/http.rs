//! The HTTP listener's setting (SPEC 8.4): where the console, the JSON API, `/metrics`,
//! `/healthz` and `/readyz` are served, or `off`. It takes the gRPC port's TLS certificate and
//! its authentication (`--auth-keys`); without keys a non-loopback address is refused unless
//! `--insecure-no-auth`, as for the gRPC port (`ServerAuthArgs::authenticator` is given both
//! addresses). Which `Host`s and `Origin`s it answers beyond its own (SPEC 7.4) are
//! `--http-allowed-host` and `--http-allowed-origin`.

use std::net::SocketAddr;

use super::parse_optional_addr;

/// Where the HTTP listener listens.
#[derive(clap::Args, Clone, Debug)]
pub struct HttpArgs {
    /// Address of the web console and JSON API (also /metrics, /healthz, /readyz), or `off`.
    // Spelled `std::option::Option` so clap's derive takes the parser's own `Option` (`off`)
    // rather than making the flag optional.
    #[arg(long, env = "HOLDFAST_HTTP_LISTEN", default_value = "127.0.0.1:8080", value_parser = parse_optional_addr)]
    pub http_listen: std::option::Option<SocketAddr>,

    /// A host name the HTTP listener answers to beyond its own addresses and `localhost`
    /// (repeatable; `*` for any): the name services and browsers reach it by (SPEC 7.4).
    /// Other `Host`s are refused (421), so a page rebinding its name to this address reads
    /// nothing.
    #[arg(
        long = "http-allowed-host",
        env = "HOLDFAST_HTTP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub http_allowed_hosts: Vec<String>,

    /// An origin (`https://shop.example:8443`) whose pages may call the JSON API from a
    /// browser, beyond the console's own (repeatable). Other origins are refused (403).
    #[arg(
        long = "http-allowed-origin",
        env = "HOLDFAST_HTTP_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub http_allowed_origins: Vec<String>,
}

impl HttpArgs {
    /// The callers allowed beyond the listener's own origin, checked.
    pub(crate) fn allowed_callers(&self) -> Result<crate::http::AllowedCallers, String> {
        crate::http::AllowedCallers::parse(&self.http_allowed_hosts, &self.http_allowed_origins)
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!(
            "http_listen = \"{}\"\n",
            self.http_listen.map_or("off".to_owned(), |a| a.to_string())
        ));
        for (key, values) in [
            ("http_allowed_hosts", &self.http_allowed_hosts),
            ("http_allowed_origins", &self.http_allowed_origins),
        ] {
            let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
            out.push_str(&format!("{key} = [{}]\n", quoted.join(", ")));
        }
    }
}
