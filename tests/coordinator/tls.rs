//! Transport security (SPEC 7.1) over real sockets, with certificates made by rcgen in each
//! test: a TLS coordinator refuses plaintext and untrusted clients (and, with a client CA,
//! clients without a good certificate); Reserve -> Confirm with every hop on TLS, PostgreSQL
//! included; an `https://` participant that speaks plaintext fails the Reserve, never holds;
//! a TLS coordinator refuses `http://` participants at start; certificates rotate without a
//! restart; metrics, PostgreSQL (`sslmode=verify-full`) and Redis (`rediss://`) over TLS.

mod binary;
pub(crate) mod pki;
mod validity;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::app::{self, CoordinatorSettings};
use holdfast::participants::{self, Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use holdfast::store::PgStore;
use holdfast::tls::Listener;
use holdfast::tls::{ClientTls, ClientTlsFiles, ParticipantTransport, ServerTls};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status};

use crate::common::{hold, reason, reserve_request, settings, state_of};

use pki::{Ca, Files, Leaf};

// ---- clients and servers --------------------------------------------------------------------

/// A gRPC channel to `addr` over TLS trusting `ca` (checking the name `localhost`),
/// presenting `identity` when given. tonic's own TLS client, independent of holdfast's.
pub(crate) fn tls_channel(addr: SocketAddr, ca: &Ca, identity: Option<&Leaf>) -> Channel {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

fn plaintext_channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// Whether a health check through `channel` is answered.
async fn health(channel: Channel) -> Result<(), Status> {
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
}

async fn bind() -> (TcpListener, SocketAddr) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    (tcp, addr)
}

/// A loopback port nothing listens on (for a child process to bind).
async fn free_port() -> u16 {
    bind().await.1.port()
}

