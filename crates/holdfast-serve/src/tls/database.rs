//! TLS towards a database server that must be verified (PostgreSQL's `sslmode=verify-ca` and
//! `verify-full`), following libpq: with a root file (`sslrootcert`) the server is trusted only
//! if its chain ends at a certificate in that file (never the system store); without one (or
//! with `sslrootcert=system`), the system roots. `verify-ca` checks the chain, `verify-full`
//! also that the certificate names the host dialled. Refusals are explained naming the setting
//! that decided them.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::SingleCertAndKey;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, SignatureScheme};

use super::{TlsError, material};
use crate::watched::Source;

/// Where the roots a database server is verified against come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DatabaseRoots {
    /// The certificates of this file alone (its setting, e.g. `sslrootcert`).
    File(Source),
    /// The system's trust store (or `SSL_CERT_FILE`/`SSL_CERT_DIR`).
    System,
}

/// How a client verifies a database server, and what it presents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DatabaseTrust {
    pub roots: DatabaseRoots,
    /// Whether the certificate must also name the host (`verify-full`); otherwise only its
    /// chain is checked (`verify-ca`).
    pub check_host_name: bool,
    /// A client certificate and its key (`sslcert`, `sslkey`).
    pub identity: Option<[Source; 2]>,
    /// The setting that chose the mode, for messages (`sslmode=verify-full`).
    pub mode: String,
}

impl DatabaseTrust {
    /// A client config built from the files as they are now (read on each call, so a renewed
    /// root or client certificate is used by the next connection).
    pub(crate) fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let provider = super::crypto_provider();
        let roots = match &self.roots {
            DatabaseRoots::File(source) => material::roots(source, &source.read()?)?,
            DatabaseRoots::System => material::system_roots("sslrootcert")?,
        };
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| TlsError::Config(format!("{}: {e}", self.describe_roots())))?;
        let verifier: Arc<dyn ServerCertVerifier> = if self.check_host_name {
            verifier
        } else {
            Arc::new(ChainOnly(verifier))
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.identity {
            Some([cert, key]) => {
                let key = material::certified_key((cert, &cert.read()?), (key, &key.read()?))?;
                builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key)))
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// The roots, as the user named them (`sslrootcert=/path`, or the system store).
    pub(crate) fn describe_roots(&self) -> String {
        match &self.roots {
            DatabaseRoots::File(source) => format!("{}={}", source.flag, source.path.display()),
            DatabaseRoots::System => "the system's trusted CAs (no sslrootcert given)".to_owned(),
        }
    }

    /// Why a handshake with `target` failed, naming the setting that refused it.
    pub fn explain(&self, target: &str, error: &std::io::Error) -> String {
        let tls = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Error>());
        let Some(Error::InvalidCertificate(problem)) = tls else {
            return format!(
                "TLS handshake with {target} failed ({}): {error}",
                self.mode
            );
        };
        match problem {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
                "{}: the certificate of {target} is not signed by it ({})",
                self.describe_roots(),
                self.mode
            ),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "{}: the certificate of {target} is not valid for that host name",
                    self.mode
                )
            }
            other => format!(
                "the certificate of {target} is refused ({}, {}): {other:?}",
                self.mode,
                self.describe_roots()
            ),
        }
    }
}

/// `verify-ca`: the chain must end at a trusted root; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        // The chain is checked before the name: a name error means the chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
