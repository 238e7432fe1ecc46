//! From PEM bytes to rustls configurations: certificate chains, private keys, trust roots, and
//! the server and client configs built from them with the process's one crypto provider.
//! Every error names the setting and file it came from.

use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;
use crate::watched::Source;

/// A problem with a file's content, as a TLS error.
fn invalid(source: &Source, problem: impl std::fmt::Display) -> TlsError {
    source.invalid(problem).into()
}

/// ALPN of gRPC (HTTP/2 over TLS).
pub(crate) const ALPN_H2: &[u8] = b"h2";
/// ALPN of the HTTP/1.1 listeners (metrics).
pub(crate) const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Every certificate in a PEM file (a chain: the end-entity certificate first).
pub(crate) fn certificates(
    source: &Source,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(source, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            source,
            "no certificate in it (expected PEM `BEGIN CERTIFICATE`)",
        ));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn private_key(source: &Source, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        invalid(
            source,
            format!("no usable private key in it (expected PEM `BEGIN PRIVATE KEY`): {e}"),
        )
    })
}

/// A certificate chain and its key, checked to belong together and the end-entity certificate
/// to be valid now (neither expired nor not yet valid).
pub(crate) fn certified_key(
    cert: (&Source, &[u8]),
    key: (&Source, &[u8]),
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = certificates(cert.0, cert.1)?;
    valid_now(cert.0, &chain[0])?;
    let private = private_key(key.0, key.1)?;
    CertifiedKey::from_der(chain, private, &super::crypto_provider())
        .map(Arc::new)
        .map_err(|e| {
            invalid(
                key.0,
                format!(
                    "does not fit the certificate in {} {}: {e}",
                    cert.0.flag,
                    cert.0.path.display()
                ),
            )
        })
}

/// Refuses an end-entity certificate outside its validity period: peers would refuse it, so
/// serving or presenting it would only turn a renewal mistake into an outage.
fn valid_now(source: &Source, leaf: &CertificateDer<'_>) -> Result<(), TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| invalid(source, format!("not a readable X.509 certificate: {e}")))?;
    let validity = parsed.validity();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if now < validity.not_before.timestamp() {
        return Err(invalid(
            source,
            format!(
                "the certificate is not yet valid (not before {})",
                validity.not_before
            ),
        ));
    }
    if now > validity.not_after.timestamp() {
        return Err(invalid(
            source,
            format!(
                "the certificate has expired (not after {})",
                validity.not_after
            ),
        ));
    }
    Ok(())
}

/// The certificates of a CA file as trust roots.
pub(crate) fn roots(source: &Source, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(source, pem)? {
        roots
            .add(cert)
            .map_err(|e| invalid(source, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The system's trust roots (the platform store, or `SSL_CERT_FILE`/`SSL_CERT_DIR` when set).
pub(crate) fn system_roots(flag: &'static str) -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(TlsError::Config(format!(
            "no system CA certificates found to verify servers with{}: give {flag} FILE",
            if errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", errors.join("; "))
            }
        )));
    }
    Ok(roots)
}

/// A server config serving `key` with `alpn`; with `client_roots`, a client certificate
/// chaining to them is required.
pub(crate) fn server_config(
    key: Arc<CertifiedKey>,
    client_roots: Option<(&Source, &RootCertStore)>,
    alpn: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = super::crypto_provider();
    let verifier = match client_roots {
        Some((source, roots)) => {
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots.clone()), provider.clone())
                .build()
                .map_err(|e| invalid(source, format!("cannot verify clients with it: {e}")))?
        }
        None => WebPkiClientVerifier::no_client_auth(),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(key)));
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// How a client decides whether to trust a server.
pub(crate) enum Trust {
    /// Certificates chaining to these roots, valid for the name dialled.
    Roots(RootCertStore),
    /// A verifier of its own (the all-in-one's pin on its own certificate).
    Verifier(Arc<dyn ServerCertVerifier>),
}

/// A gRPC client config: `trust`, and a client certificate when `identity` is given.
pub(crate) fn client_config(
    trust: Trust,
    identity: Option<Arc<CertifiedKey>>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(super::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match trust {
        Trust::Roots(roots) => builder.with_root_certificates(roots),
        Trust::Verifier(verifier) => builder
            .dangerous()
            .with_custom_certificate_verifier(verifier),
    };
    let mut config = match identity {
        Some(key) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}
