//! SIGTERM ends the real binary promptly even with a Watch open (#15 item 12): the stream ends
//! with UNAVAILABLE "server shutting down" instead of holding the graceful shutdown until the
//! hold's ttl.

use std::time::Duration;

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;

use super::{Holdfast, TempDatabase, listen_addr, serving};
use crate::common::{reason, state_of};

#[tokio::test]
async fn sigterm_with_an_open_watch_exits_within_the_drain_timeout() {
    let db = TempDatabase::create().await;
    let listen = listen_addr(6);
    let log = std::env::temp_dir().join(format!(
        "holdfast-e2e-sigterm-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let mut process = Holdfast::start(&db.url, listen, log.clone());
    serving(&mut process, listen).await;
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("connect to the coordinator");
    // A hold of ten minutes: a stream following it would run that long.
    let r = client
        .reserve(proto::ReserveRequest {
            request_id: "sigterm-1".into(),
            holder: "alice".into(),
            ttl: Some(prost_types::Duration {
                seconds: 600,
                nanos: 0,
            }),
            holds: vec![proto::Hold {
                participant: "noop".into(),
                resource: "anything".into(),
                quantity: 1,
                during: None,
            }],
            labels: Default::default(),
            queue: None,
        })
        .await
        .expect("reserve through the binary")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    let mut watch = client
        .watch_reservation(proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch
        .message()
        .await
        .expect("first image")
        .expect("a message");
    assert_eq!(state_of(&first), State::Held);

    let took = process.terminate(Duration::from_secs(5)).await;
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let took = took.unwrap_or_else(|| {
        panic!("still running 5 s after SIGTERM with a Watch open; output:\n{log_text}")
    });
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The stream ended: with UNAVAILABLE "server shutting down" when the status got out before
    // the connection closed, or cut with the connection.
    let end = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("the stream ends with the process");
    if let Err(status) = end {
        if status.code() == tonic::Code::Unavailable && status.message().contains("shutting down") {
            assert_eq!(reason(&status), "SHUTTING_DOWN");
        }
    } else {
        assert!(matches!(end, Ok(None)), "{end:?}");
    }
    let _ = std::fs::remove_file(&log);
}
