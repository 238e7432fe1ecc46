//! The participant SDK's `serve` follows the binary's rule (SPEC 7.4): without an
//! authenticator it listens on loopback only; a non-loopback address is refused before
//! anything is served, unless told `Authenticator::InsecureNoAuth`.

use std::time::Duration;

use holdfast::auth::Authenticator;
use holdfast::server::{self, ServeError};
use tokio::net::TcpListener;

/// `serve` with an empty set of routes on `listener`, as a participant's `main` would call it.
async fn serve(listener: TcpListener, auth: Authenticator) -> Result<(), ServeError> {
    let routes = tonic::service::Routes::default();
    server::serve(listener, &auth, routes, &[], std::future::pending()).await
}

/// A health client of the server on 127.0.0.1:`port`.
async fn health_client(
    port: u16,
) -> tonic_health::pb::health_client::HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("a URL")
        .connect()
        .await
        .expect("it serves");
    tonic_health::pb::health_client::HealthClient::new(channel)
}

#[tokio::test]
async fn serve_without_keys_refuses_a_non_loopback_address() {
    let open = TcpListener::bind("0.0.0.0:0").await.expect("bind 0.0.0.0");
    let port = open.local_addr().expect("its address").port();
    let refused = tokio::time::timeout(Duration::from_secs(10), serve(open, Authenticator::Off))
        .await
        .expect("refused at once, not served");
    let err = refused.expect_err("served on 0.0.0.0 without authentication");
    assert!(
        matches!(err, ServeError::OpenWithoutAuth(_)) && err.to_string().contains("InsecureNoAuth"),
        "{err}"
    );
    // Nothing listens there any more: the socket was closed with the refusal.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err(),
        "the refused port still accepts connections"
    );

    // Told so, it serves anyone: a health check over loopback is answered.
    let open = TcpListener::bind("0.0.0.0:0").await.expect("bind 0.0.0.0");
    let port = open.local_addr().expect("its address").port();
    let served = tokio::spawn(serve(open, Authenticator::InsecureNoAuth));
    let mut health = health_client(port).await;
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health answered");
    assert_eq!(answer.into_inner().status, 1, "SERVING");
    served.abort();

    // On loopback, no authenticator is the zero-config default.
    let local = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let port = local.local_addr().expect("its address").port();
    let served = tokio::spawn(serve(local, Authenticator::Off));
    let mut health = health_client(port).await;
    assert!(
        health
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .is_ok()
    );
    served.abort();
}
