//! A CA setting is trusted alone, never together with the system store (SPEC 7.4), even when
//! the system store vouches for the peer: PostgreSQL's `sslrootcert` (as libpq), and
//! `--participant-ca` and `--tls-client-ca`.
//!
//! Its own test binary with one test: it points the system store at the local PostgreSQL
//! server's CA and a CA made here (`SSL_CERT_FILE`, which rustls-native-certs reads), which no
//! other test of the crate may see. Needs the local PostgreSQL with TLS as `.ci/run` sets it
//! up (its CA in `HOLDFAST_TEST_PG_CA`) and `DATABASE_URL`.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use holdfast_serve::db;
use holdfast_serve::tls::{ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};

/// The CA that signed the local PostgreSQL server's certificate ("CA A").
fn server_ca() -> PathBuf {
    let path = std::env::var_os("HOLDFAST_TEST_PG_CA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/holdfast-ci/pg-tls/ca.pem"));
    assert!(
        path.exists(),
        "no PostgreSQL test CA at {} (HOLDFAST_TEST_PG_CA): run .ci/run, which sets up PostgreSQL TLS",
        path.display()
    );
    path
}

/// A CA made for this test: its PEM file in `dir`, and what signs with it.
fn make_ca(dir: &Path, name: &str) -> (PathBuf, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, params.self_signed(&key).unwrap().pem()).unwrap();
    (path, Issuer::new(params, key))
}

