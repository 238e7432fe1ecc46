//! The participant under check and how to reach it: its URL, `--api-key`, the TLS client
//! flags (as the CLI's, `crate::cli::target`), the per-call deadline. One lazily connecting
//! channel per connection the checker wants; verified TLS for `https://` URLs.

use std::path::PathBuf;
use std::time::Duration;

use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::CheckError;
use crate::auth::Bearer;
use crate::tls::{ClientTlsFiles, endpoint_url, lazy_client_channel};

/// A channel whose every call carries the `--api-key`, if any.
pub(crate) type CheckChannel = InterceptedService<Channel, Bearer>;

/// Where the participant is and how to talk to it.
#[derive(clap::Args, Clone, Debug)]
pub struct Target {
    /// The participant's URL (https:// for TLS), e.g. http://127.0.0.1:50061.
    pub url: String,
    /// API key presented as `authorization: Bearer <key>` (SPEC 7.2); it needs the
    /// coordinator role, and admin for ResourceAdmin/PutResources.
    #[arg(long, env = "HOLDFAST_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// For https:// participants: the CA its certificate chains to (else the system roots).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate to present (participants that require one), with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key, with --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How long one call may take before it counts as failed.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    pub timeout: Duration,
}

impl Target {
    /// A new lazily connecting channel (its own HTTP/2 connection); an error names the flag.
    pub fn channel(&self) -> Result<CheckChannel, CheckError> {
        let bearer = Bearer::optional(self.api_key.as_deref())
            .map_err(|e| CheckError::Usage(format!("--api-key: {e}")))?;
        let url = &self.url;
        let endpoint = Endpoint::from_shared(endpoint_url(url))
            .map_err(|e| CheckError::Usage(format!("URL {url:?}: {e}")))?
            .connect_timeout(self.timeout.min(Duration::from_secs(10)))
            .timeout(self.timeout)
            .tcp_nodelay(true);
        let files = ClientTlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        };
        let channel = lazy_client_channel(url, endpoint, &files, "participants")
            .map_err(|e| CheckError::Usage(in_check_terms(&e)))?;
        Ok(InterceptedService::new(channel, bearer))
    }
}

/// The TLS layer names the coordinator's own flags; say the checker's.
fn in_check_terms(message: &str) -> String {
    message
        .replace("--participant-client-cert", "--tls-cert")
        .replace("--participant-client-key", "--tls-key")
        .replace("--participant-ca", "--tls-ca")
}
