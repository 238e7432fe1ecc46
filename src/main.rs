//! The `holdfast` binary: parses the command line and runs one role.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use holdfast::app::{self, AppError, CoordinatorSettings};
use holdfast::config::{CoordinatorArgs, ParticipantArgs};
use holdfast::store::AnyStore;

/// holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
///
/// With no subcommand, runs everything in one process: the coordinator on 127.0.0.1:50051 and
/// the reference participants on 50061-50065, all registered, on SQLite files under ./data
/// (one holdfast per folder), or on PostgreSQL when DATABASE_URL / --database-url is postgres://.
#[derive(Parser, Debug)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// All-in-one settings (the coordinator's options; participants are added on 5006x).
    #[command(flatten)]
    all_in_one: CoordinatorArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the coordinator (tcc.v1.Coordinator) against PostgreSQL or SQLite (by the
    /// --database-url scheme: postgres://... or sqlite://path/to/file.db).
    Coordinator(CoordinatorArgs),
    /// Run one reference participant (tcc.v1.Participant + tcc.v1.ResourceAdmin).
    Participant(ParticipantArgs),
    /// Run benchmark scenarios (ceiling, latency, throughput, flash, holds); see BENCHMARKS.md.
    Bench(holdfast::bench::BenchArgs),
    /// Apply the coordinator's database migrations and exit.
    Migrate {
        /// URL of the coordinator's database: postgres://... or sqlite://path/to/file.db.
        #[arg(
            long,
            env = "DATABASE_URL",
            default_value = holdfast::config::DEFAULT_DATABASE_URL
        )]
        database_url: String,
    },
}

/// Serves /metrics in the background when configured.
async fn start_metrics(addr: Option<std::net::SocketAddr>) -> Result<(), AppError> {
    if let Some(addr) = addr {
        // Install the recorder before anything is counted.
        holdfast::telemetry::metrics_handle();
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            AppError::Config(format!(
                "metrics cannot listen on {addr}: {e} (--metrics-listen)"
            ))
        })?;
        tracing::info!(%addr, "metrics on /metrics");
        tokio::spawn(holdfast::telemetry::serve_metrics(
            listener,
            std::future::pending(),
        ));
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<(), AppError> {
    let Some(command) = cli.command else {
        // All-in-one: the coordinator's defaults, every reference participant beside it.
        let args = cli.all_in_one;
        if args.print_config {
            print!("{}", args.describe());
            return Ok(());
        }
        let url = args.database_url.clone();
        // One writer per data folder, taken before anything binds a port.
        let _lock = app::lock_data_dir(&url)?;
        start_metrics(args.metrics_listen).await?;
        return app::serve_all_in_one(&url, args, holdfast::server::shutdown_signal()).await;
    };
    match command {
        Command::Participant(args) => {
            let listen = args.listen.unwrap_or_else(|| {
                std::net::SocketAddr::from((
                    [127, 0, 0, 1],
                    holdfast::config::default_participant_port(args.kind),
                ))
            });
            let pool: holdfast::participants::ParticipantDb =
                match holdfast::db::DatabaseKind::of_url(&args.database_url)? {
                    holdfast::db::DatabaseKind::Postgres => {
                        holdfast::db::connect_postgres(&args.database_url, args.db_pool_size)
                            .await?
                            .into()
                    }
                    holdfast::db::DatabaseKind::Sqlite => {
                        holdfast::db::open_sqlite(&args.database_url, args.db_pool_size)
                            .await?
                            .into()
                    }
                };
            let listener = tokio::net::TcpListener::bind(listen).await?;
            tracing::info!(kind = args.kind.name(), %listen, "participant serving");
            if args.kind == holdfast::participants::Kind::StockRedis {
                use holdfast::participants::stock_redis;
                let url = args.redis_url.clone().ok_or_else(|| {
                    AppError::Config(
                        holdfast::participants::ParticipantError::NeedsRedis.to_string(),
                    )
                })?;
                let holdfast::participants::ParticipantDb::Postgres(pool) = pool else {
                    return Err(AppError::Config(
                        holdfast::participants::ParticipantError::NeedsPostgres.to_string(),
                    ));
                };
                let mut settings = stock_redis::StockRedisSettings::new(url);
                settings.key_prefix = args.redis_prefix.clone();
                settings.orphan_grace = args.orphan_grace;
                settings.retention = args.redis_retention;
                return stock_redis::serve(
                    settings,
                    pool,
                    listener,
                    holdfast::server::shutdown_signal(),
                )
                .await
                .map_err(|e| AppError::Config(e.to_string()));
            }
            holdfast::participants::serve(
                holdfast::participants::ParticipantSettings {
                    kind: args.kind,
                    orphan_grace: args.orphan_grace,
                },
                pool,
                listener,
                holdfast::server::shutdown_signal(),
            )
            .await
            .map_err(|e| AppError::Config(e.to_string()))
        }
        Command::Coordinator(args) if args.print_config => {
            print!("{}", args.describe());
            Ok(())
        }
        Command::Coordinator(args) => {
            let settings = CoordinatorSettings {
                participants: args.endpoints(),
                limits: args.limits().map_err(AppError::Config)?,
                policy: args.policy().map_err(AppError::Config)?,
                server: args.server_limits(),
            };
            holdfast::db::ensure_database(&args.database_url).await?;
            start_metrics(args.metrics_listen).await?;
            let store = AnyStore::connect(&args.database_url, args.db_pool_size).await?;
            let listener = tokio::net::TcpListener::bind(args.listen).await?;
            app::serve_coordinator(
                settings,
                store,
                listener,
                holdfast::server::shutdown_signal(),
            )
            .await
        }
        Command::Bench(args) => holdfast::bench::run(args).await.map_err(AppError::Config),
        Command::Migrate { database_url } => {
            holdfast::db::ensure_database(&database_url).await?;
            AnyStore::connect(&database_url, 1).await?.migrate().await?;
            tracing::info!("migrations applied");
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    holdfast::telemetry::init();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (command, extras) = match holdfast::config::apply_config_file(Cli::command(), &argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = command.get_matches_from(argv);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.all_in_one.participant_timeouts = extras.participant_timeouts.clone();
    if let Some(Command::Coordinator(args)) = &mut cli.command {
        args.participant_timeouts = extras.participant_timeouts;
    }
    let result = run(cli).await;
    holdfast::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("holdfast: {e}");
            ExitCode::FAILURE
        }
    }
}
