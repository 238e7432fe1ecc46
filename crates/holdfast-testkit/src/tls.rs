//! TLS in a harness, when the test asks for it ([`crate::HarnessBuilder::tls`]): a certificate
//! authority made for this harness alone, and a certificate it signs for `localhost` and
//! `127.0.0.1` that the coordinator serves (TLS only), as PEM files in a temporary folder
//! removed with the harness. The harness's own clients trust that CA and nothing else. With
//! [`crate::HarnessBuilder::mutual_tls`] the coordinator also requires a client certificate
//! from that CA: the CA issues one per principal (its name the certificate's common name) and
//! one for the harness itself.

use std::path::{Path, PathBuf};

use holdfast_serve::tls::{ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::TestkitError;

/// The harness's CA and the coordinator's certificate.
pub(crate) struct Certificates {
    pub(crate) ca_pem: String,
    pub(crate) ca_file: PathBuf,
    /// What the coordinator serves (loaded in the test's runtime, cheap to clone into each
    /// start).
    pub(crate) server: ServerTls,
    /// What the harness's own calls trust (the CA) and, with mutual TLS, present.
    pub(crate) client: ClientTls,
    /// With mutual TLS: each principal's client certificate and key files (the harness's own
    /// first).
    identities: Vec<(String, ClientIdentity)>,
    _folder: tempfile::TempDir,
}

/// A client certificate and its key, PEM files.
#[derive(Clone, Debug)]
pub(crate) struct ClientIdentity {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl Certificates {
    /// Makes the CA and the coordinator's certificate and loads both sides; with `clients`,
    /// the coordinator requires a client certificate and each of `clients` gets one (the
    /// first is the harness's own, which its calls present).
    pub(crate) fn new(clients: Option<&[&str]>) -> Result<Certificates, TestkitError> {
        let made = |e: rcgen::Error| TestkitError::Tls(format!("making a certificate: {e}"));
        let ca_key = KeyPair::generate().map_err(made)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(made)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "holdfast-testkit CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_pem = ca.self_signed(&ca_key).map_err(made)?.pem();
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().map_err(made)?;
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .map_err(made)?;
        server
            .distinguished_name
            .push(DnType::CommonName, "holdfast-testkit coordinator");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_pem = server.signed_by(&server_key, &issuer).map_err(made)?.pem();

        let folder = tempfile::Builder::new()
            .prefix("holdfast-testkit-tls-")
            .tempdir()
            .map_err(TestkitError::TempDir)?;
        let ca_file = write(folder.path(), "ca.crt", &ca_pem)?;
        let mut identities = Vec::new();
        for (i, name) in clients.unwrap_or_default().iter().enumerate() {
            let key = KeyPair::generate().map_err(made)?;
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(made)?;
            params.distinguished_name.push(DnType::CommonName, *name);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &issuer).map_err(made)?.pem();
            let identity = ClientIdentity {
                cert: write(folder.path(), &format!("client-{i}.crt"), &cert)?,
                key: write(
                    folder.path(),
                    &format!("client-{i}.key"),
                    &key.serialize_pem(),
                )?,
            };
            identities.push(((*name).to_owned(), identity));
        }
        let files = ServerTlsFiles {
            cert: write(folder.path(), "coordinator.crt", &server_pem)?,
            key: write(
                folder.path(),
                "coordinator.key",
                &server_key.serialize_pem(),
            )?,
            client_ca: clients.map(|_| ca_file.clone()),
        };
        let loaded = |e: holdfast_serve::tls::TlsError| TestkitError::Tls(e.to_string());
        let server = ServerTls::load(&files).map_err(loaded)?;
        let own = identities.first().map(|(_, identity)| identity);
        let client = ClientTls::load(&ClientTlsFiles {
            ca: Some(ca_file.clone()),
            cert: own.map(|i| i.cert.clone()),
            key: own.map(|i| i.key.clone()),
        })
        .map_err(loaded)?;
        Ok(Certificates {
            ca_pem,
            ca_file,
            server,
            client,
            identities,
            _folder: folder,
        })
    }

    /// The client certificate of principal `name`, with mutual TLS.
    pub(crate) fn identity(&self, name: &str) -> Option<&ClientIdentity> {
        self.identities
            .iter()
            .find(|(named, _)| named == name)
            .map(|(_, identity)| identity)
    }
}

/// Writes `contents` to `name` in `folder` (a private key readable by its owner only: the
/// temporary folder itself is).
fn write(folder: &Path, name: &str, contents: &str) -> Result<PathBuf, TestkitError> {
    let path = folder.join(name);
    std::fs::write(&path, contents).map_err(TestkitError::TempDir)?;
    Ok(path)
}
