//! An unknown-outcome Try that does land, against a real participant: `seats` (the production
//! `participants::serve`) behind a relay that forwards the Try but holds its answer past the
//! coordinator's participant timeout. The hold is in place when the coordinator gives up; its
//! release (Cancel) must reach the participant and free the seat.

use std::time::Duration;

use holdfast::domain::policy::Backoff;
use holdfast::participants::{self, Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::reservation::State;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::common::*;

/// Polls seat `A1` until `want` (available, held, confirmed), for at most 20 s.
async fn seat_reaches(admin: &mut ResourceAdminClient<Channel>, want: (i64, i64, i64), what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = admin
            .get_resource(proto::GetResourceRequest {
                resource: "A1".into(),
            })
            .await
            .expect("GetResource A1")
            .into_inner();
        if (s.available, s.held, s.confirmed) == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: seat A1 stayed {s:?}, expected (available, held, confirmed) {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn a_landed_try_whose_answer_is_lost_is_released_at_a_real_participant(pool: PgPool) {
    let participant_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("participant pool");
    participants::MIGRATOR
        .run(&participant_pool)
        .await
        .expect("participants' migrations");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let seats = tokio::spawn(participants::serve(
        ParticipantSettings::new(Kind::Seats),
        participant_pool.clone(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let mut admin = ResourceAdminClient::connect(url.clone())
        .await
        .expect("admin");
    admin
        .put_resources(put_resources_request(&[("A1", 1)]))
        .await
        .expect("PutResources");

    let network = Relay::start(&url).await;
    let mut s = settings(&[("seats", &network.url)]);
    for p in &mut s.participants {
        p.timeout = Duration::from_secs(2);
    }
    s.policy.sweep_interval = Duration::from_millis(100);
    s.policy.backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_millis(200),
    };
    let app = spawn_app(pool.clone(), s).await;

    network.hold_replies(true);
    let mut client = app.client.clone();
    let pending = tokio::spawn(async move {
        client
            .reserve(reserve_request("r1", vec![hold("seats", "A1")]))
            .await
    });
    // The Try landed: the seat is held while its answer waits in the relay.
    seat_reaches(&mut admin, (0, 1, 0), "the Try lands").await;
    // The coordinator gives up on the answer and releases: its Cancel reaches the seat (the
    // Cancel's own answer is held too, so the reservation waits for recovery).
    seat_reaches(&mut admin, (1, 0, 0), "the Cancel reaches the seat").await;
    let err = pending
        .await
        .expect("join")
        .expect_err("the Try's outcome is unknown to the coordinator");
    assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE", "{err:?}");
    let id = error_metadata(&err)["reservation_id"].clone();

    // The network answers again: recovery's repeat of the Cancel is answered CANCELLED
    // (idempotently) and the reservation ends REJECTED with nothing held.
    network.hold_replies(false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = app
            .client
            .clone()
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.clone(),
            })
            .await
            .expect("get")
            .into_inner();
        if state_of(&r) == State::Rejected {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reservation stayed {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        r.branches[0].state,
        i32::from(proto::branch::State::Cancelled),
        "{r:?}"
    );
    seat_reaches(&mut admin, (1, 0, 0), "nothing stays held").await;
    let seat: (String, Option<String>) =
        sqlx::query_as("SELECT state, branch_id FROM seat WHERE resource = 'A1'")
            .fetch_one(&participant_pool)
            .await
            .expect("seat row");
    assert_eq!(seat, ("available".to_owned(), None));
    let _ = stop.send(());
    seats.await.expect("join").expect("seats stopped cleanly");
}
