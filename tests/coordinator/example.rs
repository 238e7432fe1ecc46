//! `examples/my_participant.rs`, the README's "write a participant" page, actually run: the
//! example binary (built by every `cargo test`) serves its car park on a port of the test's,
//! a coordinator registers it, and a Reserve + Confirm and a Reserve + Cancel through the
//! coordinator move its free spaces exactly as its business SQL says.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::common::{Decide, hold, reserve_request, settings, spawn_app, state_of};

/// The example binary beside this test binary (`target/<profile>/examples/`).
fn example_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    profile_dir.join("examples").join("my_participant")
}

/// The example process; killed when dropped.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn free_spaces(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT free FROM bay WHERE id = 'level-1'")
        .fetch_one(pool)
        .await
        .expect("the example's bay table")
}

#[sqlx::test(migrations = false)]
async fn the_participant_example_holds_confirms_and_releases_through_the_coordinator(pool: PgPool) {
    let binary = example_binary();
    assert!(
        binary.exists(),
        "{} missing: `cargo test` builds the examples (or `cargo build --examples`)",
        binary.display()
    );
    let port = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let database = pool.connect_options().get_database().unwrap().to_owned();
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let base = &server[..server.rfind('/').unwrap()];
    let listen = format!("127.0.0.1:{port}");
    let _example = Example(
        Command::new(&binary)
            .env("DATABASE_URL", format!("{base}/{database}"))
            .env("CAR_PARK_LISTEN", &listen)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("start the example"),
    );
    // Serving once its schema holds the bay (it creates it before it listens).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let bay: Option<i64> = sqlx::query_scalar("SELECT free FROM bay WHERE id = 'level-1'")
            .fetch_optional(&pool)
            .await
            .unwrap_or(None);
        if bay.is_some() && tokio::net::TcpStream::connect(&listen).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the example did not serve on {listen} within 60 s (bay: {bay:?}); `cargo test` rebuilds \
             examples, `cargo test --test coordinator` alone does not: `cargo build --examples`"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(free_spaces(&pool).await, 40);

    let app = spawn_app(
        pool.clone(),
        settings(&[("car-park", &format!("http://{listen}"))]),
    )
    .await;
    let mut c = app.client.clone();
    let two = |request_id: &str| {
        let mut h = hold("car-park", "level-1");
        h.quantity = 2;
        reserve_request(request_id, vec![h])
    };
    let kept = c.reserve(two("park-1")).await.unwrap().into_inner();
    assert_eq!(state_of(&kept), State::Held);
    let released = c.reserve(two("park-2")).await.unwrap().into_inner();
    assert_eq!(free_spaces(&pool).await, 36, "two holds of two spaces each");
    let confirmed = c
        .confirm(Decide::on(&kept).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);
    let cancelled = c
        .cancel(Decide::on(&released).cancel())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&cancelled), State::Cancelled);
    // The cancelled hold's spaces came back; the confirmed ones stay taken.
    assert_eq!(free_spaces(&pool).await, 38);
    let states: Vec<(String, String)> =
        sqlx::query_as("SELECT branch_id, state FROM bay_hold ORDER BY state")
            .fetch_all(&pool)
            .await
            .unwrap();
    let states: Vec<&str> = states.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(states, ["cancelled", "confirmed"]);
}
