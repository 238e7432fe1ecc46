//! `holdfast participant-check`: the black-box conformance run passes every reference
//! participant (both databases; stock-redis on the local Redis) and a correct participant
//! written without the SDK, repeats against the same participant, and reports each rule a
//! deliberately broken participant breaks as the case(s) that show it - in process and
//! through the real binary (table, `--json`, exit codes).

mod broken;

use std::process::Output;

use broken::{Broken, InTest};
use clap::Parser;
use holdfast::participant_check::{CASES, CheckArgs, Report, Verdict, check};
use holdfast::participants::Kind;
use sqlx::PgPool;

use crate::common::{ALL, Db, spawn_on};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: CheckArgs,
}

/// The checker's flags for `url`, as a user types them.
fn args(url: &str, flags: &[&str]) -> CheckArgs {
    let argv = ["participant-check", url]
        .into_iter()
        .chain(flags.iter().copied());
    Cli::try_parse_from(argv).expect("flags").args
}

/// How an author describes each reference participant's resource.
fn flags(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Seats => &["--resource", "seat", "--capacity", "1"],
        Kind::Stock | Kind::StockRedis => {
            &["--resource", "sku", "--capacity", "5", "--quantity", "2"]
        }
        Kind::Rooms => &["--resource", "room", "--capacity", "1", "--slot", "2h"],
        Kind::Payments => &[
            "--resource",
            "acct",
            "--capacity",
            "1000",
            "--quantity",
            "250",
        ],
        // noop bounds nothing: no capacity to give.
        Kind::Noop => &["--resource", "anything"],
    }
}

async fn run(url: &str, flags: &[&str]) -> Report {
    check(args(url, flags)).await.expect("the check runs")
}

fn names(report: &Report, verdict: Verdict) -> Vec<&'static str> {
    report
        .rows
        .iter()
        .filter(|r| r.verdict == verdict)
        .map(|r| r.case)
        .collect()
}

