//! `holdfast bench`: runs named scenarios against an in-process deployment (coordinator +
//! reference participants over loopback gRPC, plaintext or TLS on every hop, on a fresh
//! Postgres database) or an existing one (`--target`), and prints throughput and latency next to the raw commit rate of the same
//! Postgres measured in the same run (`ceiling`). See `BENCHMARKS.md`.

mod cpu;
pub mod credentials;
pub mod deploy;
mod events;
mod flash_rows;
mod report;
mod reserve_confirm_rows;
mod retention_rows;
mod rounds;
pub mod scenarios;
pub mod stats;
mod transport;

pub use report::Row;
pub use transport::Transport;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::coordinator::Retention;
use report::{print_table, row, to_json};
use scenarios::{Ctx, Measured, Progress};

/// A named scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Scenario {
    /// The database's raw commit rate at 1 and at --clients connections.
    Ceiling,
    /// One client, sequential Reserve+Confirm of 2 holds (noop, then seats + stock).
    Latency,
    /// --clients clients, Reserve+Confirm of 2 holds on 2 participants (noop, then seats + stock).
    Throughput,
    /// --flash-clients clients racing for --flash-units units of one stock item through
    /// the coordinator: on stock, and on stock-redis when --redis-url is set.
    Flash,
    /// The flash sale on stock where every other winner cancels, so units come back while
    /// losers are refused; fails unless every unit ends confirmed or available, none held.
    FlashChurn,
    /// The flash sale where every client queues; fails unless offers follow queue order.
    Waitlist,
    /// A stock participant alone: --clients clients sending Try (1 unit each) straight to
    /// it, for --duration: stock on Postgres, and stock-redis when --redis-url is set.
    Holds,
    /// Reserve latency (--retention-clients clients, --duration) with retention off, then
    /// while the coordinator purges --retention-rows finished reservations seeded 40 days
    /// old. In-process only; run only when named (it seeds a million rows by default).
    Retention,
}

