//! What a freshly started all-in-one exports before anything happened (the embedded SQLite
//! default, nothing sent to it): every metric family has a `# HELP` line (`promtool check
//! metrics` flags families without), the counters alerts read are there at 0 before their
//! first event, and `holdfast_build_info{version}` is 1. Its log, written to a file, carries
//! no terminal colour codes.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::{Holdfast, listen_addr, scrape, serving};

/// The families of a Prometheus text page: the names of its `# TYPE` and of its `# HELP` lines.
fn families(page: &str) -> (BTreeSet<&str>, BTreeSet<&str>) {
    let named = |prefix: &str| -> BTreeSet<&str> {
        page.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|rest| rest.split_whitespace().next())
            .collect()
    };
    (named("# TYPE "), named("# HELP "))
}

/// The value of the sample written exactly as `series` (name and labels), if the page has it.
fn sample<'a>(page: &'a str, series: &str) -> Option<&'a str> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(str::trim)
}

#[tokio::test]
async fn a_started_server_describes_every_metric_and_counts_from_zero() {
    let dir = tempdir();
    let listen = listen_addr(23);
    let log = dir.join("holdfast.log");
    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    let page = scrape(SocketAddr::new(listen.ip(), 9464)).await;
    let (typed, helped) = families(&page);
    assert!(typed.len() > 10, "too few families:\n{page}");
    let undescribed: Vec<_> = typed.difference(&helped).collect();
    assert!(
        undescribed.is_empty(),
        "families without # HELP: {undescribed:?}"
    );
    for series in [
        r#"holdfast_auth_failures_total{reason="UNAUTHENTICATED"}"#,
        r#"holdfast_auth_failures_total{reason="PERMISSION_DENIED"}"#,
        r#"holdfast_connections_dropped_total{reason="max_connections"}"#,
        r#"holdfast_admin_actions_total{action="force_cancel"}"#,
        "holdfast_failed_reservations_total",
        "holdfast_expired_holds_total",
        "holdfast_watch_polls_total",
    ] {
        assert_eq!(
            sample(&page, series),
            Some("0"),
            "{series} at 0 in:\n{page}"
        );
    }
    let build = format!(
        r#"holdfast_build_info{{version="{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&page, &build), Some("1"), "{build} in:\n{page}");
    process.kill();
    let output = std::fs::read_to_string(&log).expect("the log");
    assert!(output.contains(" INFO "), "no log lines:\n{output}");
    assert!(
        !output.contains('\u{1b}'),
        "terminal colour codes in a log file:\n{output:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh working directory for the embedded default.
fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "holdfast-e2e-metrics-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("a temp folder");
    dir
}
