//! A verified client certificate is a credential (SPEC 7.2): its DNS SAN (or CN) names the
//! principal through `tls_identity`; a certificate the CA signed for nobody in the file proves
//! nothing.

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::tls::Listener;
use sqlx::PgPool;
use tonic::Code;

use super::{Principal, PrincipalsFile, keyed, refusal};
use crate::common::{hold, reserve_request, settings, spawn_participant, state_of};
use crate::tls::pki::{Ca, Files};
use crate::tls::tls_channel;

#[sqlx::test(migrations = false)]
async fn a_client_certificate_is_the_principal_its_identity_names(pool: PgPool) {
    // The files and the principals file stay bound: the coordinator re-reads them.
    let CertShop {
        ca,
        admin,
        grpc: addr,
        _files,
        _principals,
        ..
    } = cert_shop(&pool).await;
    let mut shop = CoordinatorClient::new(tls_channel(addr, &ca, Some(&ca.issue("shop"))));
    let r = shop
        .reserve(reserve_request("o-1", vec![hold("noop", "x")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Held);
    // It is the shop's: listed for the shop, by an admin found under that owner's name only.
    let listed = shop
        .list_reservations(proto::ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.reservations.len(), 1);

    // Signed by the same CA, but nobody's identity: refused, nothing recorded.
    let mut intruder = CoordinatorClient::new(tls_channel(addr, &ca, Some(&ca.issue("intruder"))));
    let refused = intruder
        .reserve(reserve_request("o-2", vec![hold("noop", "y")]))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&refused),
        (Code::Unauthenticated, "UNAUTHENTICATED".to_owned())
    );
    assert!(
        refused.message().contains("intruder.holdfast.test"),
        "{}",
        refused.message()
    );
    // The admin key works over the same mTLS connection (a key wins over the certificate).
    assert_eq!(
        recorded(&mut intruder, &admin.key).await,
        1,
        "only the shop's Reserve was recorded"
    );
}