/// Settings of `holdfast bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Scenarios to run (default: all but retention), always in the order ceiling, latency,
    /// throughput, flash, flash-churn, waitlist, holds, retention.
    #[arg(value_enum)]
    pub scenarios: Vec<Scenario>,

    /// Benchmark an existing deployment at this coordinator URL instead of starting one;
    /// replicas' URLs separated by commas spread the clients over them (round robin).
    #[arg(long)]
    pub target: Option<String>,

    /// PostgreSQL database for the in-process deployment and for `ceiling`. Without
    /// `--target` it is DROPPED and recreated, so its name must contain "bench".
    #[arg(
        long,
        env = "HOLDFAST_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/holdfast_bench"
    )]
    pub database_url: String,

    /// Concurrent clients of `throughput` (and connections of `ceiling`).
    #[arg(long, default_value_t = 32)]
    pub clients: usize,

    /// How long each timed scenario runs.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    pub duration: Duration,

    /// Clients of the flash sale.
    #[arg(long, default_value_t = 10_000)]
    pub flash_clients: usize,

    /// Flash-sale clients in flight at once.
    #[arg(long, default_value_t = 256)]
    pub flash_concurrency: usize,

    /// Units of the flash-sale item.
    #[arg(long, default_value_t = 100)]
    pub flash_units: i64,

    /// Finished reservations the `retention` scenario seeds for the purge.
    #[arg(long, default_value_t = 1_000_000)]
    pub retention_rows: u64,

    /// Clients doing Reserves in the `retention` scenario.
    #[arg(long, default_value_t = 4)]
    pub retention_clients: usize,

    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Redis for the `stock-redis` rows of `flash` and `holds` (skipped without it); each
    /// run uses keys of its own and deletes them afterwards.
    #[arg(long, env = "HOLDFAST_REDIS_URL")]
    pub redis_url: Option<String>,

    /// Database connections of the in-process coordinator.
    #[arg(long, default_value_t = 32)]
    pub coordinator_pool: u32,

    /// Database connections shared by the in-process participants.
    #[arg(long, default_value_t = 32)]
    pub participant_pool: u32,

    /// With --target: registered noop participant names (one: 2 resources on it; two: one
    /// hold on each). Default "noop" (the all-in-one's).
    #[arg(long = "noop", value_delimiter = ',')]
    pub noop: Vec<String>,

    /// With --target: ResourceAdmin URL of the `seats` participant.
    #[arg(long, default_value = "http://127.0.0.1:50061")]
    pub seats_admin: String,

    /// With --target: ResourceAdmin URL of the `stock` participant.
    #[arg(long, default_value = "http://127.0.0.1:50062")]
    pub stock_admin: String,

    /// Seats provisioned per client at a time (seats + stock workload).
    #[arg(long, default_value_t = 500)]
    pub seat_block: usize,

    /// TLS on every gRPC hop of the in-process deployment: the certificate (PEM) every
    /// in-process server serves; it must name 127.0.0.1 (IP SAN) and be signed by --tls-ca.
    /// Needs --tls-key and --tls-ca. With --target, the client certificate of
    /// --tls-client-auth. Make a test CA and one with
    /// `sh deploy/tls/make-certs.sh certs bench`, then pass `--tls-cert certs/bench.crt
    /// --tls-key certs/bench.key --tls-ca certs/ca.crt`.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// The CA (PEM) that signed --tls-cert, trusted by the in-process coordinator towards its
    /// participants and by the bench's own clients. With --target: the CA of its https://
    /// URLs (default: the system roots).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// mTLS: every in-process server also requires a client certificate signed by --tls-ca,
    /// and the coordinator and the bench's clients present --tls-cert (with --target: the
    /// bench's clients present it).
    #[arg(long)]
    pub tls_client_auth: bool,

    /// Authentication on every in-process server: principals and API keys made for the run
    /// (a client key for the coordinator, an admin key for ResourceAdmin, the coordinator's
    /// own key for its participants), as a deployment with --auth-keys has.
    #[arg(long)]
    pub auth: bool,

    /// NATS server with JetStream (nats://HOST:4222): `throughput` also runs each workload with
    /// the in-process coordinator delivering its events there (rows `throughput-*-nats`, on a
    /// stream of the run's own, deleted afterwards), and reports the event lag and the rate
    /// kept against the same workload without the sink; the `latency`, `flash` and `waitlist`
    /// rows run with the sink too, each reporting its lag.
    #[arg(long, value_name = "URL")]
    pub events_nats_url: Option<String>,

    /// Runs the rows of `latency` and `throughput` this many times, interleaved (each round
    /// once through every workload, a workload's rows in reverse order every other round), as
    /// rows `<name>#<round>`; with --events-nats-url the bound is then read off the median
    /// round. A 2-core machine's rows scatter by 10 % and more: one round cannot tell 0.85
    /// from 0.95.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,

    /// With --target: the API key presented on every call (`authorization: Bearer`); it needs
    /// the client role at the coordinator and admin for ResourceAdmin.
    #[arg(long, env = "HOLDFAST_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// Whether a row is a flash sale (`flash`, `flash-stock-redis`).
fn is_flash(name: &str) -> bool {
    name == "flash" || name.starts_with("flash-") || name == "waitlist"
}

/// Commits and rollbacks so far in the database at `url` (statistics of exited backends are
/// exact; the pools of a stopped deployment are closed before this is read).
async fn xacts(url: &str) -> Option<(i64, i64)> {
    use sqlx::{ConnectOptions, Connection};
    let mut conn = crate::db::postgres_options(url)
        .ok()?
        .connect()
        .await
        .ok()?;
    let row: (i64, i64) = sqlx::query_as(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut conn)
    .await
    .ok()?;
    let _ = conn.close().await;
    Some(row)
}

/// Why `holdfast bench` failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The in-process deployment's database could not be reset or migrated.
    #[error("bench: preparing the database: {0}")]
    Setup(String),
    /// The TLS settings (`--tls-*`) cannot be used.
    #[error("bench: TLS settings: {0}")]
    Transport(String),
    /// The `--json` results could not be written.
    #[error("bench: writing the results: {0}")]
    Output(String),
    /// These scenarios failed, had errors, or oversold (their rows say which).
    #[error("bench: scenarios with failures, errors or oversell: {}", .0.join(", "))]
    Failed(Vec<String>),
}

