//! `holdfast bench` end to end through the real binary, short runs on databases of their own:
//! every row clean and each ratio its rate over the right ceiling; the flash sale sells exactly
//! its units on `stock` and on `stock-redis`.

use super::{TempDatabase, run_holdfast, server_url, with_database};

/// Runs `holdfast bench <args>` on a fresh database of its own (a name with "bench" in it;
/// the bench drops and recreates it) with small pools, asserts it exited 0, and answers its
/// JSON result rows and its output (for failure messages).
fn run_bench(args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let (doc, output) = run_bench_document(args);
    let rows = doc["results"].as_array().expect("results").clone();
    (rows, output)
}

/// The result row `name` of `rows` (a bench's output, for the failure message).
fn row_named<'a>(rows: &'a [serde_json::Value], name: &str, output: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["scenario"] == name)
        .unwrap_or_else(|| panic!("no {name} row; {output}"))
}

/// [`run_bench`], answering the whole JSON document (the run's settings and its results).
pub(crate) fn run_bench_document(args: &[&str]) -> (serde_json::Value, String) {
    run_bench_on(&bench_database(), args)
}

/// A database name for a bench run (with "bench" in it, unique), dropped with the value.
fn bench_database() -> TempDatabase {
    let id = uuid::Uuid::new_v4().simple();
    TempDatabase {
        url: with_database(&server_url(), &format!("holdfast_bench_smoke_{id}")),
    }
}

/// [`run_bench_document`] on `db`, which outlives the run (holding its last row's database).
fn run_bench_on(db: &TempDatabase, args: &[&str]) -> (serde_json::Value, String) {
    let id = uuid::Uuid::new_v4().simple();
    let json = std::env::temp_dir().join(format!("holdfast-bench-smoke-{id}.json"));
    let mut argv = vec!["bench"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&[
        // Few connections: other tests share the server's max_connections.
        "--coordinator-pool",
        "8",
        "--participant-pool",
        "8",
        "--database-url",
        &db.url,
        "--json",
        json.to_str().expect("temp path"),
    ]);
    let out = run_holdfast(&argv, &[("RUST_LOG", "error")]);
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    let output = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "bench failed ({}); {output}",
        out.status
    );
    let doc: serde_json::Value =
        serde_json::from_str(&text.unwrap_or_else(|e| panic!("no JSON ({e}); {output}")))
            .expect("the JSON parses");
    (doc, output)
}

/// `holdfast bench ceiling latency throughput`, short: every row is there and clean, and each
/// row's ratio is its rate over its ceiling's, both readings of the ceiling (a row per
/// connection, one row for all) for the rows run at `--clients`.
#[test]
fn bench_reports_rates_against_both_ceilings() {
    let (rows, output) = run_bench(&[
        "ceiling",
        "latency",
        "throughput",
        "--duration",
        "1s",
        "--clients",
        "4",
    ]);
    let row = |name: &str| row_named(&rows, name, &output);
    let rate = |name: &str| row(name)["rate_per_s"].as_f64().expect("rate");
    for name in [
        "ceiling-1",
        "ceiling-4",
        "ceiling-4-one-row",
        "latency-noop",
        "latency-real",
        "throughput-noop",
        "throughput-real",
    ] {
        let r = row(name);
        assert!(r["failure"].is_null(), "{r}");
        assert_eq!(r["error_count"], 0, "{r}");
        assert!(r["ok"].as_u64().is_some_and(|ok| ok > 0), "{r}");
        assert!(rate(name) > 0.0, "{r}");
    }
    for name in ["latency-noop", "latency-real"] {
        let x = row(name)["ratio_to_ceiling"].as_f64().expect("ratio");
        assert!((x - rate(name) / rate("ceiling-1")).abs() < 1e-9, "{name}");
        assert!(row(name)["ratio_to_one_row_ceiling"].is_null());
    }
    for name in ["throughput-noop", "throughput-real"] {
        let x = row(name)["ratio_to_ceiling"].as_f64().expect("ratio");
        assert!((x - rate(name) / rate("ceiling-4")).abs() < 1e-9, "{name}");
        let y = row(name)["ratio_to_one_row_ceiling"]
            .as_f64()
            .expect("one-row ratio");
        assert!(
            (y - rate(name) / rate("ceiling-4-one-row")).abs() < 1e-9,
            "{name}"
        );
        assert!(row(name)["commits_per_op"].as_f64().is_some(), "{name}");
    }
    // Seats + stock: each client's stock item counted against the Confirms it was answered.
    for (name, clients) in [("latency-real", 1), ("throughput-real", 4)] {
        assert_eq!(row(name)["details"]["conservation_violations"], 0, "{name}");
        assert!(
            output.contains(&format!(
                "{name}: conservation: {clients} stock items counted after the run"
            )),
            "{output}"
        );
    }
}

