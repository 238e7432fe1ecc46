//! Which coordinator the CLI talks to, and how: `--coordinator URL`, `--api-key`, the TLS
//! client flags (SPEC 8.2). One channel per command, verified TLS for `https://` URLs.

use std::path::PathBuf;
use std::time::Duration;

use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::CliError;
use crate::auth::Bearer;
use crate::proto::admin_client::AdminClient;
use crate::proto::coordinator_client::CoordinatorClient;
use crate::tls::{ClientTlsFiles, endpoint_url, lazy_client_channel};

/// The default coordinator: the all-in-one's.
pub(crate) const DEFAULT_COORDINATOR: &str = "http://127.0.0.1:50051";

/// A channel whose every call carries the CLI's API key, if any.
pub(crate) type CliChannel = InterceptedService<Channel, Bearer>;

/// The flags every CLI command takes.
#[derive(clap::Args, Clone, Debug)]
pub struct Target {
    /// The coordinator to talk to (https:// for TLS).
    #[arg(long, env = "HOLDFAST_COORDINATOR", default_value = DEFAULT_COORDINATOR)]
    pub coordinator: String,
    /// API key presented as `authorization: Bearer <key>` (SPEC 7.2).
    #[arg(long, env = "HOLDFAST_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// For https:// coordinators: the CA its certificate chains to (else the system roots).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate to present (coordinators that require one), with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key, with --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How long one call may take.
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_duration)]
    pub timeout: Duration,
    /// Print JSON (one object; `watch` prints one per line) instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl Target {
    /// A lazily connecting channel to the coordinator; an error names the flag at fault.
    pub fn channel(&self) -> Result<CliChannel, CliError> {
        self.channel_with(Some(self.timeout))
    }

    /// The same for streams, which last as long as they must.
    pub(crate) fn stream_channel(&self) -> Result<CliChannel, CliError> {
        self.channel_with(None)
    }

    fn channel_with(&self, timeout: Option<Duration>) -> Result<CliChannel, CliError> {
        let bearer = Bearer::optional(self.api_key.as_deref())
            .map_err(|e| CliError::Usage(format!("--api-key: {e}")))?;
        let url = &self.coordinator;
        check_scheme(url)?;
        let mut endpoint = Endpoint::from_shared(endpoint_url(url))
            .map_err(|e| CliError::Usage(format!("--coordinator {url:?}: {e}")))?
            .connect_timeout(self.timeout.min(Duration::from_secs(10)))
            .tcp_nodelay(true);
        if let Some(t) = timeout {
            endpoint = endpoint.timeout(t);
        }
        let files = ClientTlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        };
        let channel = lazy_client_channel(url, endpoint, &files, "coordinators")
            .map_err(|e| CliError::Usage(in_cli_terms(&e)))?;
        Ok(InterceptedService::new(channel, bearer))
    }

    /// A `tcc.v1.Coordinator` client.
    pub fn coordinator(&self) -> Result<CoordinatorClient<CliChannel>, CliError> {
        Ok(CoordinatorClient::new(self.channel()?))
    }

    /// A `tcc.v1.Admin` client.
    pub fn admin(&self) -> Result<AdminClient<CliChannel>, CliError> {
        Ok(AdminClient::new(self.channel()?))
    }
}

/// `--coordinator` must say how to talk to it: without `http://` or `https://` the channel
/// would only fail at the first call, as an opaque transport error.
fn check_scheme(url: &str) -> Result<(), CliError> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "--coordinator {url:?}: give the scheme, http://{url} (or https:// for TLS)"
    )))
}

/// The TLS layer names the coordinator's own flags; say the CLI's.
fn in_cli_terms(message: &str) -> String {
    message
        .replace("--participant-client-cert", "--tls-cert")
        .replace("--participant-client-key", "--tls-key")
        .replace("--participant-ca", "--tls-ca")
}
