//! The all-in-one's start-up banner (SPEC 5, 7.2), read from the real binary's output and
//! taken at its word: the database it names (without the URL's credentials), the
//! authentication mode, and an address for the coordinator, each participant and the metrics
//! that each answers there; the grpcurl example's Reserve works as printed.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use tonic_health::pb::health_check_response::ServingStatus;

use super::{Holdfast, TempDatabase, health, listen_addr, scrape, serving};
use crate::common::state_of;

/// What the banner says: (what, name) -> address, from its `  coordinator`, `  participant`
/// and `  metrics` lines.
fn addresses(banner: &str) -> BTreeMap<(String, String), String> {
    banner
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [
                    what @ ("coordinator" | "participant" | "metrics"),
                    name,
                    addr,
                ] => Some((((*what).to_owned(), (*name).to_owned()), (*addr).to_owned())),
                _ => None,
            }
        })
        .collect()
}

#[tokio::test]
async fn the_banner_names_what_runs_where_and_each_answers_there() {
    let db = TempDatabase::create().await;
    // Credentials in the URL (the local server trusts loopback, so any password connects):
    // the banner must not print them.
    let url = db.url.replacen("://postgres@", "://postgres:hunter2@", 1);
    assert_ne!(
        url, db.url,
        "the test database URL changed shape: {}",
        db.url
    );
    let listen = listen_addr(4);
    let log = std::env::temp_dir().join(format!(
        "holdfast-e2e-banner-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let mut process = Holdfast::start(&url, listen, log.clone());
    serving(&mut process, listen).await;
    let output = std::fs::read_to_string(&log).expect("the output");
    let banner = output
        .split_once("holdfast all-in-one")
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("no banner in:\n{output}"));

    let database = db.url.rsplit_once('@').map_or(db.url.as_str(), |(_, d)| d);
    assert!(
        banner.starts_with(&format!(" (database: {database})")),
        "{banner}"
    );
    assert!(
        !output.contains("hunter2"),
        "credentials printed:\n{output}"
    );
    assert!(
        banner.contains("authentication off (loopback only)"),
        "{banner}"
    );
    assert!(
        banner.contains(
            "hold tokens: derived with a key of this process only (--ephemeral-token-secret)"
        ),
        "{banner}"
    );

    let said = addresses(banner);
    let ip = listen.ip();
    let mut want = BTreeMap::new();
    want.insert(
        ("coordinator".to_owned(), "tcc.v1.Coordinator".to_owned()),
        listen.to_string(),
    );
    for (name, port) in [
        ("seats", 50061),
        ("stock", 50062),
        ("rooms", 50063),
        ("payments", 50064),
        ("noop", 50065),
    ] {
        want.insert(
            ("participant".to_owned(), name.to_owned()),
            format!("{ip}:{port}"),
        );
    }
    want.insert(
        ("metrics".to_owned(), "Prometheus".to_owned()),
        format!("http://{ip}:9464/metrics"),
    );
    assert_eq!(said, want, "{banner}");

    // Each answers where the banner says.
    for ((what, name), addr) in &said {
        match what.as_str() {
            "participant" => {
                let addr: SocketAddr = addr.parse().expect("an address");
                let status = health(addr, "tcc.v1.Participant").await;
                assert!(
                    matches!(status, Ok(ServingStatus::Serving)),
                    "{name} at {addr}: {status:?}"
                );
            }
            "metrics" => {
                let addr = addr
                    .trim_start_matches("http://")
                    .trim_end_matches("/metrics");
                let body = scrape(addr.parse().expect("an address")).await;
                assert!(body.contains("holdfast_"), "{body}");
            }
            _ => {}
        }
    }
    // The example, as printed: a Reserve of seat-A1 at noop.
    let example = banner
        .lines()
        .find(|l| l.contains("tcc.v1.Coordinator/Reserve"))
        .unwrap_or_else(|| panic!("no Reserve example in:\n{banner}"));
    assert!(
        example.contains("-plaintext") && example.contains(&format!(" {listen} ")),
        "{example}"
    );
    let body = example
        .split_once("-d '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(json, _)| json)
        .unwrap_or_else(|| panic!("no request body in {example}"));
    assert_eq!(
        body,
        r#"{"request_id":"demo-1","holder":"alice","holds":[{"participant":"noop","resource":"seat-A1","quantity":1}]}"#
    );
    let holds = vec![proto::Hold {
        participant: "noop".into(),
        resource: "seat-A1".into(),
        quantity: 1,
        during: None,
    }];
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("connect to the coordinator");
    let r = client
        .reserve(proto::ReserveRequest {
            request_id: "demo-1".into(),
            holder: "alice".into(),
            ttl: None,
            holds,
            labels: Default::default(),
            queue: None,
        })
        .await
        .expect("the example's Reserve")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    process.kill();
    drop(db);
    let _ = std::fs::remove_file(&log);
}