/// `holdfast bench flash`, small, end to end: the real binary drops and recreates its own
/// database (a name with "bench" in it, unique to this test), runs the flash sale through its
/// in-process coordinator on `stock` and on `stock-redis`, exits 0, and its JSON shows both
/// rows sold exactly the units (the participants' own counts) with no error and no oversell;
/// the run's Redis keys are deleted afterwards.
#[test]
fn bench_flash_sells_exactly_the_units_on_stock_and_stock_redis() {
    const UNITS: i64 = 20;
    const CLIENTS: i64 = 300;
    let redis_url =
        std::env::var("HOLDFAST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let (rows, output) = run_bench(&[
        "flash",
        "--flash-clients",
        &CLIENTS.to_string(),
        "--flash-concurrency",
        "32",
        "--flash-units",
        &UNITS.to_string(),
        "--redis-url",
        &redis_url,
    ]);
    for name in ["flash", "flash-stock-redis"] {
        let row = rows
            .iter()
            .find(|r| r["scenario"] == name)
            .unwrap_or_else(|| panic!("no {name} row; {output}"));
        assert!(row["failure"].is_null(), "{row}");
        assert_eq!(row["error_count"], 0, "{row}");
        assert_eq!(row["ok"], UNITS, "{row}");
        assert_eq!(row["rejected"], CLIENTS - UNITS, "{row}");
        let details = &row["details"];
        assert_eq!(details["winners"], UNITS, "{row}");
        assert_eq!(details["oversell"], 0, "{row}");
        // Every answer is in the opening wave (the first 32 started) or after it.
        let wave = &details["opening_wave"];
        assert_eq!(wave["requests"], 32, "{row}");
        assert_eq!(wave["rest_requests"], CLIENTS - 32, "{row}");
        assert_eq!(wave["slowest_1pct"], 3, "{row}");
        assert!(
            output.contains("opening wave (the first 32 Reserves"),
            "{output}"
        );
        let counts = &details["participant_counts"];
        assert_eq!(
            (&counts["capacity"], &counts["confirmed"], &counts["held"]),
            (&UNITS.into(), &UNITS.into(), &0.into()),
            "{row}"
        );
    }
    let redis_row = rows
        .iter()
        .find(|r| r["scenario"] == "flash-stock-redis")
        .expect("row");
    assert_eq!(redis_row["details"]["participant"], "stock-redis");
    let prefix = redis_row["details"]["redis_key_prefix"]
        .as_str()
        .expect("redis_key_prefix");
    let mut redis = redis::Client::open(redis_url.as_str())
        .expect("redis url")
        .get_connection()
        .expect("redis");
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut redis)
        .expect("KEYS");
    assert!(left.is_empty(), "{} keys left under {prefix}", left.len());
}