/// Starts a coordinator against `pool`, serving TLS with `tls`.
async fn spawn_coordinator(
    pool: PgPool,
    settings: CoordinatorSettings,
    tls: ServerTls,
) -> SocketAddr {
    let (tcp, addr) = bind().await;
    let store = PgStore::from_pool(pool);
    store.migrate().await.unwrap();
    tokio::spawn(async move {
        app::serve_coordinator(
            settings,
            store,
            Listener::new(tcp, Some(tls)),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Starts a real reference participant on `pool`, serving TLS with `tls`; its `https://` URL.
async fn spawn_participant(kind: Kind, pool: PgPool, tls: ServerTls) -> String {
    let (tcp, addr) = bind().await;
    tokio::spawn(async move {
        participants::serve(
            ParticipantSettings::new(kind),
            pool,
            Listener::new(tcp, Some(tls)),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    format!("https://{addr}")
}

/// The end-entity certificate a TLS server at `addr` presents (trusting `ca`, ALPN `alpn`).
async fn served_certificate(
    addr: SocketAddr,
    ca: &Ca,
    alpn: &[u8],
) -> Result<Vec<u8>, std::io::Error> {
    let stream = tls_connect(addr, ca, alpn).await?;
    Ok(stream.get_ref().1.peer_certificates().unwrap_or_default()[0].to_vec())
}

pub(crate) async fn tls_connect(
    addr: SocketAddr,
    ca: &Ca,
    alpn: &[u8],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
    tls_connect_as(addr, ca, alpn, None).await
}

/// [`tls_connect`] presenting `identity` as the client certificate when given.
pub(crate) async fn tls_connect_as(
    addr: SocketAddr,
    ca: &Ca,
    alpn: &[u8],
    identity: Option<&Leaf>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(holdfast::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(leaf.der.clone())],
                rustls_pki_types::PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// A participant that holds everything and records the client certificate of each Try.
#[derive(Clone, Default)]
struct PeerRecorder {
    tries: Arc<Mutex<Vec<Option<Vec<u8>>>>>,
}

#[tonic::async_trait]
impl proto::participant_server::Participant for PeerRecorder {
    async fn r#try(
        &self,
        request: Request<proto::TryRequest>,
    ) -> Result<Response<proto::TryResponse>, Status> {
        let peer = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| c.to_vec()));
        self.tries.lock().unwrap().push(peer);
        Ok(Response::new(proto::TryResponse {
            outcome: proto::try_response::Outcome::Held.into(),
            reason: String::new(),
        }))
    }

    async fn confirm(
        &self,
        _: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        Ok(Response::new(proto::BranchResponse {
            state: proto::branch::State::Confirmed.into(),
        }))
    }

    async fn cancel(
        &self,
        _: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        Ok(Response::new(proto::BranchResponse {
            state: proto::branch::State::Cancelled.into(),
        }))
    }

    async fn extend(
        &self,
        _: Request<proto::ExtendBranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        Ok(Response::new(proto::BranchResponse {
            state: proto::branch::State::Held.into(),
        }))
    }
}

// ---- the tests ------------------------------------------------------------------------------

#[sqlx::test(migrations = false)]
async fn a_tls_coordinator_refuses_plaintext_and_clients_that_do_not_trust_it(pool: PgPool) {
    let (files, ca, other_ca) = (
        Files::new(),
        Ca::new("holdfast test CA"),
        Ca::new("another CA"),
    );
    let tls = files.server_tls("coordinator", &ca.issue("coordinator"), None);
    let addr = spawn_coordinator(pool, settings(&[]), tls).await;

    let plaintext = health(plaintext_channel(addr)).await;
    assert!(
        plaintext.is_err(),
        "a plaintext client got through: {plaintext:?}"
    );
    let untrusting = health(tls_channel(addr, &other_ca, None)).await;
    assert!(
        untrusting.is_err(),
        "a client trusting another CA got through: {untrusting:?}"
    );
    health(tls_channel(addr, &ca, None))
        .await
        .expect("a client trusting the CA gets through");
    // The coordinator's own API, too.
    let err = CoordinatorClient::new(tls_channel(addr, &ca, None))
        .get_reservation(proto::GetReservationRequest {
            reservation_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_NOT_FOUND");
}

#[sqlx::test(migrations = false)]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_get_through(pool: PgPool) {
    let (files, ca, other_ca) = (
        Files::new(),
        Ca::new("holdfast test CA"),
        Ca::new("another CA"),
    );
    let tls = files.server_tls("coordinator", &ca.issue("coordinator"), Some(&ca));
    let addr = spawn_coordinator(pool, settings(&[]), tls).await;

    let anonymous = health(tls_channel(addr, &ca, None)).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate got through"
    );
    let stranger = health(tls_channel(addr, &ca, Some(&other_ca.issue("stranger")))).await;
    assert!(
        stranger.is_err(),
        "a certificate from another CA got through"
    );
    health(tls_channel(addr, &ca, Some(&ca.issue("order-service"))))
        .await
        .expect("a client with a certificate from the client CA gets through");
}

#[sqlx::test(migrations = false)]
async fn the_coordinator_presents_its_client_certificate_and_the_participant_sees_it(pool: PgPool) {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    // A participant requiring client certificates, recording what each Try presented.
    let recorder = PeerRecorder::default();
    let (tcp, participant) = bind().await;
    let participant_tls = files.server_tls("participant", &ca.issue("participant"), Some(&ca));
    let routes = tonic::service::Routes::new(proto::participant_server::ParticipantServer::new(
        recorder.clone(),
    ));
    tokio::spawn(holdfast::server::serve(
        Listener::new(tcp, Some(participant_tls)),
        &holdfast::auth::Authenticator::Off,
        routes,
        &["tcc.v1.Participant"],
        std::future::pending(),
    ));

    let identity = ca.issue("coordinator.holdfast.internal");
    let (cert, key) = files.leaf("coordinator-client", &identity);
    let client_tls = ClientTls::load(&ClientTlsFiles {
        ca: Some(files.ca("participant-ca", &ca)),
        cert: Some(cert),
        key: Some(key),
    })
    .unwrap();
    let mut settings = settings(&[("fake", &format!("https://{participant}"))]);
    settings.participant_transport = ParticipantTransport {
        tls: Some(client_tls),
        allow_plaintext: false,
    };
    let coordinator = files.server_tls("coordinator", &ca.issue("coordinator"), None);
    let addr = spawn_coordinator(pool, settings, coordinator).await;

    let reservation = CoordinatorClient::new(tls_channel(addr, &ca, None))
        .reserve(reserve_request("peer-1", vec![hold("fake", "r1")]))
        .await
        .expect("reserve over https")
        .into_inner();
    assert_eq!(state_of(&reservation), State::Held);
    let tries = recorder.tries.lock().unwrap().clone();
    assert_eq!(
        tries,
        vec![Some(identity.der.clone())],
        "the participant saw the coordinator's certificate"
    );
}

/// `url` (DATABASE_URL's server) for the test database behind `pool`, with `params`.
fn database_url(pool: &PgPool, params: &str) -> String {
    let name = pool.connect_options().get_database().unwrap().to_owned();
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let head = server.split('?').next().unwrap_or_default();
    let base = &head[..head.rfind('/').unwrap()];
    format!("{base}/{name}?{params}")
}

/// The CA of the local PostgreSQL server's certificate, set up by `.ci/run`.
fn postgres_ca() -> PathBuf {
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

async fn uses_tls(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn reserve_and_confirm_with_every_hop_on_tls(pool: PgPool) {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    // PostgreSQL verified against its CA, for the coordinator and the participants.
    let db_url = database_url(
        &pool,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            postgres_ca().display()
        ),
    );
    let participants_pool = holdfast::db::open_postgres(&db_url, 8).await.unwrap();
    assert!(uses_tls(&participants_pool).await);
    participants::MIGRATOR
        .run(&participants_pool)
        .await
        .unwrap();
    // Two participants requiring the coordinator's client certificate.
    let seats = spawn_participant(
        Kind::Seats,
        participants_pool.clone(),
        files.server_tls("seats", &ca.issue("seats"), Some(&ca)),
    )
    .await;
    let stock = spawn_participant(
        Kind::Stock,
        participants_pool.clone(),
        files.server_tls("stock", &ca.issue("stock"), Some(&ca)),
    )
    .await;
    let operator = ca.issue("operator");
    for (url, resource, capacity) in [(&seats, "A1", 1), (&stock, "sku-1", 3)] {
        let addr: SocketAddr = url.trim_start_matches("https://").parse().unwrap();
        ResourceAdminClient::new(tls_channel(addr, &ca, Some(&operator)))
            .put_resources(proto::PutResourcesRequest {
                resources: vec![proto::ResourceSpec {
                    resource: resource.into(),
                    capacity,
                }],
            })
            .await
            .unwrap();
    }
    // The coordinator: mTLS towards its clients and towards its participants.
    let (cert, key) = files.leaf(
        "coordinator-client",
        &ca.issue("coordinator.holdfast.internal"),
    );
    let mut settings = settings(&[("seats", &seats), ("stock", &stock)]);
    settings.participant_transport.tls = Some(
        ClientTls::load(&ClientTlsFiles {
            ca: Some(files.ca("participant-ca", &ca)),
            cert: Some(cert),
            key: Some(key),
        })
        .unwrap(),
    );
    let store_pool = holdfast::db::open_postgres(&db_url, 8).await.unwrap();
    let tls = files.server_tls("coordinator", &ca.issue("coordinator"), Some(&ca));
    let addr = spawn_coordinator(store_pool, settings, tls).await;

    let mut client =
        CoordinatorClient::new(tls_channel(addr, &ca, Some(&ca.issue("order-service"))));
    let held = client
        .reserve(reserve_request(
            "tls-1",
            vec![hold("seats", "A1"), hold("stock", "sku-1")],
        ))
        .await
        .expect("reserve with every hop on TLS")
        .into_inner();
    assert_eq!(state_of(&held), State::Held);
    let confirmed = client
        .confirm(proto::ConfirmRequest {
            reservation_id: held.id.clone(),
            hold_token: held.hold_token.clone(),
            payment: None,
        })
        .await
        .expect("confirm with every hop on TLS")
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);
    for (url, resource) in [(&seats, "A1"), (&stock, "sku-1")] {
        let addr: SocketAddr = url.trim_start_matches("https://").parse().unwrap();
        let status = ResourceAdminClient::new(tls_channel(addr, &ca, Some(&operator)))
            .get_resource(proto::GetResourceRequest {
                resource: resource.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((status.confirmed, status.held), (1, 0), "{resource}");
    }
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let (first, second) = (ca.issue("first"), ca.issue("second"));
    let paths = files.server_files("server", &first, None);
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
        first.der
    );

    // Renewal: new files in place, as cert-manager does; new connections get the new one.
    files.leaf("server", &second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while served_certificate(addr, &ca, b"h2").await.unwrap() != second.der {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    health(tls_channel(addr, &ca, None))
        .await
        .expect("gRPC over the renewed certificate");

    // A broken renewal (a key that is not a key) keeps the last good certificate: once the
    // server has seen and refused it, the renewed one is still what it serves.
    files.write("server.key", "not a key");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tls.file_changes().refused == 0 {
        assert!(
            Instant::now() < deadline,
            "the broken renewal was not seen within 10 s: {:?}",
            tls.file_changes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        tls.file_changes().applied,
        1,
        "only the good renewal applied"
    );
    assert_eq!(
        served_certificate(addr, &ca, b"h2").await.unwrap(),
        second.der
    );
}

#[tokio::test]
async fn metrics_are_served_over_tls_with_the_same_certificate() {
    let (files, ca) = (Files::new(), Ca::new("holdfast test CA"));
    let leaf = ca.issue("metrics");
    let tls = files.server_tls("metrics", &leaf, None);
    let (tcp, addr) = bind().await;
    tokio::spawn(holdfast::telemetry::serve_metrics(
        Listener::new(tcp, Some(tls)),
        holdfast::auth::Authenticator::Off,
        std::future::pending(),
    ));

    let mut stream = tls_connect(addr, &ca, b"http/1.1").await.unwrap();
    assert_eq!(
        stream.get_ref().1.peer_certificates().unwrap()[0].as_ref(),
        leaf.der
    );
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");

    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(
        !answer.starts_with(b"HTTP/1.1"),
        "plaintext got an HTTP answer"
    );
}

#[sqlx::test(migrations = false)]
async fn postgres_verify_full_connects_with_the_servers_ca(pool: PgPool) {
    let ca = postgres_ca();
    let verified = holdfast::db::open_postgres(
        &database_url(
            &pool,
            &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
        ),
        1,
    )
    .await
    .expect("verify-full with the server's CA connects");
    assert!(uses_tls(&verified).await);
    let required = holdfast::db::open_postgres(&database_url(&pool, "sslmode=require"), 1)
        .await
        .unwrap();
    assert!(uses_tls(&required).await);
    // A URL that names no sslmode stays plaintext, as before TLS existed.
    let default = holdfast::db::open_postgres(&database_url(&pool, ""), 1)
        .await
        .unwrap();
    assert!(!uses_tls(&default).await);
}

#[sqlx::test(migrations = false)]
async fn postgres_verify_full_refuses_a_server_signed_by_another_ca(pool: PgPool) {
    let (files, other) = (Files::new(), Ca::new("not PostgreSQL's CA"));
    let root = files.ca("other-ca", &other);
    let url = database_url(
        &pool,
        &format!("sslmode=verify-full&sslrootcert={}", root.display()),
    );
    let refused = holdfast::db::open_postgres(&url, 1).await;
    assert!(
        refused.is_err(),
        "verify-full accepted a server its root does not vouch for"
    );
}
