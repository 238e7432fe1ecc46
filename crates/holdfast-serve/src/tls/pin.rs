//! The all-in-one's trust in its own participants: on its loopback hops the coordinator accepts
//! exactly the certificate its own process serves at that moment (so the all-in-one needs no
//! CA and no name in the certificate for 127.0.0.1). Handshake signatures are still verified,
//! so only the holder of the served key can answer.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

use super::ServerTls;

/// Accepts a server certificate only if it is byte for byte the one `served` presents now.
#[derive(Debug)]
pub(crate) struct SameAsServed {
    served: ServerTls,
}

impl SameAsServed {
    pub(crate) fn new(served: ServerTls) -> SameAsServed {
        SameAsServed { served }
    }
}

impl ServerCertVerifier for SameAsServed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if end_entity.as_ref() == self.served.certificate().as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &super::crypto_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &super::crypto_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        super::crypto_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