/// Every reference participant on `db` passes every case it can be checked by; noop's
/// capacity cases are skipped, saying why.
async fn reference_participants_pass(db: &Db) {
    for kind in db.kinds() {
        let p = spawn_on(kind, db).await;
        let report = run(&p.url, flags(kind)).await;
        let table = report.table();
        assert!(
            report.failed().is_empty(),
            "{kind:?} on {}:\n{table}",
            db.name()
        );
        if kind == Kind::Noop {
            assert_eq!(
                names(&report, Verdict::Skipped),
                ["concurrent-trys", "past-capacity"],
                "{table}"
            );
            for row in report.rows.iter().filter(|r| r.verdict == Verdict::Skipped) {
                assert!(row.got.contains("no --capacity"), "{table}");
            }
        } else {
            assert_eq!(
                report.count(Verdict::Pass),
                CASES.len(),
                "{kind:?}:\n{table}"
            );
        }
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn every_reference_participant_passes_on_postgres(pool: PgPool) {
    let db = Db::Postgres(pool);
    assert!(db.kinds().contains(&Kind::StockRedis) && db.kinds().len() == ALL.len());
    reference_participants_pass(&db).await;
}

#[sqlx::test(migrations = false)]
async fn every_reference_participant_passes_on_sqlite(pool: PgPool) {
    let [_, sqlite] = Db::both(&pool).await;
    reference_participants_pass(&sqlite).await;
}

#[sqlx::test(migrations = false)]
async fn a_run_repeats_against_the_same_participant(pool: PgPool) {
    let p = spawn_on(Kind::Seats, &Db::Postgres(pool)).await;
    for round in 0..2 {
        let report = run(&p.url, flags(Kind::Seats)).await;
        assert!(
            report.failed().is_empty(),
            "round {round}:\n{}",
            report.table()
        );
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_correct_participant_without_the_sdk_passes() {
    let (url, stop) = InTest::start(None, true).await;
    let report = run(
        &url,
        &["--resource", "sku", "--capacity", "6", "--quantity", "2"],
    )
    .await;
    assert_eq!(
        report.count(Verdict::Pass),
        CASES.len(),
        "{}",
        report.table()
    );
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_resource_admin_the_flags_describe_the_resource_and_runs_repeat() {
    // 20 units of "sku"; a run confirms up to 4 Trys' worth, so the next run is told 12.
    let (url, stop) = InTest::start_with(None, false, &[("sku", 20)]).await;
    let first = run(
        &url,
        &["--resource", "sku", "--capacity", "20", "--quantity", "2"],
    )
    .await;
    assert_eq!(first.count(Verdict::Pass), CASES.len(), "{}", first.table());
    assert!(
        first
            .notes
            .iter()
            .any(|n| n.contains("PutResources not offered")),
        "{}",
        first.table()
    );
    let second = run(
        &url,
        &["--resource", "sku", "--capacity", "12", "--quantity", "2"],
    )
    .await;
    assert_eq!(
        second.count(Verdict::Pass),
        CASES.len(),
        "{}",
        second.table()
    );
    let _ = stop.send(());
}

/// Each broken rule, and the cases that must report it (in the report's order).
const BROKEN: [(Broken, &[&str]); 6] = [
    (
        Broken::ForgetsIdempotence,
        &["past-capacity", "repeat-try-cancel", "repeat-confirm"],
    ),
    (Broken::HoldsLateTry, &["cancel-before-try"]),
    (
        Broken::ConfirmsAfterCancel,
        &["cancel-before-try", "confirm-after-cancel"],
    ),
    (Broken::Oversells, &["concurrent-trys"]),
    (Broken::NoOrphanGrace, &["expires-at-past"]),
    (Broken::Panics, &["unknown-branch", "invalid-try"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_broken_rule_is_reported_by_its_cases() {
    for (broken, expected) in BROKEN {
        let (url, stop) = InTest::start(Some(broken), true).await;
        let report = run(
            &url,
            &["--resource", "sku", "--capacity", "6", "--quantity", "2"],
        )
        .await;
        assert_eq!(report.failed(), expected, "{broken:?}:\n{}", report.table());
        assert_eq!(report.count(Verdict::Skipped), 0, "{broken:?}");
        let _ = stop.send(());
    }
}

async fn binary(argv: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("participant-check")
        .args(argv)
        .env_remove("HOLDFAST_API_KEY")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run holdfast")
}

#[sqlx::test(migrations = false)]
async fn the_binary_prints_the_table_and_exits_by_the_result(pool: PgPool) {
    let p = spawn_on(Kind::Stock, &Db::Postgres(pool)).await;
    let mut argv = vec![p.url.as_str()];
    argv.extend(flags(Kind::Stock));
    let out = binary(&argv).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let header = stdout
        .lines()
        .find(|l| l.starts_with("CASE"))
        .expect(&stdout);
    for column in ["EXPECTED", "GOT", "RESULT"] {
        assert!(header.contains(column), "{header}");
    }
    for case in CASES {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(case.name))
            .unwrap_or_else(|| panic!("no row for {}:\n{stdout}", case.name));
        assert!(line.trim_end().ends_with("pass"), "{line}");
    }
    assert!(
        stdout.contains(&format!("{} passed, 0 failed, 0 skipped", CASES.len())),
        "{stdout}"
    );
    p.stop().await;

    // A broken participant: exit 1, its failing row in the table and in --json.
    let (url, stop) = InTest::start(Some(Broken::HoldsLateTry), true).await;
    let flags = ["--resource", "sku", "--capacity", "6", "--quantity", "2"];
    let mut argv = vec![url.as_str()];
    argv.extend(flags);
    let out = binary(&argv).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("cancel-before-try"))
        .expect(&stdout);
    assert!(line.trim_end().ends_with("FAIL"), "{line}");
    // Cells wrap between steps, never inside one.
    assert!(
        stdout.contains("late Try HELD (expected REJECTED)"),
        "{stdout}"
    );
    argv.push("--json");
    let out = binary(&argv).await;
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(json["failed"], 1, "{json}");
    assert_eq!(json["passed"], CASES.len() - 1, "{json}");
    let failed: Vec<&str> = json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["result"] == "fail")
        .filter_map(|c| c["case"].as_str())
        .collect();
    assert_eq!(failed, ["cancel-before-try"], "{json}");
    let _ = stop.send(());

    // Nobody listening: exit 3. A wrong flag: exit 2, nothing sent.
    let closed = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let out = binary(&[&closed, "--resource", "sku", "--timeout", "2s"]).await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
    let out = binary(&[&closed, "--resource", "sku", "--quantity", "0"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--quantity"));
}

#[sqlx::test(migrations = false)]
async fn a_participant_that_does_not_count_capacity_has_its_capacity_cases_skipped(pool: PgPool) {
    // noop accepts PutResources and changes nothing: its counts are not the resource's.
    let p = spawn_on(Kind::Noop, &Db::Postgres(pool)).await;
    let report = run(&p.url, &["--resource", "anything", "--capacity", "3"]).await;
    let table = report.table();
    assert!(report.failed().is_empty(), "{table}");
    assert_eq!(
        names(&report, Verdict::Skipped),
        ["concurrent-trys", "past-capacity"],
        "{table}"
    );
    for row in report.rows.iter().filter(|r| r.verdict == Verdict::Skipped) {
        assert!(
            row.got.contains("does not count this resource's capacity"),
            "{table}"
        );
    }
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.starts_with("counts not checked")),
        "{table}"
    );
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn an_api_key_is_presented_and_a_refused_probe_is_a_usage_error(pool: PgPool) {
    use holdfast::auth::{Authenticator, Role, keys};
    let key = keys::new_key().unwrap();
    let path = std::env::temp_dir().join(format!("holdfast-check-keys-{}", uuid::Uuid::new_v4()));
    std::fs::write(
        &path,
        keys::principal_entry("checker", &[Role::Coordinator, Role::Admin], &key),
    )
    .unwrap();
    let mut settings = holdfast::participants::ParticipantSettings::new(Kind::Stock);
    settings.auth = Authenticator::from_file("--auth-keys", &path).unwrap();
    let p = crate::common::spawn_settings_on(settings, &Db::Postgres(pool)).await;
    let mut with_key = flags(Kind::Stock).to_vec();
    with_key.extend(["--api-key", key.as_str()]);
    let report = run(&p.url, &with_key).await;
    assert_eq!(
        report.count(Verdict::Pass),
        CASES.len(),
        "{}",
        report.table()
    );
    // Without the key the participant refuses the probe: nothing is judged, exit 2.
    let refused = check(args(&p.url, flags(Kind::Stock))).await;
    match refused {
        Err(e) => {
            assert_eq!(e.exit_code(), 2, "{e}");
            assert!(e.to_string().contains("UNAUTHENTICATED"), "{e}");
        }
        Ok(report) => panic!("judged without a key:\n{}", report.table()),
    }
    p.stop().await;
    let _ = std::fs::remove_file(path);
}