/// A certificate for `localhost` signed by `ca`: its PEM files in `dir`.
fn make_leaf(dir: &Path, name: &str, ca: &Issuer<'static, KeyPair>) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

/// `DATABASE_URL` on 127.0.0.1 with `params` as its query.
fn url(params: &str) -> String {
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let base = base.split_once('?').map_or(base.as_str(), |(b, _)| b);
    format!("{base}?{params}")
}

async fn uses_tls(pool: &sqlx::PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[test]
fn every_ca_setting_replaces_the_system_roots() {
    let dir = std::env::temp_dir().join(format!("holdfast-ca-trust-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pg_ca = server_ca();
    let (ca_a, issuer_a) = make_ca(&dir, "ca-a");
    let (ca_b, _) = make_ca(&dir, "ca-b");
    // The system store: PostgreSQL's CA and CA A.
    let system = dir.join("system.pem");
    let bundle = [
        std::fs::read(&pg_ca).unwrap(),
        std::fs::read(&ca_a).unwrap(),
    ]
    .concat();
    std::fs::write(&system, bundle).unwrap();
    // SAFETY: set before any other thread of this test binary (its only test) reads the
    // environment; the runtime is built afterwards.
    unsafe { std::env::set_var("SSL_CERT_FILE", &system) };
    let leaf_a = make_leaf(&dir, "leaf-a", &issuer_a);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            postgres_sslrootcert(&pg_ca, &ca_b).await;
            postgres_host_name(&pg_ca).await;
            participant_ca(&leaf_a, &ca_a, &ca_b).await;
            tls_client_ca(&leaf_a, &ca_a, &ca_b).await;
        });
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sslrootcert=B` refuses the PostgreSQL server that `ca_a` (in the system store) signed;
/// `sslrootcert=A`, none, or `system` (with verify-full) accept it.
async fn postgres_sslrootcert(ca_a: &Path, ca_b: &Path) {
    for mode in ["verify-ca", "verify-full"] {
        // CA B named: refused although the system store (CA A) vouches for the server.
        let named_b = url(&format!("sslmode={mode}&sslrootcert={}", ca_b.display()));
        let err = db::open_postgres(&named_b, 1)
            .await
            .expect_err("connected to a server that sslrootcert does not vouch for")
            .to_string();
        let expected = format!("sslrootcert={}", ca_b.display());
        assert!(err.contains(&expected), "{mode}: {err}");
        assert!(err.contains("not signed by it"), "{mode}: {err}");
        // The same when holdfast first makes sure the database exists.
        let err = db::connect_postgres(&named_b, 1)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&expected), "{mode} (ensure): {err}");

        // CA A named: connects, over TLS.
        let named_a = url(&format!("sslmode={mode}&sslrootcert={}", ca_a.display()));
        let pool = db::connect_postgres(&named_a, 2).await.unwrap();
        assert!(uses_tls(&pool).await, "{mode} with CA A");
        // sqlx reaches the server through a relay whose socket only this user can open.
        let options = db::postgres_options(&named_a).unwrap();
        let relay = options
            .get_socket()
            .expect("a verifying mode goes through the relay");
        let permissions = std::fs::metadata(relay).unwrap().permissions().mode();
        assert_eq!(permissions & 0o777, 0o700, "{}", relay.display());

        // No sslrootcert: the system store (which holds CA A).
        let system = url(&format!("sslmode={mode}"));
        let pool = db::open_postgres(&system, 1).await.unwrap();
        assert!(uses_tls(&pool).await, "{mode} with the system store");
    }
    // `sslrootcert=system`: the system store, with the host name checked (as libpq).
    let system = url("sslmode=verify-full&sslrootcert=system");
    let pool = db::open_postgres(&system, 1).await.unwrap();
    assert!(uses_tls(&pool).await, "sslrootcert=system");
    let weaker = url("sslmode=verify-ca&sslrootcert=system");
    let err = db::open_postgres(&weaker, 1).await.unwrap_err().to_string();
    assert!(
        err.contains("sslrootcert=system needs sslmode=verify-full"),
        "{err}"
    );
    // libpq's `require` with a root file verifies the chain like verify-ca.
    let require_b = url(&format!("sslmode=require&sslrootcert={}", ca_b.display()));
    let err = db::open_postgres(&require_b, 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not signed by it"), "require: {err}");
}

/// `verify-full` checks the host name, `verify-ca` only the chain: through a TCP forwarder on
/// 127.0.0.2, a name the server's certificate (localhost, 127.0.0.1) does not carry.
async fn postgres_host_name(ca: &Path) {
    let listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = url("")
        .split_once('@')
        .unwrap()
        .1
        .split_once('/')
        .unwrap()
        .0
        .to_owned();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let server = server.clone();
            tokio::spawn(async move {
                let mut upstream = TcpStream::connect(server).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    let at = |mode: &str| {
        let url = url(&format!("sslmode={mode}&sslrootcert={}", ca.display()));
        assert!(
            url.contains("@127.0.0.1:5432/"),
            "needs DATABASE_URL on 127.0.0.1:5432"
        );
        url.replacen("@127.0.0.1:5432/", &format!("@127.0.0.2:{port}/"), 1)
    };
    let err = db::open_postgres(&at("verify-full"), 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sslmode=verify-full") && err.contains("not valid for that host name"),
        "{err}"
    );
    let pool = db::open_postgres(&at("verify-ca"), 1).await.unwrap();
    assert!(uses_tls(&pool).await, "verify-ca through another name");
}

/// A TLS server on loopback serving `config`; answers whether each handshake succeeded.
async fn tls_server(
    config: Arc<rustls::ServerConfig>,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tx.send(acceptor.accept(tcp).await.is_ok());
        }
    });
    (addr, rx)
}

async fn handshake(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> std::io::Result<()> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map(drop)
}

/// `--participant-ca B` refuses a participant that CA A (in the system store) signed; without
/// it the system store is used, and `--participant-ca A` accepts it.
async fn participant_ca(leaf_a: &(PathBuf, PathBuf), ca_a: &Path, ca_b: &Path) {
    let served = ServerTls::load(&ServerTlsFiles {
        cert: leaf_a.0.clone(),
        key: leaf_a.1.clone(),
        client_ca: None,
    })
    .unwrap();
    let (addr, _handshakes) = tls_server(served.grpc_config()).await;
    let client = |ca: Option<&Path>| {
        let files = ClientTlsFiles {
            ca: ca.map(Path::to_owned),
            ..ClientTlsFiles::default()
        };
        ClientTls::load(&files).unwrap().config()
    };
    let refused = handshake(addr, client(Some(ca_b))).await;
    assert!(
        refused.is_err(),
        "--participant-ca B trusted CA A's participant"
    );
    handshake(addr, client(None))
        .await
        .expect("the system store holds CA A");
    handshake(addr, client(Some(ca_a)))
        .await
        .expect("--participant-ca A");
}

/// `--tls-client-ca B` refuses a client certificate that CA A (in the system store) signed,
/// and `--tls-client-ca A` accepts it.
async fn tls_client_ca(leaf_a: &(PathBuf, PathBuf), ca_a: &Path, ca_b: &Path) {
    let read = |p: &Path| std::fs::read(p).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&read(ca_a)).unwrap())
        .unwrap();
    let client =
        rustls::ClientConfig::builder_with_provider(holdfast_serve::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(&read(&leaf_a.0)).unwrap()],
                PrivateKeyDer::from_pem_slice(&read(&leaf_a.1)).unwrap(),
            )
            .unwrap();
    let client = Arc::new(client);
    for (client_ca, accepted) in [(ca_b, false), (ca_a, true)] {
        let served = ServerTls::load(&ServerTlsFiles {
            cert: leaf_a.0.clone(),
            key: leaf_a.1.clone(),
            client_ca: Some(client_ca.to_owned()),
        })
        .unwrap();
        let (addr, mut handshakes) = tls_server(served.grpc_config()).await;
        let _ = handshake(addr, client.clone()).await;
        assert_eq!(
            handshakes.recv().await,
            Some(accepted),
            "--tls-client-ca {}",
            client_ca.display()
        );
    }
}
