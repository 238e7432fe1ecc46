//! The HTTP listener's setting (SPEC 8.4): where the console, the JSON API, `/metrics`,
//! `/healthz` and `/readyz` are served, or `off`. It takes the gRPC port's TLS certificate and
//! its authentication (`--auth-keys`); without keys a non-loopback address is refused unless
//! `--insecure-no-auth`, as for the gRPC port (`ServerAuthArgs::authenticator` is given both
//! addresses).

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
}

impl HttpArgs {
    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!(
            "http_listen = \"{}\"\n",
            self.http_listen.map_or("off".to_owned(), |a| a.to_string())
        ));
    }
}