/// The coordinator is known to its participants by its client certificate (SPEC 7.2: "its
/// client certificate" instead of `--participant-api-key-file`), as the Kubernetes manifests
/// deploy it: a participant whose only `coordinator` principal is a `tls_identity` takes Tries
/// from a coordinator presenting that certificate, and refuses one presenting another
/// certificate the same CA signed - nothing held.
#[sqlx::test(migrations = false)]
async fn participants_know_the_coordinator_by_its_client_certificate(pool: PgPool) {
    use holdfast::participants::{Kind, ParticipantSettings};
    use holdfast::tls::{ClientTls, ClientTlsFiles};

    let (files, ca) = (Files::new(), Ca::new("holdfast participants CA"));
    let admin = Principal::new("ops", &[holdfast::auth::Role::Admin]);
    let principals = PrincipalsFile::new(&[&admin]);
    principals.write(
        &[&admin],
        "[[principal]]\nname = \"coordinator\"\nroles = [\"coordinator\"]\ntls_identity = \"coordinator.holdfast.test\"\n",
    );
    // seats: TLS only, client certificates from the CA required, and authentication on.
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let seats = format!("https://{}", tcp.local_addr().unwrap());
    let seats_settings = ParticipantSettings {
        auth: principals.authenticator(),
        ..ParticipantSettings::new(Kind::Seats)
    };
    let tls = files.server_tls("seats", &ca.issue("seats"), Some(&ca));
    let participant_pool = pool.clone();
    tokio::spawn(async move {
        holdfast::participants::serve(
            seats_settings,
            participant_pool,
            Listener::new(tcp, Some(tls)),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    // Provisioned by ops, over mTLS with a key.
    let seats_addr: std::net::SocketAddr = seats.trim_start_matches("https://").parse().unwrap();
    holdfast::proto::resource_admin_client::ResourceAdminClient::new(tls_channel(
        seats_addr,
        &ca,
        Some(&ca.issue("ops")),
    ))
    .put_resources(keyed(
        crate::common::put_resources_request(&[("A1", 1), ("A2", 1)]),
        &admin.key,
    ))
    .await
    .unwrap();

    // A coordinator (authentication off towards its own loopback clients) calling seats with
    // the client certificate `name`, and no API key.
    let coordinator = |name: &str| {
        let (cert, key) = files.leaf(&format!("{name}-client"), &ca.issue(name));
        let mut s = settings(&[("seats", &seats)]);
        s.participant_transport.tls = Some(
            ClientTls::load(&ClientTlsFiles {
                ca: Some(files.ca(&format!("{name}-trust"), &ca)),
                cert: Some(cert),
                key: Some(key),
            })
            .unwrap(),
        );
        crate::common::spawn_app(pool.clone(), s)
    };
    let trusted = coordinator("coordinator").await;
    let r = trusted
        .client
        .clone()
        .reserve(reserve_request("o-1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Held);

    let impostor = coordinator("impostor").await;
    let refused = impostor
        .client
        .clone()
        .reserve(reserve_request("o-2", vec![hold("seats", "A2")]))
        .await
        .unwrap_err();
    assert_ne!(refused.code(), Code::Ok);
    let a2 = holdfast::proto::resource_admin_client::ResourceAdminClient::new(tls_channel(
        seats_addr,
        &ca,
        Some(&ca.issue("ops")),
    ))
    .get_resource(keyed(
        holdfast::proto::GetResourceRequest {
            resource: "A2".into(),
        },
        &admin.key,
    ))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(
        (a2.held, a2.confirmed),
        (0, 0),
        "the impostor's Try held nothing"
    );
}

/// Over HTTPS with a client CA, the JSON API takes a verified client certificate as the gRPC
/// port does (it calls the same auth layer in-process): a caller known by its certificate
/// alone reserves and lists its own; a certificate that is nobody's identity is 401.
#[sqlx::test(migrations = false)]
async fn the_json_api_takes_a_client_certificate_as_the_grpc_port_does(pool: PgPool) {
    let CertShop {
        ca,
        admin,
        grpc: grpc_addr,
        http: http_addr,
        _files,
        _principals,
    } = cert_shop(&pool).await;
    let shop = ca.issue("shop");
    let reserve = r#"{"request_id":"o-h1","holder":"h","holds":[{"participant":"noop","resource":"x","quantity":1}]}"#;
    let held = https_call(http_addr, &ca, &shop, "POST", "/v1/reservations", reserve).await;
    assert!(held.starts_with("HTTP/1.1 200"), "{held}");
    assert!(held.contains(r#""state":"HELD""#), "{held}");
    let listed = https_call(http_addr, &ca, &shop, "GET", "/v1/reservations", "").await;
    assert!(listed.starts_with("HTTP/1.1 200"), "{listed}");
    // Recorded as the shop's: its certificate over gRPC lists the same one.
    let mut grpc_shop = CoordinatorClient::new(tls_channel(grpc_addr, &ca, Some(&shop)));
    let mine = grpc_shop
        .list_reservations(proto::ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.reservations.len(), 1);
    assert!(listed.contains(&mine.reservations[0].id), "{listed}");

    // Signed by the CA, but nobody's identity: refused as over gRPC, nothing recorded.
    let intruder = ca.issue("intruder");
    let refused = https_call(
        http_addr,
        &ca,
        &intruder,
        "POST",
        "/v1/reservations",
        reserve,
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(refused.contains("UNAUTHENTICATED"), "{refused}");
    assert_eq!(
        recorded(&mut grpc_shop, &admin.key).await,
        1,
        "only the shop's Reserve was recorded"
    );
}

/// How many reservations the coordinator behind `client` has recorded, as an admin (`key`)
/// lists them.
async fn recorded(
    client: &mut CoordinatorClient<tonic::transport::Channel>,
    admin_key: &str,
) -> usize {
    client
        .list_reservations(keyed(proto::ListReservationsRequest::default(), admin_key))
        .await
        .unwrap()
        .into_inner()
        .reservations
        .len()
}

/// A coordinator serving mTLS (client CA `ca`) on its gRPC port and its JSON API, a noop
/// participant behind it, and two principals: `ops` (admin, by key) and `shop` (client, known
/// by its certificate only: `Ca::issue` puts `shop.holdfast.test` in the SAN).
struct CertShop {
    ca: Ca,
    admin: Principal,
    grpc: std::net::SocketAddr,
    http: std::net::SocketAddr,
    _files: Files,
    _principals: PrincipalsFile,
}

async fn cert_shop(pool: &PgPool) -> CertShop {
    let (files, ca) = (Files::new(), Ca::new("holdfast auth CA"));
    let admin = Principal::new("ops", &[holdfast::auth::Role::Admin]);
    let principals = PrincipalsFile::new(&[&admin]);
    principals.write(
        &[&admin],
        "[[principal]]\nname = \"shop\"\nroles = [\"client\"]\ntls_identity = \"shop.holdfast.test\"\n",
    );
    let noop = spawn_participant(holdfast::participants::Kind::Noop, pool).await;
    let mut s = settings(&[("noop", &noop)]);
    s.access.auth = principals.authenticator();
    s.participant_transport.allow_plaintext = true;
    let (grpc, http) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
    let tls = files.server_tls("coordinator", &ca.issue("coordinator"), Some(&ca));
    let store = holdfast::store::PgStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    tokio::spawn(holdfast::app::serve_coordinator_with_http(
        s,
        store,
        Listener::new(grpc, Some(tls.clone())),
        Some(Listener::new(http, Some(tls)).into()),
        std::future::pending(),
    ));
    CertShop {
        ca,
        admin,
        grpc: grpc_addr,
        http: http_addr,
        _files: files,
        _principals: principals,
    }
}

/// One HTTP/1.1 request over TLS to `addr` (trusting `ca`, presenting `identity`), with `body`
/// as JSON when not empty; the whole answer as text, read until the server closes.
async fn https_call(
    addr: std::net::SocketAddr,
    ca: &Ca,
    identity: &crate::tls::pki::Leaf,
    method: &str,
    path: &str,
    body: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = crate::tls::tls_connect_as(addr, ca, b"http/1.1", Some(identity))
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("an answer within 30 s");
    // A server that closes without TLS close_notify ends the answer all the same.
    if let Err(e) = read {
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    }
    String::from_utf8_lossy(&answer).into_owned()
}
