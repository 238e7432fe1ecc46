//! Extend reaches every participant before it answers (#15 item 1).
//!
//! The reproduction of item 1: a participant with a short orphan grace; Reserve a seat with a
//! short ttl; Extend it; wait past the *original* deadline + grace; another holder's Reserve
//! of the same seat must be refused (the participant kept the hold) and the first
//! reservation's Confirm must confirm. Run against the real seats participant on PostgreSQL
//! and on SQLite (the SDK barrier's SQL differs) and against stock-redis (its Lua gate).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast::participants::stock_redis::{StockRedis, StockRedisSettings};
use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::Code;

use crate::common::*;

/// The participants' orphan grace in these tests: the hold may be reclaimed this long after
/// the deadline it was last told.
const GRACE: Duration = Duration::from_secs(1);
/// The first reservation's ttl: short, so its original deadline passes during the test.
const TTL: Duration = Duration::from_secs(2);
/// How far Extend pushes the deadline: far beyond the test's end.
const EXTEND_BY: Duration = Duration::from_secs(60);

/// The participant the reproduction runs against.
enum Under {
    SeatsPostgres,
    SeatsSqlite,
    StockRedis,
}

/// A running participant of the reproduction, and how to make it reclaim what it may.
struct Target {
    name: &'static str,
    url: String,
    /// stock-redis: its handle (reclaim is its reconciler's pass) and Redis key prefix.
    redis: Option<(StockRedis, StockRedisSettings)>,
}

impl Target {
    async fn start(under: Under, pool: &PgPool) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let never = std::future::pending::<()>();
        let mut settings = ParticipantSettings::new(Kind::Seats);
        settings.orphan_grace = GRACE;
        let target = match under {
            Under::SeatsPostgres => {
                let pool = pool.clone();
                tokio::spawn(async move {
                    holdfast::participants::serve(settings, pool, listener, never)
                        .await
                        .unwrap();
                });
                Target {
                    name: "seats",
                    url,
                    redis: None,
                }
            }
            Under::SeatsSqlite => {
                let path = std::env::temp_dir().join(format!(
                    "holdfast-extend-{}.db",
                    uuid::Uuid::new_v4().simple()
                ));
                let sqlite = holdfast::db::open_sqlite(&format!("sqlite://{}", path.display()), 8)
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    holdfast::participants::serve(settings, sqlite, listener, never)
                        .await
                        .unwrap();
                });
                Target {
                    name: "seats",
                    url,
                    redis: None,
                }
            }
            Under::StockRedis => {
                let redis_url = std::env::var("HOLDFAST_REDIS_URL")
                    .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
                let mut s = StockRedisSettings::new(redis_url);
                s.key_prefix = format!("hf:test:{}:", uuid::Uuid::new_v4());
                s.orphan_grace = GRACE;
                // Reclaim runs when the test says so (`reclaim`), not on a timer.
                s.reconcile_every = Duration::from_secs(3600);
                let handle = StockRedis::connect(&s, pool.clone()).await.unwrap();
                let every = s.reconcile_every;
                let server = handle.clone();
                tokio::spawn(async move { server.run(every, listener, never).await.unwrap() });
                Target {
                    name: "stock-redis",
                    url,
                    redis: Some((handle, s)),
                }
            }
        };
        // The resource: seat A1, or one unit of stock A1.
        let connecting = Instant::now() + Duration::from_secs(30);
        let mut admin = loop {
            match proto::resource_admin_client::ResourceAdminClient::connect(target.url.clone())
                .await
            {
                Ok(admin) => break admin,
                Err(e) => {
                    assert!(
                        Instant::now() < connecting,
                        "{} never accepted a connection: {e}",
                        target.name
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
            }
        };
        let mut put = None;
        for _ in 0..200 {
            match admin
                .put_resources(put_resources_request(&[("A1", 1)]))
                .await
            {
                Ok(answer) => {
                    put = Some(answer);
                    break;
                }
                // stock-redis answers UNAVAILABLE until its data set is built.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        assert!(put.is_some(), "{} never took its resource", target.name);
        target
    }

    /// Lets the participant reclaim every hold past its deadline + grace now: the SDK
    /// participants reclaim lazily in a Try that finds no room, stock-redis in its
    /// reconciler's pass.
    async fn reclaim(&self) {
        if let Some((handle, _)) = &self.redis {
            handle.reconcile().await.unwrap();
        }
    }

    async fn stop(self) {
        if let Some((_, s)) = self.redis {
            holdfast::bench::deploy::delete_redis_keys(&s.redis_url, &s.key_prefix)
                .await
                .unwrap();
        }
    }
}

fn reserve_as(holder: &str, request_id: &str, participant: &str) -> proto::ReserveRequest {
    let mut req = reserve_request(request_id, vec![hold(participant, "A1")]);
    req.holder = holder.to_owned();
    req.ttl = Some(proto_duration(TTL));
    req
}

fn time(ts: &Option<prost_types::Timestamp>) -> chrono::DateTime<chrono::Utc> {
    let ts = ts.as_ref().expect("a timestamp");
    chrono::DateTime::from_timestamp(ts.seconds, ts.nanos as u32).expect("in range")
}

/// The reproduction: an extended hold survives its original deadline + grace.
async fn extended_hold_is_kept(pool: PgPool, under: Under) {
    let target = Target::start(under, &pool).await;
    let app = spawn_app(pool, settings(&[(target.name, &target.url)])).await;
    let mut client = app.client.clone();

    let first = client
        .reserve(reserve_as("alice", "a-1", target.name))
        .await
        .expect("reserve")
        .into_inner();
    assert_eq!(state_of(&first), State::Held);
    let original = time(&first.expires_at);
    let extended = client
        .extend(Decide::on(&first).extend(Some(EXTEND_BY), "x-1"))
        .await
        .expect("extend")
        .into_inner();
    assert_eq!(state_of(&extended), State::Held);
    assert_eq!(
        time(&extended.expires_at),
        original + chrono::Duration::from_std(EXTEND_BY).unwrap()
    );

    // Waiting for a deadline is the point: past the original deadline + grace, with margin.
    let margin = chrono::Duration::milliseconds(1500);
    let wait =
        (original + chrono::Duration::from_std(GRACE).unwrap() + margin) - chrono::Utc::now();
    if let Ok(wait) = wait.to_std() {
        tokio::time::sleep(wait).await;
    }
    target.reclaim().await;

    let err = client
        .reserve(reserve_as("bob", "b-1", target.name))
        .await
        .expect_err("the seat is still alice's");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(reason(&err), "INSUFFICIENT_CAPACITY", "{err:?}");

    let confirmed = client
        .confirm(Decide::on(&first).confirm())
        .await
        .expect("confirm")
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed, "{confirmed:?}");
    target.stop().await;
}

#[sqlx::test(migrations = false)]
async fn extended_hold_outlives_its_first_deadline_on_postgres(pool: PgPool) {
    extended_hold_is_kept(pool, Under::SeatsPostgres).await;
}

#[sqlx::test(migrations = false)]
async fn extended_hold_outlives_its_first_deadline_on_sqlite(pool: PgPool) {
    extended_hold_is_kept(pool, Under::SeatsSqlite).await;
}

#[sqlx::test(migrations = false)]
async fn extended_hold_outlives_its_first_deadline_on_stock_redis(pool: PgPool) {
    extended_hold_is_kept(pool, Under::StockRedis).await;
}

/// Polls `GetReservation` until `done` says so (at most 20 s); the last answer.
pub async fn wait_until(
    client: &mut proto::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
    id: &str,
    done: impl Fn(&proto::Reservation) -> bool,
) -> proto::Reservation {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.to_owned(),
            })
            .await
            .expect("get")
            .into_inner();
        if done(&r) || Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A participant that cannot be told: Extend answers UNAVAILABLE and nothing is recorded; a