/// Runs the selected scenarios and prints the summary; `Err` when a scenario failed, had
/// errors, or oversold.
pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    let mut selected = if args.scenarios.is_empty() {
        vec![
            Scenario::Ceiling,
            Scenario::Latency,
            Scenario::Throughput,
            Scenario::Flash,
            Scenario::FlashChurn,
            Scenario::Waitlist,
            Scenario::Holds,
        ]
    } else {
        args.scenarios.clone()
    };
    selected.sort();
    selected.dedup();
    // Before the database is reset: bad TLS settings fail the run at once.
    let transport = Transport::from_args(&args)
        .await
        .map_err(BenchError::Transport)?;
    for line in [transport.describe(), transport.describe_auth()]
        .into_iter()
        .flatten()
    {
        eprintln!("bench: {line}");
    }
    let in_process = args.target.is_none();
    if !in_process && args.events_nats_url.is_some() {
        eprintln!(
            "bench: --events-nats-url ignored with --target (the target delivers its own events)"
        );
    }
    if in_process {
        eprintln!("bench: resetting database {}", redact(&args.database_url));
        deploy::reset_database(&args.database_url)
            .await
            .map_err(BenchError::Setup)?;
        deploy::migrate(&args.database_url)
            .await
            .map_err(BenchError::Setup)?;
    }
    let run_id = format!("b{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let ceiling_many = format!("ceiling-{}", args.clients);
    let mut rows: Vec<Row> = Vec::new();

    for scenario in selected {
        match scenario {
            Scenario::Ceiling => ceiling_rows(&args, &ceiling_many, &mut rows).await,
            Scenario::Latency | Scenario::Throughput => {
                let ctx = reserve_confirm_rows::RunCtx {
                    args: &args,
                    transport: &transport,
                    run_id: &run_id,
                    ceiling_many: &ceiling_many,
                };
                reserve_confirm_rows::run(ctx, scenario, &mut rows).await;
            }
            Scenario::Holds => holds_rows(&args, &transport, &ceiling_many, &mut rows).await,
            Scenario::Retention => {
                if args.target.is_some() {
                    eprintln!("bench: retention skipped (in-process deployment only)");
                    continue;
                }
                retention_rows::run(&args, &transport, &run_id, &mut rows).await;
            }
            Scenario::Flash | Scenario::FlashChurn => {
                let churn = scenario == Scenario::FlashChurn;
                flash_rows::run(&args, &transport, &run_id, &ceiling_many, churn, &mut rows).await;
            }
            Scenario::Waitlist => {
                flash_rows::run_waitlist(&args, &transport, &run_id, &ceiling_many, &mut rows).await
            }
        }
    }

    finish(&args, &transport, rows)
}

/// `ceiling-1`, `ceiling-N` and `ceiling-N-one-row`: the database alone.
async fn ceiling_rows(args: &BenchArgs, ceiling_many: &str, rows: &mut Vec<Row>) {
    for (conns, one_row) in [(1, false), (args.clients, false), (args.clients, true)] {
        let name = if one_row {
            format!("{ceiling_many}-one-row")
        } else {
            format!("ceiling-{conns}")
        };
        let before = xacts(&args.database_url).await;
        let progress = Arc::new(Progress::default());
        let ticker = scenarios::spawn_progress(name.clone(), progress.clone(), Some(args.duration));
        let result =
            scenarios::ceiling(&args.database_url, conns, args.duration, progress, one_row).await;
        ticker.abort();
        let after = xacts(&args.database_url).await;
        rows.push(row(name, conns, result, None, delta(before, after)));
    }
}

