//! How the client reaches the coordinator: URL, API key, TLS (SPEC 7.1, 7.2), timeouts.

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::proto::coordinator_client::CoordinatorClient;
use crate::{Client, Error, RetryPolicy};

/// Settings of a [`Client`]; [`ClientBuilder::connect`] makes it.
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    url: String,
    api_key: Option<String>,
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
    timeout: Duration,
    connect_timeout: Duration,
    retry: RetryPolicy,
}

#[derive(Clone, Debug)]
enum Pem {
    File(PathBuf),
    Bytes(Vec<u8>),
}

impl Pem {
    fn read(&self, what: &str) -> Result<Vec<u8>, Error> {
        match self {
            Pem::Bytes(b) => Ok(b.clone()),
            Pem::File(p) => {
                std::fs::read(p).map_err(|e| Error::config(format!("{what} {}: {e}", p.display())))
            }
        }
    }
}

impl ClientBuilder {
    pub(crate) fn new(url: String) -> ClientBuilder {
        ClientBuilder {
            url,
            api_key: None,
            ca: None,
            identity: None,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
        }
    }

    /// Presents `key` as `authorization: Bearer <key>` on every call.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// For `https://`: trust servers whose certificate chains to this CA (PEM file) instead
    /// of the system roots.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(Pem::File(path.into()));
        self
    }

    /// [`ClientBuilder::tls_ca_file`] from PEM bytes.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// For `https://` coordinators that require one: the client certificate and its key (PEM
    /// files).
    pub fn tls_client_identity_files(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.identity = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// How long one call may take (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How Reserve is retried while the coordinator is unavailable.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The client. The connection is made on the first call and remade after failures, so
    /// this fails only on bad settings (URL, key, TLS files), never because the coordinator
    /// is down at this moment.
    pub async fn connect(self) -> Result<Client, Error> {
        let credential = Credential::new(self.api_key.as_deref())?;
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| Error::config(format!("coordinator URL {:?}: {e}", self.url)))?
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let https = self
            .url
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
        if https {
            let mut tls = ClientTlsConfig::new();
            tls = match &self.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca.read("TLS CA")?)),
                None => tls.with_native_roots(),
            };
            if let Some((cert, key)) = &self.identity {
                let identity = Identity::from_pem(
                    cert.read("TLS client certificate")?,
                    key.read("TLS client key")?,
                );
                tls = tls.identity(identity);
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Error::config(format!("TLS settings: {e}")))?;
        } else if self.ca.is_some() || self.identity.is_some() {
            return Err(Error::config(format!(
                "TLS settings given for a plaintext URL {:?}: use https://",
                self.url
            )));
        }
        let channel = endpoint.connect_lazy();
        Ok(Client {
            inner: CoordinatorClient::with_interceptor(channel.clone(), credential.clone()),
            events: crate::proto::events_client::EventsClient::with_interceptor(
                channel, credential,
            ),
            retry: self.retry,
        })
    }
}

/// Adds the API key to every call (marked sensitive: never in debug output).
#[derive(Clone, Debug, Default)]
pub(crate) struct Credential(Option<AsciiMetadataValue>);

impl Credential {
    fn new(key: Option<&str>) -> Result<Credential, Error> {
        let Some(key) = key else {
            return Ok(Credential(None));
        };
        let mut value = AsciiMetadataValue::try_from(format!("Bearer {key}"))
            .map_err(|_| Error::config("the API key must be printable ASCII".to_owned()))?;
        value.set_sensitive(true);
        Ok(Credential(Some(value)))
    }
}

impl Interceptor for Credential {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