/// retry tells every participant again (a repeat there changes nothing) and records the
/// extension once, at the deadline the participants were told.
#[sqlx::test(migrations = false)]
async fn extend_that_cannot_reach_a_participant_records_nothing(pool: PgPool) {
    let (app, fakes) = spawn_with_fakes(pool, &["p1", "p2"]).await;
    let mut client = app.client.clone();
    let r = client
        .reserve(reserve_request(
            "r-1",
            vec![hold("p1", "A"), hold("p2", "B")],
        ))
        .await
        .expect("reserve")
        .into_inner();
    assert_eq!(state_of(&r), State::Held);
    fakes
        .get("p2")
        .behaviour
        .fail_extends
        .store(1, Ordering::SeqCst);

    let by = Duration::from_secs(60);
    let err = client
        .extend(Decide::on(&r).extend(Some(by), "x-1"))
        .await
        .expect_err("p2 cannot be told");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE");
    assert_eq!(error_metadata(&err)["participant"], "p2");
    let unchanged = wait_until(&mut client, &r.id, |_| true).await;
    assert_eq!(unchanged.expires_at, r.expires_at, "not extended");
    assert_eq!(unchanged.extensions_used, 0);

    let extended = client
        .extend(Decide::on(&r).extend(Some(by), "x-1"))
        .await
        .expect("the retry extends")
        .into_inner();
    assert_eq!(extended.extensions_used, 1);
    assert_eq!(
        time(&extended.expires_at),
        time(&r.expires_at) + chrono::Duration::from_std(by).unwrap()
    );
    // Every participant holds to exactly the recorded deadline.
    for name in ["p1", "p2"] {
        let deadlines: Vec<_> = fakes.get(name).deadlines().into_values().collect();
        assert_eq!(deadlines.len(), 1, "{name}");
        assert_eq!(
            time(&Some(deadlines[0])),
            time(&extended.expires_at),
            "{name}"
        );
    }
    // A repeat of the applied extension tells nobody and changes nothing.
    let told = fakes.log.count("p1", "Extend") + fakes.log.count("p2", "Extend");
    assert_eq!(told, 4, "{:?}", fakes.log.summary());
    let repeat = client
        .extend(Decide::on(&r).extend(Some(by), "x-1"))
        .await
        .expect("repeat")
        .into_inner();
    assert_eq!(repeat.expires_at, extended.expires_at);
    assert_eq!(
        fakes.log.count("p1", "Extend") + fakes.log.count("p2", "Extend"),
        told
    );
    // And Extend was told before it was recorded: the Confirm still finds every hold.
    let confirmed = client
        .confirm(Decide::on(&r).confirm())
        .await
        .expect("confirm")
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);
}
