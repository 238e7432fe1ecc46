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
    let (files, ca) = (Files::new(), Ca::new("holdfast auth CA"));
    let admin = Principal::new("ops", &[holdfast::auth::Role::Admin]);
    let principals = PrincipalsFile::new(&[&admin]);
    // "shop" is known by its certificate only (Ca::issue puts shop.holdfast.test in the SAN).
    principals.write(
        &[&admin],
        "[[principal]]\nname = \"shop\"\nroles = [\"client\"]\ntls_identity = \"shop.holdfast.test\"\n",
    );
    let noop = spawn_participant(holdfast::participants::Kind::Noop, &pool).await;
    let mut s = settings(&[("noop", &noop)]);
    s.access.auth = principals.authenticator();
    s.participant_transport.allow_plaintext = true;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let tls = files.server_tls("coordinator", &ca.issue("coordinator"), Some(&ca));
    let store = holdfast::store::PgStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    tokio::spawn(holdfast::app::serve_coordinator(
        s,
        store,
        Listener::new(tcp, Some(tls)),
        std::future::pending(),
    ));

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
    let all = intruder
        .list_reservations(keyed(proto::ListReservationsRequest::default(), &admin.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        all.reservations.len(),
        1,
        "only the shop's Reserve was recorded"
    );
}
