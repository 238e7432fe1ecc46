//! Retention in a running coordinator (SPEC 8.3): with `--retention` of a few milliseconds the
//! coordinator's own loop deletes a confirmed reservation (counted in
//! `holdfast_retention_deleted_total{table}`) and keeps a held one; a Reserve repeated with
//! the deleted one's request_id then creates a new reservation, as the README warns.

use std::time::{Duration, Instant};

use holdfast::coordinator::Retention;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

fn deleted_reservations() -> f64 {
    holdfast::telemetry::metrics_handle()
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix("holdfast_retention_deleted_total{table=\"reservations\"}")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[sqlx::test(migrations = false)]
async fn the_coordinator_deletes_finished_reservations_past_retention(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let mut s = settings(&[("seats", &fakes.get("seats").url)]);
    s.policy.retention = Retention {
        keep: Some(Duration::from_millis(5)),
        batch: 10,
        every: Duration::from_millis(20),
        pause: Duration::from_millis(1),
        ..Retention::default()
    };
    let mut app = spawn_app(pool, s).await;
    let before = deleted_reservations();
    let held = app
        .client
        .reserve(reserve_request("kept", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let done = app
        .client
        .reserve(reserve_request("done", vec![hold("seats", "A2")]))
        .await
        .unwrap()
        .into_inner();
    let confirmed = app
        .client
        .confirm(Decide::on(&done).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);

    // The loop runs every 20 ms: wait for the deletion itself, bounded.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = app
            .client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: done.id.clone(),
            })
            .await;
        match got {
            Err(status) if status.code() == Code::NotFound => break,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("still there after 20 s: {other:?}"),
        }
    }
    assert!(deleted_reservations() - before >= 1.0);
    let kept = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: held.id.clone(),
        })
        .await
        .expect("a HELD reservation is never deleted")
        .into_inner();
    assert_eq!(state_of(&kept), State::Held);

    // The same request after deletion: a new reservation, new id (README).
    let again = app
        .client
        .reserve(reserve_request("done", vec![hold("seats", "A2")]))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(again.id, done.id);
    assert_eq!(state_of(&again), State::Held);
    app.shut_down();
}
