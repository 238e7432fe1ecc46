//! Certificate files outside their validity period, or with a key that does not match, are
//! refused at start (naming the flag) and on rotation (SPEC 7.4): the previous certificate
//! keeps being served or presented, and the refusal is counted in
//! `holdfast_tls_reload_failures_total`. Server (`--tls-cert`) and client
//! (`--participant-client-cert`) certificates alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::tls::{ClientTls, ClientTlsFiles, Listener, ServerTls};
use holdfast::watched::Changes;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use super::pki::{Ca, Files, Leaf};
use super::{bind, served_certificate};

const DAY: i64 = 24 * 3600;

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// For the key of `leaf`: a certificate that expired yesterday, and one valid only from
/// tomorrow.
fn out_of_date(ca: &Ca, leaf: &Leaf) -> [(&'static str, Leaf); 2] {
    let key = leaf.key.as_str();
    [
        (
            "expired",
            ca.issue_valid("expired", key, now() - 30 * DAY, now() - DAY),
        ),
        (
            "not yet valid",
            ca.issue_valid("early", key, now() + DAY, now() + 30 * DAY),
        ),
    ]
}

/// Rotations that must be refused, each changing one file of `name` (so each is judged once):
/// the certificate for an expired one, then for a not yet valid one (same key), then the key
/// for one that is not the certificate's.
fn bad_rotations(files: &Files, name: &str, ca: &Ca, good: &Leaf) -> Vec<Box<dyn Fn()>> {
    let [(_, expired), (_, early)] = out_of_date(ca, good);
    let other_key = ca.issue("other").key;
    let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
    let dir = files.dir.clone();
    let write = move |file: String, contents: String| -> Box<dyn Fn()> {
        let dir = dir.clone();
        Box::new(move || {
            let partial = dir.join(format!(".{file}.partial"));
            std::fs::write(&partial, &contents).unwrap();
            std::fs::rename(&partial, dir.join(&file)).unwrap();
        })
    };
    vec![
        write(cert.clone(), expired.cert),
        write(cert, early.cert),
        write(key, other_key),
    ]
}

/// The count of `holdfast_tls_reload_failures_total` in this process's metrics.
fn reload_failures() -> u64 {
    let text = holdfast::telemetry::metrics_handle().render();
    text.lines()
        .find_map(|line| line.strip_prefix("holdfast_tls_reload_failures_total "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .map_or(0, |n| n as u64)
}

/// Waits until `changes` has refused `refused` changes in all (the files are re-read every
/// 100 ms in these tests), then checks none was applied and none judged twice.
async fn refused(changes: impl Fn() -> Changes, refused: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while changes().refused < refused {
        assert!(
            Instant::now() < deadline,
            "the change was not refused within 10 s: {:?}",
            changes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        changes(),
        Changes {
            applied: 0,
            refused
        }
    );
}

#[tokio::test]
async fn out_of_date_certificates_are_refused_at_start_naming_the_flag() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    for (what, leaf) in out_of_date(&ca, &ca.issue("any")) {
        let server = files.server_files("server", &leaf, None);
        let err = ServerTls::load(&server).unwrap_err().to_string();
        assert!(err.contains("--tls-cert"), "{what}: {err}");
        assert!(err.contains(what), "{what}: {err}");

        let (cert, key) = files.leaf("client", &leaf);
        let client = ClientTlsFiles {
            ca: Some(files.ca("ca", &ca)),
            cert: Some(cert),
            key: Some(key),
        };
        let err = ClientTls::load(&client).unwrap_err().to_string();
        assert!(err.contains("--participant-client-cert"), "{what}: {err}");
        assert!(err.contains(what), "{what}: {err}");
    }
}

#[tokio::test]
async fn a_served_certificate_is_not_replaced_by_an_out_of_date_or_mismatched_one() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let good = ca.issue("good");
    let paths = files.server_files("server", &good, None);
    let tls = ServerTls::load_checking_every(&paths, Duration::from_millis(100)).unwrap();
    let (tcp, addr) = bind().await;
    tokio::spawn(holdfast::server::serve(
        Listener::new(tcp, Some(tls.clone())),
        &holdfast::auth::Authenticator::Off,
        tonic::service::Routes::default(),
        &[],
        std::future::pending(),
    ));
    assert_eq!(
        served_certificate(addr, &ca, b"h2").await.unwrap(),
        good.der
    );

    for (n, rotate) in bad_rotations(&files, "server", &ca, &good)
        .iter()
        .enumerate()
    {
        let before = reload_failures();
        rotate();
        refused(|| tls.file_changes(), n as u64 + 1).await;
        assert_eq!(
            served_certificate(addr, &ca, b"h2").await.unwrap(),
            good.der,
            "change {n}: the previous certificate is still served"
        );
        assert!(reload_failures() > before, "change {n} was not counted");
    }
}

/// A TLS server requiring a client certificate signed by `ca`; answers with the end-entity
/// certificate the first client presented.
async fn client_certificate_seen(ca: &Ca, client: &ClientTls) -> Vec<u8> {
    let server_leaf = ca.issue("server");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let provider = holdfast::tls::crypto_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from(server_leaf.der.clone())],
            PrivateKeyDer::from_pem_slice(server_leaf.key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let (tcp, addr): (_, SocketAddr) = bind().await;
    let accepted = tokio::spawn(async move {
        let (stream, _) = tcp.accept().await.unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config))
            .accept(stream)
            .await
            .unwrap();
        tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let _client = tokio_rustls::TlsConnector::from(client.config())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    accepted.await.unwrap()
}

#[tokio::test]
async fn a_client_certificate_is_not_replaced_by_an_out_of_date_or_mismatched_one() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let good = ca.issue("coordinator");
    let (cert, key) = files.leaf("client", &good);
    let client_files = ClientTlsFiles {
        ca: Some(files.ca("ca", &ca)),
        cert: Some(cert),
        key: Some(key),
    };
    let client = ClientTls::load_checking_every(&client_files, Duration::from_millis(100)).unwrap();
    assert_eq!(client_certificate_seen(&ca, &client).await, good.der);

    for (n, rotate) in bad_rotations(&files, "client", &ca, &good)
        .iter()
        .enumerate()
    {
        let before = reload_failures();
        rotate();
        refused(|| client.file_changes(), n as u64 + 1).await;
        assert_eq!(
            client_certificate_seen(&ca, &client).await,
            good.der,
            "change {n}: the previous client certificate is still presented"
        );
        assert!(reload_failures() > before, "change {n} was not counted");
    }
}
