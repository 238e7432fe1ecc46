//! A participant removed from the configuration (#15 item 4): the coordinator says at start
//! how many unfinished reservations wait on it, with example ids (an ERROR log and the gauge
//! `holdfast_unregistered_participant_backlog{participant}`), and keeps driving the rest.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::common::*;

/// Log lines, as the coordinator writes them.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Waits until `done` holds, polling every 20 ms for up to 15 s.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn gauge(participant: &str) -> Option<String> {
    let prefix =
        format!("holdfast_unregistered_participant_backlog{{participant=\"{participant}\"}} ");
    holdfast::telemetry::metrics_handle()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
}

#[sqlx::test(migrations = false)]
async fn work_waiting_on_a_removed_participant_is_reported_and_the_rest_keeps_working(
    pool: PgPool,
) {
    holdfast::telemetry::metrics_handle();
    // The test's runtime has one thread: every task of the coordinators logs through this.
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let fakes = spawn_fakes(&["seats", "gone"]).await;
    let (seats, gone) = (
        fakes.get("seats").url.clone(),
        fakes.get("gone").url.clone(),
    );
    let mut before = spawn_app(
        pool.clone(),
        settings(&[("seats", &seats), ("gone", &gone)]),
    )
    .await;
    // Six reservations that need "gone": five held, one confirming (its Confirm failed there).
    let mut waiting = Vec::new();
    for i in 0..6 {
        let mut req = reserve_request(
            &format!("r{i}"),
            vec![hold("seats", &format!("S{i}")), hold("gone", "G")],
        );
        req.holder = format!("holder-{i}");
        let r = before.client.reserve(req).await.unwrap().into_inner();
        assert_eq!(state_of(&r), State::Held);
        waiting.push(r);
    }
    fakes
        .get("gone")
        .behaviour
        .fail_confirms
        .store(1_000, Ordering::SeqCst);
    let confirming = before
        .client
        .confirm(Decide::on(&waiting[0]).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&confirming), State::Confirming);
    // And one that does not: it lapses while the next coordinator runs, which must reap it.
    let mut short = reserve_request("short", vec![hold("seats", "X")]);
    short.holder = "holder-x".into();
    short.ttl = Some(proto_duration(Duration::from_secs(1)));
    let lapsing = before.client.reserve(short).await.unwrap().into_inner();
    before.shut_down();

    // "gone" is removed from the configuration.
    let mut after = spawn_app(pool.clone(), settings(&[("seats", &seats)])).await;
    until("the gauge reports the backlog", async || {
        gauge("gone").is_some()
    })
    .await;
    assert_eq!(gauge("gone").as_deref(), Some("6"));
    assert_eq!(
        gauge("seats"),
        None,
        "registered participants are not reported"
    );
    let text = log.text();
    let line = text
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("wait on participant \"gone\""))
        .unwrap_or_else(|| panic!("no ERROR line about \"gone\" in:\n{text}"));
    assert!(line.contains("6 unfinished reservation(s)"), "{line}");
    let named = waiting.iter().filter(|r| line.contains(&r.id)).count();
    assert_eq!(named, 5, "up to 5 example ids: {line}");

    // The rest keeps working: a new reservation is confirmed, the lapsed one is reaped.
    let r = after
        .client
        .reserve(reserve_request("fresh", vec![hold("seats", "F")]))
        .await
        .unwrap()
        .into_inner();
    let c = after
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);
    let get = |id: &str| proto::GetReservationRequest {
        reservation_id: id.to_owned(),
    };
    until("the lapsed reservation reaped", async || {
        let now = after
            .client
            .get_reservation(get(&lapsing.id))
            .await
            .unwrap()
            .into_inner();
        state_of(&now) == State::Expired && !fakes.get("seats").held().contains(&"X".to_owned())
    })
    .await;
    // The confirming one waits, retried with backoff (not in a loop), its branch saying why.
    let stuck = after
        .client
        .get_reservation(get(&confirming.id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&stuck), State::Confirming);
    let attempts: i32 =
        sqlx::query_scalar("SELECT recovery_attempts FROM reservations WHERE id = $1::uuid")
            .bind(&confirming.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(attempts < 10, "recovery spun on it: {attempts} attempts");
    after.shut_down();
}
