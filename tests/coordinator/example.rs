//! The participant examples a team copies (`crates/holdfast-participant/examples/`: the car
//! park on PostgreSQL and on SQLite), actually run: each example binary (built by every
//! `cargo test`) serves its car park on a port of the test's, a coordinator registers it, and a
//! Reserve + Confirm and a Reserve + Cancel through the coordinator move its free spaces
//! exactly as its business SQL says; then `participant-check` passes it.

use std::process::Stdio;
use std::time::Duration;

use holdfast::participant_check::{CheckArgs, check};
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{Decide, hold, reserve_request, settings, spawn_app, state_of};

/// An example binary beside this test binary (`target/<profile>/examples/`).
fn example_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let binary = profile_dir.join("examples").join(name);
    assert!(
        binary.exists(),
        "{} missing: `cargo test` builds the examples (or `cargo build --examples -p holdfast-participant`)",
        binary.display()
    );
    binary
}

/// Starts example `name` with `env` on a free loopback port and waits for the line it prints
/// once it listens; killed when dropped.
async fn start_example(name: &str, env: &[(&str, String)]) -> (Child, String) {
    let mut command = Command::new(example_binary(name));
    command
        .env("CAR_PARK_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("start the example");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the example printed nothing within 60 s")
        .expect("reading the example's stdout")
        .expect("the example exited before serving");
    let addr = line
        .strip_prefix("car-park serving on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, addr)
}

/// Through a real coordinator: two holds of two spaces, one confirmed and one cancelled;
/// `free` reads the example's counter, `holds` its hold rows' states.
async fn holds_confirms_and_releases<F, H>(coordinator_db: PgPool, addr: &str, free: F, holds: H)
where
    F: AsyncFn() -> i64,
    H: AsyncFn() -> Vec<String>,
{
    assert_eq!(free().await, 40);
    let app = spawn_app(
        coordinator_db,
        settings(&[("car-park", &format!("http://{addr}"))]),
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
    assert_eq!(free().await, 36, "two holds of two spaces each");
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
    assert_eq!(free().await, 38);
    assert_eq!(holds().await, ["cancelled", "confirmed"]);
    // A repeated Cancel changes nothing (the barrier answers it).
    c.cancel(Decide::on(&released).cancel()).await.unwrap();
    assert_eq!(free().await, 38);

    // And the conformance check a team in another language would run passes it too (no
    // ResourceAdmin: the bay and the spaces free now are described by flags).
    let report = check(conformance_args(&format!("http://{addr}")))
        .await
        .expect("the check runs");
    assert!(report.failed().is_empty(), "{}", report.table());
    assert!(report.rows.len() >= 10, "{}", report.table());
}

fn conformance_args(url: &str) -> CheckArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: CheckArgs,
    }
    let argv = [
        "participant-check",
        url,
        "--resource",
        "level-1",
        "--capacity",
        "38",
        "--quantity",
        "2",
    ];
    <Cli as clap::Parser>::try_parse_from(argv)
        .expect("flags")
        .args
}

#[sqlx::test(migrations = false)]
async fn the_postgres_car_park_holds_confirms_and_releases_through_the_coordinator(pool: PgPool) {
    let database = pool.connect_options().get_database().unwrap().to_owned();
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let base = &server[..server.rfind('/').unwrap()];
    let (_example, addr) = start_example(
        "car_park_postgres",
        &[("DATABASE_URL", format!("{base}/{database}"))],
    )
    .await;
    let free = async || -> i64 {
        sqlx::query_scalar("SELECT free FROM bay WHERE id = 'level-1'")
            .fetch_one(&pool)
            .await
            .expect("the example's bay table")
    };
    let holds = async || -> Vec<String> {
        sqlx::query_scalar("SELECT state FROM bay_hold ORDER BY state")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    holds_confirms_and_releases(pool.clone(), &addr, free, holds).await;
}

#[sqlx::test(migrations = false)]
async fn the_sqlite_car_park_holds_confirms_and_releases_through_the_coordinator(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("holdfast-car-park-{}", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", dir.join("car-park.db").display());
    let (_example, addr) = start_example("car_park_sqlite", &[("CAR_PARK_DB", url.clone())]).await;
    let park = holdfast::db::open_sqlite(&url, 1).await.unwrap();
    let free = async || -> i64 {
        sqlx::query_scalar("SELECT free FROM bay WHERE id = 'level-1'")
            .fetch_one(&park)
            .await
            .expect("the example's bay table")
    };
    let holds = async || -> Vec<String> {
        sqlx::query_scalar("SELECT state FROM bay_hold ORDER BY state")
            .fetch_all(&park)
            .await
            .unwrap()
    };
    holds_confirms_and_releases(pool, &addr, free, holds).await;
    park.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
