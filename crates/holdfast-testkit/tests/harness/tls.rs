//! `tls()` serves the coordinator over TLS only, under a CA the harness makes: its own
//! clients and a client given that CA are served; one trusting only the system's roots, and a
//! plaintext one, are not. The clock, restarts and authentication work over it. `mutual_tls()`
//! also requires a client certificate, and a principal's certificate alone proves it.

use std::time::Duration;

use holdfast_testkit::client::{Client, Reason, State};
use holdfast_testkit::{Harness, Kind, Role};

use crate::order;

#[tokio::test]
async fn tls_serves_the_coordinator_under_the_harness_ca_only() {
    let mut harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1), ("A2", 1)])
        .tls()
        .start()
        .await
        .unwrap();
    let url = harness.coordinator_url().to_owned();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca = harness.tls_ca_pem().expect("a CA").to_owned();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");

    let held = harness
        .client()
        .reserve(order("o-1", "seats", "A1"))
        .await
        .unwrap();
    assert_eq!(held.reservation.state, State::Held);

    // A client given the CA file, as a service's configuration would give it.
    let configured = Client::builder(url.clone())
        .tls_ca_file(harness.tls_ca_file().expect("a CA file"))
        .connect()
        .await
        .unwrap();
    let id = held.reservation.id;
    assert_eq!(configured.get(id).await.unwrap().state, State::Held);

    // The system's roots do not know the harness's CA; plaintext is not served.
    let system_roots = Client::connect(url.clone()).await;
    let refused = match system_roots {
        Ok(client) => client.get(id).await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "a client without the CA was served");
    let plaintext = url.replacen("https://", "http://", 1);
    let refused = match Client::connect(plaintext).await {
        Ok(client) => client.get(id).await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "plaintext was served");

    // The harness's own calls go over TLS too, before and after a restart.
    let advanced = harness.advance(Duration::from_secs(601)).await.unwrap();
    assert_eq!(advanced.expired, 1);
    harness.restart().await.unwrap();
    assert_eq!(
        configured.get(id).await.unwrap().state,
        State::Expired,
        "still TLS, same CA, after the restart"
    );
}

#[tokio::test]
async fn tls_and_principals_together() {
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .tls()
        .principal("shop", [Role::Client])
        .start()
        .await
        .unwrap();
    let shop = harness.client_as("shop").await.unwrap();
    let held = shop.reserve(order("o-1", "seats", "A1")).await.unwrap();
    assert_eq!(held.reservation.state, State::Held);
    let expired = harness.expire_now(held.reservation.id).await.unwrap();
    assert_eq!(expired.state, State::Expired);
}

#[tokio::test]
async fn mutual_tls_admits_a_principal_by_its_certificate_alone() {
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .mutual_tls()
        .principal("shop-east", [Role::Client])
        .principal("shop-west", [Role::Client])
        .start()
        .await
        .unwrap();
    let url = harness.coordinator_url().to_owned();
    let ca = harness.tls_ca_file().expect("a CA file");
    let (cert, key) = harness.client_certificate("shop-east").unwrap();
    // No API key: the certificate is the proof, and the reservation is shop-east's.
    let east = Client::builder(url.clone())
        .tls_ca_file(ca)
        .tls_client_identity_files(cert, key)
        .connect()
        .await
        .unwrap();
    let held = east.reserve(order("o-1", "seats", "A1")).await.unwrap();
    let id = held.reservation.id;
    let west = harness.client_as("shop-west").await.unwrap();
    assert_eq!(
        west.get(id).await.unwrap_err().reason(),
        &Reason::ReservationNotFound
    );
    let east_by_harness = harness.client_as("shop-east").await.unwrap();
    assert_eq!(east_by_harness.get(id).await.unwrap().state, State::Held);

    // The CA alone is not enough: the coordinator wants a client certificate.
    let without = Client::builder(url)
        .tls_ca_file(ca)
        .connect()
        .await
        .unwrap();
    assert!(
        without.get(id).await.is_err(),
        "served without a certificate"
    );

    // The harness's own calls present its certificate; it hands out no certificate of its own.
    let advanced = harness.advance(Duration::from_secs(601)).await.unwrap();
    assert_eq!(advanced.expired, 1);
    assert!(harness.client_certificate("holdfast-testkit").is_err());
}
