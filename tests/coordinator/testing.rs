//! Test mode (SPEC 9, `tcc.v1.Testing`): a real coordinator and a real `seats` participant
//! opened on one `holdfast::testing::TestClock`, on SQLite files and on PostgreSQL. Moving the
//! clock expires holds without sleeping, the reaper releases them within the call, the
//! participant's orphan reclaim and `--max-hold` follow the clock; bad input is refused naming
//! the field and changing nothing; the service exists only in test mode, for admins only; the
//! binary refuses test mode on a non-loopback listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use holdfast::app::{CoordinatorSettings, serve_test_coordinator, serve_test_participant};
use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::proto::testing_client::TestingClient;
use holdfast::testing::{TestClock, open_participant_db, open_store};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;
use tonic_reflection::pb::v1 as refl;

use crate::common::*;

/// Where a stack keeps its data.
pub(crate) enum Backend {
    /// Files in a folder of the test's own (removed at the end).
    Sqlite,
    /// The test's fresh database, by URL.
    Postgres(String),
}

/// The URL of `pool`'s database (a `#[sqlx::test]` database), for openers that take a URL.
pub(crate) fn pg_url(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let database = pool.connect_options().get_database().unwrap().to_owned();
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{database}")
}

/// A coordinator (with `tcc.v1.Testing`) and a `seats` participant on one test clock.
pub(crate) struct Stack {
    clock: TestClock,
    pub(crate) client: CoordinatorClient<Channel>,
    pub(crate) testing: TestingClient<Channel>,
    pub(crate) addr: SocketAddr,
    pub(crate) seats: String,
    /// Between the coordinator and seats (passes everything unless told otherwise).
    network: Relay,
    stop: Vec<oneshot::Sender<()>>,
    dir: Option<PathBuf>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for stop in self.stop.drain(..) {
            let _ = stop.send(());
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn stopper(stop: &mut Vec<oneshot::Sender<()>>) -> impl Future<Output = ()> + Send + 'static {
    let (tx, rx) = oneshot::channel::<()>();
    stop.push(tx);
    async move {
        let _ = rx.await;
    }
}

/// Starts the stack on `backend`; `tune` adjusts the participant's and the coordinator's
/// settings first. Seats `A1` and `A2` exist, one place each.
pub(crate) async fn stack(
    backend: Backend,
    tune: impl FnOnce(&mut ParticipantSettings, &mut CoordinatorSettings),
) -> Stack {
    let clock = TestClock::new();
    let (coordinator_url, participants_url, dir) = match backend {
        Backend::Sqlite => {
            let dir =
                std::env::temp_dir().join(format!("holdfast-test-mode-{}", uuid::Uuid::new_v4()));
            (
                format!("sqlite://{}", dir.join("holdfast.db").display()),
                format!("sqlite://{}", dir.join("participants.db").display()),
                Some(dir),
            )
        }
        Backend::Postgres(url) => (url.clone(), url, None),
    };
    let mut stop = Vec::new();
    let store = open_store(&coordinator_url, 4, &clock).await.unwrap();
    let db = open_participant_db(&participants_url, 4, &clock)
        .await
        .unwrap();
    let seats_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let seats = format!("http://{}", seats_listener.local_addr().unwrap());
    let network = Relay::start(&seats).await;
    let mut participant = ParticipantSettings::new(Kind::Seats);
    let mut coordinator = settings(&[("seats", &network.url)]);
    tune(&mut participant, &mut coordinator);
    let (participant_clock, participant_stop) = (clock.clone(), stopper(&mut stop));
    tokio::spawn(async move {
        serve_test_participant(
            participant,
            db,
            seats_listener,
            &participant_clock,
            participant_stop,
        )
        .await
        .unwrap();
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (coordinator_clock, coordinator_stop) = (clock.clone(), stopper(&mut stop));
    tokio::spawn(async move {
        serve_test_coordinator(
            coordinator,
            store,
            listener,
            coordinator_clock,
            coordinator_stop,
        )
        .await
        .unwrap();
    });
    put_resources(&seats, &[("A1", 1), ("A2", 1)]).await;
    let url = format!("http://{addr}");
    Stack {
        clock,
        client: CoordinatorClient::connect(url.clone()).await.unwrap(),
        testing: TestingClient::connect(url).await.unwrap(),
        addr,
        seats,
        network,
        stop,
        dir,
    }
}

fn advance_by(by: Duration) -> proto::AdvanceClockRequest {
    proto::AdvanceClockRequest {
        by: Some(proto_duration(by)),
    }
}

impl Stack {
    async fn reserve(&mut self, request_id: &str, seat: &str, ttl: Duration) -> proto::Reservation {
        let mut req = reserve_request(request_id, vec![hold("seats", seat)]);
        req.ttl = Some(proto_duration(ttl));
        self.client.reserve(req).await.unwrap().into_inner()
    }

    pub(crate) async fn get(&mut self, id: &str) -> proto::Reservation {
        self.client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    pub(crate) async fn advance(&mut self, by: Duration) -> proto::AdvanceClockResponse {
        self.testing
            .advance_clock(advance_by(by))
            .await
            .unwrap()
            .into_inner()
    }

    /// Seat `seat`'s (held, available) at the participant.
    pub(crate) async fn seat(&self, seat: &str) -> (i64, i64) {
        let r = resource(&self.seats, seat).await;
        (r.held, r.available)
    }
}

/// A 10-minute hold expires after AdvanceClock{11m}, released within the call: the seat is
/// free at once (GetResource, and a new Reserve holds it), and no one slept ten minutes.
async fn a_ten_minute_hold_expires_when_the_clock_moves(backend: Backend) {
    let started = std::time::Instant::now();
    let mut s = stack(backend, |_, _| {}).await;
    let first = s.reserve("first", "A1", Duration::from_secs(600)).await;
    assert_eq!(state_of(&first), State::Held);
    assert_eq!(s.seat("A1").await, (1, 0));
    let refused = s
        .client
        .reserve(reserve_request("second", vec![hold("seats", "A1")]))
        .await
        .unwrap_err();
    assert_eq!(
        reason(&refused),
        "INSUFFICIENT_CAPACITY",
        "the seat is taken"
    );

    // Nine minutes: still held.
    let moved = s.advance(Duration::from_secs(9 * 60)).await;
    assert_eq!(moved.expired, 0);
    assert_eq!(state_of(&s.get(&first.id).await), State::Held);

    // Two more: past the deadline; released before the answer.
    let moved = s.advance(Duration::from_secs(2 * 60)).await;
    assert_eq!(moved.expired, 1, "{moved:?}");
    assert_eq!(
        moved.offset,
        Some(proto_duration(Duration::from_secs(11 * 60)))
    );
    let now = moved.now.expect("now");
    let expires_at = first.expires_at.unwrap();
    assert!(
        now.seconds >= expires_at.seconds,
        "{now:?} vs {expires_at:?}"
    );
    assert_eq!(state_of(&s.get(&first.id).await), State::Expired);
    assert_eq!(s.seat("A1").await, (0, 1), "the seat is free again");
    let again = s.reserve("third", "A1", Duration::from_secs(600)).await;
    assert_eq!(state_of(&again), State::Held);
    // Its deadline is the moved clock's now + ttl.
    let ends = again.expires_at.unwrap().seconds - now.seconds;
    assert!((590..=620).contains(&ends), "{ends}");
    assert!(started.elapsed() < Duration::from_secs(120));
}

#[tokio::test]
async fn a_ten_minute_hold_expires_when_the_clock_moves_on_sqlite() {
    a_ten_minute_hold_expires_when_the_clock_moves(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn a_ten_minute_hold_expires_when_the_clock_moves_on_postgres(pool: PgPool) {
    a_ten_minute_hold_expires_when_the_clock_moves(Backend::Postgres(pg_url(&pool))).await;
}

/// ExpireNow: a HELD reservation answers EXPIRED and its seat is free; a CONFIRMED one is
/// refused (FAILED_PRECONDITION, RESERVATION_CLOSED with its state) and stays; bad and unknown
/// ids are refused naming the field.
async fn expire_now_releases_held_and_refuses_decided(backend: Backend) {
    let mut s = stack(backend, |_, _| {}).await;
    let held = s.reserve("held", "A1", Duration::from_secs(600)).await;
    let expired = s
        .testing
        .expire_now(proto::ExpireNowRequest {
            reservation_id: held.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&expired), State::Expired, "{expired:?}");
    assert!(expired.hold_token.is_empty(), "no token in the answer");
    assert_eq!(s.seat("A1").await, (0, 1));

    let confirmed = s.reserve("confirmed", "A2", Duration::from_secs(600)).await;
    s.client
        .confirm(Decide::on(&confirmed).confirm())
        .await
        .unwrap();
    let refused = s
        .testing
        .expire_now(proto::ExpireNowRequest {
            reservation_id: confirmed.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(reason(&refused), "RESERVATION_CLOSED");
    assert_eq!(error_metadata(&refused)["state"], "CONFIRMED");
    assert_eq!(state_of(&s.get(&confirmed.id).await), State::Confirmed);
    assert_eq!(resource(&s.seats, "A2").await.confirmed, 1);

    for (id, code) in [
        ("", Code::InvalidArgument),
        ("not-a-uuid", Code::InvalidArgument),
        (&*uuid::Uuid::new_v4().to_string(), Code::NotFound),
    ] {
        let e = s
            .testing
            .expire_now(proto::ExpireNowRequest {
                reservation_id: id.to_owned(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{id}: {e:?}");
        if code == Code::InvalidArgument {
            assert!(e.message().contains("reservation_id"), "{e:?}");
        }
    }
}

#[tokio::test]
async fn expire_now_releases_held_and_refuses_decided_on_sqlite() {
    expire_now_releases_held_and_refuses_decided(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn expire_now_releases_held_and_refuses_decided_on_postgres(pool: PgPool) {
    expire_now_releases_held_and_refuses_decided(Backend::Postgres(pg_url(&pool))).await;
}

/// ExpireNow on a reservation still `TRYING` (its Try landed, the answer held up on the way
/// back): the call changes nothing it cannot yet (the placer still holds the reservation) and
/// answers it `TRYING`; once the placement ends the reservation is released without another
/// call - `EXPIRED`, its seat free.
#[sqlx::test(migrations = false)]
async fn expire_now_on_a_trying_reservation_releases_it_once_placed(pool: PgPool) {
    let mut s = stack(Backend::Postgres(pg_url(&pool)), |_, c| {
        c.policy.sweep_interval = Duration::from_millis(100);
    })
    .await;
    s.network.hold_replies(true);
    let mut client = s.client.clone();
    let placing = tokio::spawn(async move {
        let mut req = reserve_request("trying-1", vec![hold("seats", "A1")]);
        req.ttl = Some(proto_duration(Duration::from_secs(600)));
        client.reserve(req).await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while s.seat("A1").await != (1, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Try never landed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let listed = s
        .client
        .list_reservations(proto::ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let [trying] = listed.reservations.as_slice() else {
        panic!("one reservation: {listed:?}");
    };
    assert_eq!(state_of(trying), State::Trying);
    let answered = s
        .testing
        .expire_now(proto::ExpireNowRequest {
            reservation_id: trying.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&answered), State::Trying, "{answered:?}");

    s.network.hold_replies(false);
    let placed = placing.await.unwrap();
    // A reservation past its expires_at reads EXPIRED at once (expiry is lazy, SPEC 2); the
    // seat comes back when the release that follows reaches it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (now, seat) = (s.get(&trying.id).await, s.seat("A1").await);
        if state_of(&now) == State::Expired && seat == (0, 1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never released: {now:?}, seat (held, available) {seat:?}; the Reserve answered {placed:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Eight clients move the clock at once while holds lapse: the moves add up exactly, and each
/// lapsed hold is released once, counted by exactly one answer's `expired`.
async fn concurrent_moves_add_up_and_release_each_hold_once(backend: Backend) {
    // The recovery loop sweeps as often as it can: it races every pass on demand.
    let mut s = stack(backend, |_, coordinator| {
        coordinator.policy.sweep_interval = Duration::from_millis(1);
    })
    .await;
    let seats: Vec<String> = (1..=10).map(|i| format!("S{i}")).collect();
    let capacity: Vec<(&str, i64)> = seats.iter().map(|seat| (seat.as_str(), 1)).collect();
    put_resources(&s.seats, &capacity).await;
    for seat in &seats {
        let mut req = reserve_request(&format!("r-{seat}"), vec![hold("seats", seat)]);
        req.holder = format!("holder-{seat}");
        req.ttl = Some(proto_duration(Duration::from_secs(600)));
        let held = s.client.reserve(req).await.unwrap().into_inner();
        assert_eq!(state_of(&held), State::Held);
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut movers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let mut testing = TestingClient::connect(format!("http://{}", s.addr))
            .await
            .unwrap();
        let start = start.clone();
        movers.spawn(async move {
            start.wait().await;
            testing
                .advance_clock(advance_by(Duration::from_secs(2 * 60)))
                .await
                .unwrap()
                .into_inner()
        });
    }
    let mut expired = 0;
    let mut offsets = Vec::new();
    while let Some(answer) = movers.join_next().await {
        let answer = answer.unwrap();
        expired += answer.expired;
        offsets.push(answer.offset.unwrap().seconds);
    }
    offsets.sort();
    assert_eq!(
        offsets,
        (1..=8).map(|i| i * 120).collect::<Vec<i64>>(),
        "each move saw the ones before it"
    );
    assert_eq!(expired, 10, "each lapsed hold counted once");
    assert_eq!(s.clock.offset().await, Duration::from_secs(16 * 60));
    for seat in &seats {
        assert_eq!(s.seat(seat).await, (0, 1), "{seat} released");
    }
}

#[tokio::test]
async fn concurrent_moves_add_up_and_release_each_hold_once_on_sqlite() {
    concurrent_moves_add_up_and_release_each_hold_once(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn concurrent_moves_add_up_and_release_each_hold_once_on_postgres(pool: PgPool) {
    concurrent_moves_add_up_and_release_each_hold_once(Backend::Postgres(pg_url(&pool))).await;
}

/// A bad `by` is refused naming it, and moves nothing: the hold stays, and the next good move
/// starts from offset zero.
#[tokio::test]
async fn a_bad_advance_is_refused_naming_by_and_changes_nothing() {
    let mut s = stack(Backend::Sqlite, |_, _| {}).await;
    let held = s.reserve("held", "A1", Duration::from_secs(60)).await;
    let d = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
    for by in [
        None,
        d(0, 0),
        d(-3600, 0),
        d(0, -5),
        d(366 * 86_400 + 1, 0),
        d(i64::MAX, 0),
    ] {
        let e = s
            .testing
            .advance_clock(proto::AdvanceClockRequest { by })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{by:?}: {e:?}");
        assert!(e.message().starts_with("by"), "{by:?}: {e:?}");
    }
    assert_eq!(s.clock.offset().await, Duration::ZERO);
    assert_eq!(state_of(&s.get(&held.id).await), State::Held);
    assert_eq!(s.seat("A1").await, (1, 0));
    let moved = s.advance(Duration::from_secs(1)).await;
    assert_eq!(moved.offset, Some(proto_duration(Duration::from_secs(1))));
    assert_eq!(state_of(&s.get(&held.id).await), State::Held);
}

/// A hold whose coordinator never comes back (a Try sent straight to the participant, for a
/// reservation no coordinator knows) is reclaimed by the participant once the clock passes
/// `expires_at + orphan grace` (one hour), within AdvanceClock - not before.
async fn orphan_reclaim_follows_the_clock(backend: Backend) {
    let mut s = stack(backend, |_, _| {}).await;
    let now = s.clock.now().await.unwrap();
    let expires_at = now + chrono::Duration::minutes(1);
    let mut participant = proto::participant_client::ParticipantClient::connect(s.seats.clone())
        .await
        .unwrap();
    let reservation_id = uuid::Uuid::new_v4().to_string();
    let tried = participant
        .r#try(proto::TryRequest {
            reservation_id: reservation_id.clone(),
            branch_id: "b1".into(),
            holder: "walked-away".into(),
            items: vec![hold("seats", "A1")],
            expires_at: Some(prost_types::Timestamp {
                seconds: expires_at.timestamp(),
                nanos: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tried.outcome, proto::try_response::Outcome::Held as i32);
    assert_eq!(s.seat("A1").await, (1, 0));

    // Past expires_at, inside the grace: kept (the coordinator might still come).
    s.advance(Duration::from_secs(30 * 60)).await;
    assert_eq!(s.seat("A1").await, (1, 0));
    // Past expires_at + grace: reclaimed before AdvanceClock answered.
    s.advance(Duration::from_secs(45 * 60)).await;
    assert_eq!(s.seat("A1").await, (0, 1), "the orphan was reclaimed");
    let confirmed = participant
        .confirm(proto::BranchRequest {
            reservation_id,
            branch_id: "b1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(confirmed.state, proto::branch::State::HoldLost as i32);
}

#[tokio::test]
async fn orphan_reclaim_follows_the_clock_on_sqlite() {
    orphan_reclaim_follows_the_clock(Backend::Sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn orphan_reclaim_follows_the_clock_on_postgres(pool: PgPool) {
    orphan_reclaim_follows_the_clock(Backend::Postgres(pg_url(&pool))).await;
}

/// `--max-hold` (30 min here) is judged by the moved clock: after 30 days ahead a 10-minute
/// hold is granted (a host-clock check would find it 30 days too far) and a 45-minute one is
/// still refused, naming `ttl`.
#[tokio::test]
async fn max_hold_keeps_working_after_a_large_advance() {
    let mut s = stack(Backend::Sqlite, |participant, _| {
        participant.max_hold = Duration::from_secs(30 * 60);
    })
    .await;
    let mut too_long = reserve_request("too-long", vec![hold("seats", "A1")]);
    too_long.ttl = Some(proto_duration(Duration::from_secs(45 * 60)));
    let e = s.client.reserve(too_long.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("ttl"), "{e:?}");

    for _ in 0..3 {
        s.advance(Duration::from_secs(10 * 86_400)).await;
    }
    assert_eq!(s.clock.offset().await, Duration::from_secs(30 * 86_400));
    let held = s.reserve("short", "A1", Duration::from_secs(600)).await;
    assert_eq!(state_of(&held), State::Held, "{held:?}");
    too_long.request_id = "too-long-again".into();
    let e = s.client.reserve(too_long).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("ttl"), "{e:?}");
}

/// The services reflection lists on `addr`.
async fn listed_services(addr: SocketAddr) -> Vec<String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = refl::server_reflection_client::ServerReflectionClient::new(channel);
    let request = refl::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(answer)) = answers.next().await else {
        panic!("no ListServices answer")
    };
    let Some(refl::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("unexpected answer")
    };
    list.service.into_iter().map(|s| s.name).collect()
}

/// Without test mode there is no Testing service (UNIMPLEMENTED, not listed); with it, it is
/// listed.
#[sqlx::test(migrations = false)]
async fn testing_is_served_only_in_test_mode(pool: PgPool) {
    let (app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let mut testing = TestingClient::connect(format!("http://{}", app.addr))
        .await
        .unwrap();
    let e = testing
        .advance_clock(advance_by(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    let names = listed_services(app.addr).await;
    assert!(names.iter().any(|n| n == "tcc.v1.Coordinator"), "{names:?}");
    assert!(!names.iter().any(|n| n == "tcc.v1.Testing"), "{names:?}");

    let s = stack(Backend::Sqlite, |_, _| {}).await;
    let names = listed_services(s.addr).await;
    assert!(names.iter().any(|n| n == "tcc.v1.Testing"), "{names:?}");
}

/// With authentication on, only admins move the clock or expire a reservation.
#[tokio::test]
async fn only_admins_may_move_the_clock() {
    use crate::auth::{Principal, PrincipalsFile, keyed};
    use holdfast::auth::Role;
    let client = Principal::new("shop", &[Role::Client]);
    let admin = Principal::new("ops", &[Role::Admin]);
    let file = PrincipalsFile::new(&[&client, &admin]);
    let auth = file.authenticator();
    let mut s = stack(Backend::Sqlite, move |_, coordinator| {
        coordinator.access.auth = auth;
    })
    .await;
    let mut req = reserve_request("held", vec![hold("seats", "A1")]);
    req.ttl = Some(proto_duration(Duration::from_secs(600)));
    let held = s
        .client
        .reserve(keyed(req, &client.key))
        .await
        .unwrap()
        .into_inner();
    let e = s
        .testing
        .advance_clock(keyed(advance_by(Duration::from_secs(3600)), &client.key))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = s
        .testing
        .expire_now(keyed(
            proto::ExpireNowRequest {
                reservation_id: held.id.clone(),
            },
            &client.key,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = s
        .testing
        .advance_clock(advance_by(Duration::from_secs(3600)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(s.clock.offset().await, Duration::ZERO, "nothing moved");
    assert_eq!(s.seat("A1").await, (1, 0));

    let moved = s
        .testing
        .advance_clock(keyed(advance_by(Duration::from_secs(3600)), &admin.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.expired, 1);
    assert_eq!(s.seat("A1").await, (0, 1));
}

/// The binary refuses test mode on a non-loopback `--listen` or `--http-listen`, naming the
/// flag, before serving anything.
#[test]
fn the_binary_refuses_test_mode_off_loopback() {
    let dir = std::env::temp_dir().join(format!("holdfast-test-mode-{}", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", dir.join("holdfast.db").display());
    for (args, flag) in [
        (
            vec![
                "--test-mode",
                "--listen",
                "0.0.0.0:0",
                "--http-listen",
                "off",
            ],
            "--listen 0.0.0.0:0",
        ),
        (
            vec![
                "--test-mode",
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "0.0.0.0:0",
            ],
            "--http-listen 0.0.0.0:0",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--database-url", &url, "--metrics-listen", "off"]);
        let out = crate::process::run_holdfast(&all, &[("HOLDFAST_INSECURE_NO_AUTH", "true")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(stderr.contains("--test-mode"), "{args:?}: {stderr}");
    }
    // Test mode is the all-in-one's: the coordinator role refuses it by name.
    let out = crate::process::run_holdfast(
        &[
            "coordinator",
            "--test-mode",
            "--database-url",
            &url,
            "--metrics-listen",
            "off",
            "--http-listen",
            "off",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--test-mode is for the all-in-one"),
        "{stderr}"
    );
    assert!(!dir.exists(), "nothing was created before the refusal");
}

/// The real binary in test mode (SQLite): the banner says so, and a 10-minute hold at its own
/// `seats` expires on AdvanceClock, released before the answer.
#[tokio::test]
async fn the_binary_in_test_mode_expires_a_hold_on_advance() {
    use crate::process::{Holdfast, admin, counts, participant_addr, serving};
    let dir = std::env::temp_dir().join(format!("holdfast-test-mode-{}", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", dir.join("holdfast.db").display());
    let listen = crate::process::listen_addr(31);
    let log = dir.with_extension("log");
    std::fs::create_dir_all(&dir).unwrap();
    let mut process =
        Holdfast::start_with(&url, listen, log.clone(), &[("HOLDFAST_TEST_MODE", "true")]);
    serving(&mut process, listen).await;
    let output = std::fs::read_to_string(&log).unwrap();
    assert!(output.contains("TEST MODE"), "{output}");

    let mut seats = admin(participant_addr(listen, 50061)).await;
    seats
        .put_resources(put_resources_request(&[("A1", 1)]))
        .await
        .unwrap();
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .unwrap();
    let mut req = reserve_request("binary", vec![hold("seats", "A1")]);
    req.ttl = Some(proto_duration(Duration::from_secs(600)));
    let held = client.reserve(req).await.unwrap().into_inner();
    assert_eq!(state_of(&held), State::Held);
    assert_eq!(counts(&mut seats, "A1").await, (0, 1, 0));
    let mut testing = TestingClient::connect(format!("http://{listen}"))
        .await
        .unwrap();
    let moved = testing
        .advance_clock(advance_by(Duration::from_secs(11 * 60)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.expired, 1, "{moved:?}");
    assert_eq!(counts(&mut seats, "A1").await, (1, 0, 0));
    process.kill();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&log);
}
