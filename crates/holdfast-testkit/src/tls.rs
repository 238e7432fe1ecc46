//! TLS in a harness, when the test asks for it ([`crate::HarnessBuilder::tls`]): a certificate
//! authority made for this harness alone, and a certificate it signs for `localhost` and
//! `127.0.0.1` that the coordinator serves (TLS only), as PEM files in a temporary folder
//! removed with the harness. The harness's own clients trust that CA and nothing else.

use std::path::{Path, PathBuf};

use holdfast::tls::{ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles};
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
    /// What the harness's own calls trust: the CA.
    pub(crate) client: ClientTls,
    _folder: tempfile::TempDir,
}

impl Certificates {
    /// Makes the CA and the coordinator's certificate and loads both sides.
    pub(crate) fn new() -> Result<Certificates, TestkitError> {
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
        let files = ServerTlsFiles {
            cert: write(folder.path(), "coordinator.crt", &server_pem)?,
            key: write(
                folder.path(),
                "coordinator.key",
                &server_key.serialize_pem(),
            )?,
            client_ca: None,
        };
        let loaded = |e: holdfast::tls::TlsError| TestkitError::Tls(e.to_string());
        let server = ServerTls::load(&files).map_err(loaded)?;
        let client = ClientTls::load(&ClientTlsFiles {
            ca: Some(ca_file.clone()),
            ..ClientTlsFiles::default()
        })
        .map_err(loaded)?;
        Ok(Certificates {
            ca_pem,
            ca_file,
            server,
            client,
            _folder: folder,
        })
    }
}

/// Writes `contents` to `name` in `folder` (a private key readable by its owner only: the
/// temporary folder itself is).
fn write(folder: &Path, name: &str, contents: &str) -> Result<PathBuf, TestkitError> {
    let path = folder.join(name);
    std::fs::write(&path, contents).map_err(TestkitError::TempDir)?;
    Ok(path)
}
