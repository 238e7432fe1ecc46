//! PostgreSQL TLS trusts the `sslrootcert` file alone, as libpq does (SPEC 7.4), even when the
//! system store vouches for the server.
//!
//! Its own test binary with one test: it points the system store at the local PostgreSQL
//! server's CA (`SSL_CERT_FILE`, which rustls-native-certs reads), which no other test of the
//! crate may see. Needs the local PostgreSQL with TLS as `.ci/run` sets it up (its CA in
//! `HOLDFAST_TEST_PG_CA`) and `DATABASE_URL`.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use holdfast_serve::db;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

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

/// A CA unrelated to the server ("CA B"), written to `dir`.
fn unrelated_ca(dir: &std::path::Path) -> PathBuf {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "not the PostgreSQL server's CA");
    let path = dir.join("unrelated-ca.pem");
    std::fs::write(&path, params.self_signed(&key).unwrap().pem()).unwrap();
    path
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
fn sslrootcert_replaces_the_system_roots() {
    let ca_a = server_ca();
    // SAFETY: set before any other thread of this test binary (its only test) reads the
    // environment; the runtime is built afterwards.
    unsafe { std::env::set_var("SSL_CERT_FILE", &ca_a) };
    let dir = std::env::temp_dir().join(format!("holdfast-pg-trust-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_b = unrelated_ca(&dir);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
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

                // No sslrootcert, or `system`: the system store (which holds CA A).
                for roots in ["", "&sslrootcert=system"] {
                    let system = url(&format!("sslmode={mode}{roots}"));
                    let pool = db::open_postgres(&system, 1).await.unwrap();
                    assert!(uses_tls(&pool).await, "{mode}{roots}");
                }
            }
            // libpq's `require` with a root file verifies the chain like verify-ca.
            let require_b = url(&format!("sslmode=require&sslrootcert={}", ca_b.display()));
            let err = db::open_postgres(&require_b, 1)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("not signed by it"), "require: {err}");
        });
    let _ = std::fs::remove_dir_all(&dir);
}