/// `holds-stock` and, with `--redis-url`, `holds-stock-redis`.
async fn holds_rows(
    args: &BenchArgs,
    transport: &Transport,
    ceiling_many: &str,
    rows: &mut Vec<Row>,
) {
    let mut kinds = vec![crate::participants::Kind::Stock];
    if args.redis_url.is_some() {
        kinds.push(crate::participants::Kind::StockRedis);
    } else {
        eprintln!("bench: holds-stock-redis skipped (no --redis-url)");
    }
    for kind in kinds {
        let name = format!("holds-{}", kind.name());
        let before = xacts(&args.database_url).await;
        let progress = Arc::new(Progress::default());
        let ticker = scenarios::spawn_progress(name.clone(), progress.clone(), Some(args.duration));
        let result = scenarios::holds(
            &args.database_url,
            transport,
            args.redis_url.as_deref(),
            kind,
            args.clients,
            args.duration,
            progress,
        )
        .await;
        ticker.abort();
        let after = xacts(&args.database_url).await;
        rows.push(row(
            name,
            args.clients,
            result,
            Some(ceiling_many.to_owned()),
            delta(before, after),
        ));
    }
}

/// Prints the table (and writes the JSON); a row that failed fails the run.
fn finish(args: &BenchArgs, transport: &Transport, rows: Vec<Row>) -> Result<(), BenchError> {
    print_table(&rows, transport);
    if let Some(line) = retention_rows::ratio(&rows) {
        println!("{line}");
    }
    for line in events::ratios(&rows) {
        println!("{line}");
    }
    if let Some(path) = &args.json {
        let doc = to_json(args, transport, &rows);
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| BenchError::Output(format!("encoding JSON: {e}")))?;
        std::fs::write(path, text)
            .map_err(|e| BenchError::Output(format!("{}: {e}", path.display())))?;
        eprintln!("bench: results written to {}", path.display());
    }
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.failure.is_some() || r.errors() > 0 || r.broke_conservation())
        .map(|r| r.name.clone())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(BenchError::Failed(failed))
    }
}

fn delta(before: Option<(i64, i64)>, after: Option<(i64, i64)>) -> Option<(i64, i64)> {
    let (b, a) = (before?, after?);
    Some((a.0 - b.0, a.1 - b.1))
}

/// The endpoints of the deployment at `--target` `url`.
fn target_endpoints(args: &BenchArgs, url: &str) -> deploy::Endpoints {
    deploy::Endpoints {
        coordinator: url.to_owned(),
        noop: if args.noop.is_empty() {
            vec!["noop".to_owned()]
        } else {
            args.noop.clone()
        },
        seats: ("seats".into(), args.seats_admin.clone()),
        stock: ("stock".into(), args.stock_admin.clone()),
        stock_redis: None,
    }
}

/// An in-process deployment for one row, with what must be cleaned up after it.
struct Started {
    deployment: deploy::Deployment,
    /// The stock-redis participant's Redis and key prefix, deleted after the row.
    redis_keys: Option<(String, String)>,
    /// The row's event sink, when `--events-nats-url` asks for one.
    events: Option<events::EventsRun>,
}

/// How a row's in-process deployment starts.
pub(super) struct RowSetup {
    /// With the stock-redis participant (`--redis-url`).
    pub stock_redis: bool,
    /// The coordinator's retention (off but for the `retention` rows).
    pub retention: Retention,
    /// On a fresh database ([`deploy::fresh_database`]); `false` only for rows that run on
    /// what their scenario seeded.
    pub fresh_database: bool,
}

impl RowSetup {
    /// A fresh database, no stock-redis, retention off: most rows.
    pub(super) fn fresh() -> RowSetup {
        RowSetup {
            stock_redis: false,
            retention: Retention::off(),
            fresh_database: true,
        }
    }
}