/// `holdfast bench --auth`: every in-process server authenticates, the bench's calls carry the
/// run's keys (client, admin, and the coordinator's own towards participants), and every row
/// is clean - a key refused anywhere would be an error row.
#[test]
fn the_bench_runs_with_authentication_on_every_server() {
    let (doc, output) = run_bench_document(&[
        "latency",
        "throughput",
        "holds",
        "--duration",
        "1s",
        "--clients",
        "2",
        "--auth",
    ]);
    assert_eq!(doc["auth"], true, "{output}");
    let rows = doc["results"].as_array().expect("results");
    for name in [
        "latency-noop",
        "latency-real",
        "throughput-noop",
        "throughput-real",
        "holds-stock",
    ] {
        let row = rows
            .iter()
            .find(|r| r["scenario"] == name)
            .unwrap_or_else(|| panic!("no {name} row; {output}"));
        assert!(row["failure"].is_null(), "{row}");
        assert_eq!(row["error_count"], 0, "{row}");
        assert!(row["ok"].as_i64().expect("ok") > 0, "{row}");
    }
}

/// The run's JetStream streams (on the shared server at 127.0.0.1:4222) are gone.
fn assert_streams_deleted(streams: Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = async_nats::connect("nats://127.0.0.1:4222").await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        for stream in streams {
            assert!(
                jetstream.get_stream(&stream).await.is_err(),
                "{stream} left behind"
            );
        }
    });
}

/// `holdfast bench latency flash --events-nats-url`, short: the rows the hot path's targets are
/// read from run with the in-process coordinator delivering its events to NATS (the shared
/// server on 127.0.0.1:4222), as the `-nats` throughput rows do: each reports how many events
/// the sink delivered and their lag, the flash sale still sells exactly its units, and the
/// run's streams are gone afterwards.
#[test]
fn bench_latency_and_flash_rows_deliver_their_events_to_nats() {
    const UNITS: i64 = 10;
    const CLIENTS: i64 = 100;
    let (rows, output) = run_bench(&[
        "latency",
        "flash",
        "--duration",
        "1s",
        "--flash-clients",
        &CLIENTS.to_string(),
        "--flash-concurrency",
        "16",
        "--flash-units",
        &UNITS.to_string(),
        "--events-nats-url",
        "nats://127.0.0.1:4222",
    ]);
    let mut streams = Vec::new();
    for name in ["latency-noop", "latency-real", "flash"] {
        let r = row_named(&rows, name, &output);
        assert!(r["failure"].is_null(), "{r}");
        assert_eq!(r["error_count"], 0, "{r}");
        let events = &r["details"]["events_nats"];
        assert!(events["delivered"].as_u64().is_some_and(|n| n > 0), "{r}");
        assert!(events["lag_ms"]["p99"].as_f64().is_some(), "{r}");
        assert!(output.contains(&format!("{name}: events: ")), "{output}");
        streams.push(events["stream"].as_str().expect("stream").to_owned());
    }
    let flash = row_named(&rows, "flash", &output);
    assert_eq!(flash["ok"], UNITS, "{flash}");
    assert_eq!(flash["details"]["oversell"], 0, "{flash}");
    assert_streams_deleted(streams);
}

