//! `google.rpc.RetryInfo` on the answers worth repeating (`UNAVAILABLE`, `RESOURCE_EXHAUSTED`),
//! as a client reads it, and on none other.

use std::sync::atomic::Ordering;

use sqlx::PgPool;
use tonic_types::StatusExt;

use crate::common::{hold, reason, reserve_request, spawn_with_fakes};

#[sqlx::test(migrations = false)]
async fn unavailable_and_exhausted_answers_say_when_to_retry(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    fakes
        .get("seats")
        .behaviour
        .fail_tries
        .store(1, Ordering::SeqCst);
    let e = app
        .client
        .reserve(reserve_request("ri-1", vec![hold("seats", "A1")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "PARTICIPANT_UNAVAILABLE");
    let info = e
        .get_details_retry_info()
        .expect("RetryInfo on UNAVAILABLE");
    assert!(info.retry_delay.is_some_and(|d| !d.is_zero()));

    // The holder's limit (5 live reservations by default).
    for i in 0..5 {
        app.client
            .reserve(reserve_request(
                &format!("ok-{i}"),
                vec![hold("seats", &format!("S{i}"))],
            ))
            .await
            .unwrap();
    }
    let e = app
        .client
        .reserve(reserve_request("one-too-many", vec![hold("seats", "S9")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "HOLD_LIMIT_EXCEEDED");
    assert!(
        e.get_details_retry_info().is_some(),
        "RetryInfo on RESOURCE_EXHAUSTED"
    );

    // Not on an answer a repeat cannot change.
    let e = app
        .client
        .get_reservation(holdfast::proto::GetReservationRequest {
            reservation_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "RESERVATION_NOT_FOUND");
    assert!(e.get_details_retry_info().is_none());
}
