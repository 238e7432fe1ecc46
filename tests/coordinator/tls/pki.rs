//! Certificates for the TLS tests: a CA made with rcgen per test, certificates it signs, and a
//! temporary folder of PEM files written the way a renewal writes them.

use std::path::PathBuf;

use holdfast::tls::{ServerTls, ServerTlsFiles};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority made for one test.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub(crate) pem: String,
}

/// A certificate signed by a test CA, and its key.
pub(crate) struct Leaf {
    pub(crate) cert: String,
    pub(crate) key: String,
    pub(crate) der: Vec<u8>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate for `name` (its CN), valid for localhost and 127.0.0.1, usable by servers
    /// and clients alike.
    pub(crate) fn issue(&self, name: &str) -> Leaf {
        self.issue_with(name, KeyPair::generate().unwrap(), |_| {})
    }

    /// [`Ca::issue`] for the key `key_pem`, valid only from `not_before` to `not_after` (Unix
    /// seconds).
    pub(crate) fn issue_valid(
        &self,
        name: &str,
        key_pem: &str,
        not_before: i64,
        not_after: i64,
    ) -> Leaf {
        let at = |secs| rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs);
        self.issue_with(name, KeyPair::from_pem(key_pem).unwrap(), |params| {
            params.not_before = at(not_before.max(0) as u64);
            params.not_after = at(not_after.max(0) as u64);
        })
    }

    fn issue_with(
        &self,
        name: &str,
        key: KeyPair,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Leaf {
        let mut params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            format!("{name}.holdfast.test"),
        ])
        .unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        adjust(&mut params);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// A folder of certificate files for one test, removed when dropped.
pub(crate) struct Files {
    pub(crate) dir: PathBuf,
}

impl Files {
    pub(crate) fn new() -> Files {
        let dir = std::env::temp_dir().join(format!("holdfast-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }

    /// Writes `name` atomically (a rename), as a renewal would.
    pub(crate) fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.join(name);
        let partial = self.dir.join(format!(".{name}.partial"));
        std::fs::write(&partial, contents).unwrap();
        std::fs::rename(&partial, &path).unwrap();
        path
    }

    pub(crate) fn ca(&self, name: &str, ca: &Ca) -> PathBuf {
        self.write(&format!("{name}.pem"), &ca.pem)
    }

    /// Writes `leaf` as `name.pem` and `name.key`.
    pub(crate) fn leaf(&self, name: &str, leaf: &Leaf) -> (PathBuf, PathBuf) {
        (
            self.write(&format!("{name}.pem"), &leaf.cert),
            self.write(&format!("{name}.key"), &leaf.key),
        )
    }

    pub(crate) fn server_files(
        &self,
        name: &str,
        leaf: &Leaf,
        client_ca: Option<&Ca>,
    ) -> ServerTlsFiles {
        let (cert, key) = self.leaf(name, leaf);
        ServerTlsFiles {
            cert,
            key,
            client_ca: client_ca.map(|ca| self.ca(&format!("{name}-client-ca"), ca)),
        }
    }

    pub(crate) fn server_tls(&self, name: &str, leaf: &Leaf, client_ca: Option<&Ca>) -> ServerTls {
        ServerTls::load(&self.server_files(name, leaf, client_ca)).unwrap()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
