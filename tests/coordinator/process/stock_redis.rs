//! The binary as the all-in-one on PostgreSQL with Redis, in test mode: `stock-redis` keeps its
//! keys under `--redis-prefix`, and reads the test clock. After `AdvanceClock` by 25 hours a
//! ten-minute hold on it is within `--max-hold` (24 h) of the moved clock and is held (judged
//! from the host's clock it would be refused), and an orphaned hold is reclaimed by the next
//! advance past its deadline and grace (judged by Redis's own clock it would stay).

use std::time::Duration;

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::participant_client::ParticipantClient;
use holdfast::proto::reservation::State;
use holdfast::proto::testing_client::TestingClient;

use super::{Holdfast, TempDatabase, admin, counts, listen_addr, participant_addr, serving};
use crate::common::{hold, proto_duration, put_resources_request, reserve_request, state_of};

#[tokio::test]
async fn the_all_in_ones_stock_redis_keeps_its_prefix_and_reads_the_test_clock() {
    let database = TempDatabase::create().await;
    let prefix = format!("hf:test:{}:", uuid::Uuid::new_v4().simple());
    let redis_url =
        std::env::var("HOLDFAST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let dir =
        std::env::temp_dir().join(format!("holdfast-redis-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let listen = listen_addr(16);
    let mut process = Holdfast::start_with(
        &database.url,
        listen,
        dir.join("holdfast.log"),
        &[
            ("HOLDFAST_REDIS_URL", &redis_url),
            ("HOLDFAST_REDIS_PREFIX", &prefix),
            ("HOLDFAST_TEST_MODE", "true"),
        ],
    );
    serving(&mut process, listen).await;
    let mut stock = admin(participant_addr(listen, 50066)).await;
    stock
        .put_resources(put_resources_request(&[("mug", 5)]))
        .await
        .expect("put mugs at stock-redis");
    let mut redis = redis::Client::open(redis_url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut redis)
        .await
        .expect("KEYS");
    assert!(!keys.is_empty(), "nothing under {prefix}");

    let mut testing = TestingClient::connect(format!("http://{listen}"))
        .await
        .expect("connect");
    let moved = testing
        .advance_clock(proto::AdvanceClockRequest {
            by: Some(proto_duration(Duration::from_secs(25 * 3600))),
        })
        .await
        .expect("advance the clock")
        .into_inner();
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("connect");
    let mut later = reserve_request("mug-1", vec![hold("stock-redis", "mug")]);
    later.ttl = Some(proto_duration(Duration::from_secs(600)));
    let held = client
        .reserve(later)
        .await
        .expect("a ten-minute hold after the move")
        .into_inner();
    assert_eq!(state_of(&held), State::Held, "{held:?}");
    assert_eq!(counts(&mut stock, "mug").await, (4, 1, 0));

    // An orphan: two mugs held by a Try the coordinator never recorded, due a minute after the
    // moved clock's now. Two more hours on (past it and the default hour of grace), the
    // advance's reclaim gives them back, as the reaper gives back the reservation's one.
    let now = moved.now.expect("the moved clock's reading");
    let orphan = ParticipantClient::connect(format!("http://{}", participant_addr(listen, 50066)))
        .await
        .expect("connect to stock-redis")
        .r#try(proto::TryRequest {
            reservation_id: "walked-away".into(),
            branch_id: "b1".into(),
            holder: "nobody".into(),
            items: vec![proto::Hold {
                quantity: 2,
                ..hold("stock-redis", "mug")
            }],
            expires_at: Some(prost_types::Timestamp {
                seconds: now.seconds + 60,
                nanos: 0,
            }),
        })
        .await
        .expect("a Try straight to stock-redis")
        .into_inner();
    assert_eq!(orphan.outcome, proto::try_response::Outcome::Held as i32);
    assert_eq!(counts(&mut stock, "mug").await, (2, 3, 0));
    testing
        .advance_clock(proto::AdvanceClockRequest {
            by: Some(proto_duration(Duration::from_secs(2 * 3600))),
        })
        .await
        .expect("advance the clock again");
    assert_eq!(counts(&mut stock, "mug").await, (5, 0, 0));
    process.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