/// `holdfast bench throughput --events-nats-url`, short: each workload runs three times,
/// without the event log (its triggers off: nothing appended), with it, and with it and the
/// in-process coordinator delivering its events to NATS (the shared server on 127.0.0.1:4222);
/// the rows are clean and measured their CPU per operation, the `-nats` rows report how many
/// events the sink delivered and their lag, the rates kept against the row without events and
/// the row with the log alone are printed, and the run's streams are gone afterwards.
#[test]
fn bench_throughput_with_a_nats_sink_reports_the_event_lag() {
    let (rows, output) = run_bench(&[
        "throughput",
        "--duration",
        "1s",
        "--clients",
        "4",
        "--events-nats-url",
        "nats://127.0.0.1:4222",
    ]);
    let row = |name: &str| row_named(&rows, name, &output);
    let mut streams = Vec::new();
    for workload in ["throughput-noop", "throughput-real"] {
        let without = format!("{workload}-without-events");
        let name = format!("{workload}-nats");
        for (row_name, appends) in [
            (&without, false),
            (&workload.to_owned(), true),
            (&name, true),
        ] {
            let r = row(row_name);
            assert!(r["failure"].is_null(), "{r}");
            assert_eq!(r["error_count"], 0, "{r}");
            let appended = r["details"]["events_appended"].as_i64().expect("appended");
            assert_eq!(appended > 0, appends, "{r}");
            let cpu = r["details"]["cpu_ms_per_op"]["total"].as_f64();
            assert!(cpu.is_some_and(|ms| ms > 0.0), "{r}");
        }
        let r = row(&name);
        let events = &r["details"]["events_nats"];
        assert!(events["delivered"].as_u64().is_some_and(|n| n > 0), "{r}");
        assert!(events["lag_ms"]["p99"].as_f64().is_some(), "{r}");
        assert!(output.contains(&format!("{name}: events: ")), "{output}");
        for line in [
            format!("events: {name} (log and NATS sink) keeps "),
            format!(" of {without}'s rate"),
            format!("events: {workload} (log alone) keeps "),
            format!("events: {name} (the sink alone) keeps "),
        ] {
            assert!(output.contains(&line), "{line:?} missing; {output}");
        }
        assert!(output.contains("caught up"), "{output}");
        streams.push(events["stream"].as_str().expect("stream").to_owned());
    }
    assert_streams_deleted(streams);
}

/// A row starts on a database with a history (finished reservations, sold seats), analyzed, as a
/// deployment that has run a while has: the statements of Reserve, Confirm and the seats
/// participant find their rows through indexes, and no sequential scan reads a row of
/// `reservations`, `branches` or `seat`. On the empty, never-analyzed tables rows used to start
/// on, the pools' prepared statements settled on an empty table's plans and kept them while
/// the tables grew: in this 2 s row, 2,676 sequential scans read 681,356 reservation rows.
#[test]
fn bench_rows_find_their_rows_through_indexes() {
    let db = bench_database();
    let (doc, output) = run_bench_on(&db, &["throughput", "--duration", "2s", "--clients", "4"]);
    let rows = doc["results"].as_array().expect("results");
    let last = rows.last().expect("a row");
    assert_eq!(last["scenario"], "throughput-real", "{output}");
    assert!(last["failure"].is_null(), "{last}");
    assert!(last["ok"].as_u64().is_some_and(|ok| ok > 20), "{last}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let scans: Vec<(String, i64, i64)> = runtime.block_on(async {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let scans = sqlx::query_as(
            "SELECT relname::text, seq_tup_read, n_live_tup FROM pg_stat_user_tables \
             WHERE relname IN ('reservations', 'branches', 'seat') ORDER BY relname",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        scans
    });
    assert_eq!(scans.len(), 3, "{scans:?}");
    for (table, read_by_scans, rows) in &scans {
        // The schema's own scans (index builds, migrations) ran on empty tables.
        assert_eq!(
            *read_by_scans, 0,
            "{table}: rows read by sequential scans; {scans:?}"
        );
        assert!(*rows >= 50_000, "{table}: {rows} rows");
    }
}

/// `holdfast bench retention`, small: both rows run on the finished reservations the scenario
/// seeded (rows start on a fresh database, but for these), so the purging row sees the
/// coordinator purge them during its window. Enough rows that the purge outlasts the
/// deployment's start (a few hundred are gone before the window opens).
#[test]
fn bench_retention_purges_what_it_seeded() {
    let (rows, output) = run_bench(&[
        "retention",
        "--retention-rows",
        "30000",
        "--retention-clients",
        "2",
        "--duration",
        "3s",
    ]);
    let row = |name: &str| row_named(&rows, name, &output);
    for name in ["retention-off", "retention-purging"] {
        let r = row(name);
        assert!(r["failure"].is_null(), "{r}");
        assert_eq!(r["error_count"], 0, "{r}");
    }
    let purging = row("retention-purging");
    let purged = purging["details"]["purged_in_window"].as_u64();
    assert!(purged.is_some_and(|n| n > 0), "{purging}; {output}");
}