/// Starts the in-process deployment of row `name` (stock-redis, the event sink as asked).
async fn start_deployment(
    args: &BenchArgs,
    transport: &Transport,
    run_id: &str,
    name: &str,
    setup: RowSetup,
) -> Result<Started, String> {
    let RowSetup {
        stock_redis,
        retention,
        fresh_database,
    } = setup;
    let redis = match (stock_redis, &args.redis_url) {
        (false, _) => None,
        (true, Some(url)) => Some(deploy::stock_redis_settings(url)),
        (true, None) => return Err("stock-redis needs --redis-url".into()),
    };
    let redis_keys = redis
        .as_ref()
        .map(|s| (s.redis_url.clone(), s.key_prefix.clone()));
    if fresh_database {
        deploy::fresh_database(&args.database_url).await?;
    }
    let started = match events::EventsRun::for_row(args, run_id, name, fresh_database).await {
        Ok(events) => {
            let sinks = events.iter().filter_map(events::EventsRun::sink).collect();
            deploy::Deployment::start(
                &args.database_url,
                args.coordinator_pool,
                args.participant_pool,
                redis,
                transport,
                retention,
                sinks,
            )
            .await
            .map(|deployment| (deployment, events))
        }
        Err(e) => Err(e),
    };
    match started {
        Ok((deployment, events)) => Ok(Started {
            deployment,
            redis_keys,
            events,
        }),
        Err(e) => {
            delete_redis_keys(redis_keys).await;
            Err(format!("starting the deployment: {e}"))
        }
    }
}

/// Starts the row's in-process deployment as `setup` says ([`start_deployment`]: stock-redis's
/// keys deleted afterwards, a NATS sink for a `-nats` row) or uses the target, runs `body` (its
/// clients also over `transport`), stops the deployment and counts the database transactions it
/// took.
async fn with_deployment<F, Fut>(
    args: &BenchArgs,
    transport: &Transport,
    run_id: &str,
    name: &str,
    setup: RowSetup,
    body: F,
) -> (Result<Measured, String>, Option<(i64, i64)>)
where
    F: FnOnce(Arc<Ctx>, Arc<Progress>) -> Fut,
    Fut: std::future::Future<Output = Result<Measured, String>>,
{
    let (endpoints, deployment, redis_keys, events) = match &args.target {
        Some(url) => (target_endpoints(args, url), None, None, None),
        None => match start_deployment(args, transport, run_id, name, setup).await {
            Ok(started) => {
                let Started {
                    deployment,
                    redis_keys,
                    events,
                } = started;
                (
                    deployment.endpoints.clone(),
                    Some(deployment),
                    redis_keys,
                    events,
                )
            }
            Err(e) => return (Err(e), None),
        },
    };
    let (before, meter) = if deployment.is_some() {
        let meter = cpu::CpuMeter::start(&args.database_url).await;
        (xacts(&args.database_url).await, meter)
    } else {
        (None, None)
    };
    let ctx = Arc::new(Ctx {
        endpoints,
        transport: transport.clone(),
        run_id: format!("{run_id}-{name}"),
        seat_block: args.seat_block.max(1),
    });
    let progress = Arc::new(Progress::default());
    let planned = (!is_flash(name)).then_some(args.duration);
    let ticker = scenarios::spawn_progress(name.to_owned(), progress.clone(), planned);
    let mut result = body(ctx, progress).await;
    ticker.abort();
    if let (Ok(m), Some((_, prefix))) = (&mut result, &redis_keys)
        && let Some(extra) = m.extra.as_object_mut()
    {
        extra.insert("redis_key_prefix".into(), prefix.clone().into());
    }
    if let (Ok(m), Some(run)) = (&mut result, &events) {
        run.report(m).await;
    }
    if let (Ok(m), Some(meter)) = (&mut result, meter) {
        meter.record(m).await;
    }
    let mut counted = None;
    if let Some(run) = &events {
        run.release();
    }
    if let Some(d) = deployment {
        d.stop().await;
        counted = delta(before, xacts(&args.database_url).await);
    }
    if let Some(run) = events {
        run.finish().await;
    }
    delete_redis_keys(redis_keys).await;
    (result, counted)
}

/// Deletes the keys of a bench stock-redis participant (`(redis_url, key prefix)`), if any.
async fn delete_redis_keys(keys: Option<(String, String)>) {
    if let Some((url, prefix)) = keys
        && let Err(e) = deploy::delete_redis_keys(&url, &prefix).await
    {
        eprintln!("bench: {e}");
    }
}

fn redact(url: &str) -> &str {
    url.rsplit('@').next().unwrap_or(url)
}
