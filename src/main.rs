//! The `holdfast` binary: parses the command line and runs one role.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use holdfast::app::{self, AppError, CoordinatorSettings};
use holdfast::config::CoordinatorArgs;
use holdfast::store::PgStore;

/// holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the coordinator (tcc.v1.Coordinator) against PostgreSQL.
    Coordinator(CoordinatorArgs),
    /// Apply the coordinator's database migrations and exit.
    Migrate {
        /// PostgreSQL URL of the coordinator's database.
        #[arg(
            long,
            env = "DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/holdfast"
        )]
        database_url: String,
    },
}

async fn run(cli: Cli) -> Result<(), AppError> {
    match cli.command {
        Command::Coordinator(args) => {
            let settings = CoordinatorSettings {
                participants: args.endpoints(),
                limits: args.limits().map_err(AppError::Config)?,
                policy: args.policy().map_err(AppError::Config)?,
            };
            app::ensure_database(&args.database_url).await?;
            let store = PgStore::connect(&args.database_url, args.db_pool_size).await?;
            let listener = tokio::net::TcpListener::bind(args.listen).await?;
            app::serve_coordinator(
                settings,
                store,
                listener,
                holdfast::server::shutdown_signal(),
            )
            .await
        }
        Command::Migrate { database_url } => {
            app::ensure_database(&database_url).await?;
            PgStore::connect(&database_url, 1).await?.migrate().await?;
            tracing::info!("migrations applied");
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    holdfast::telemetry::init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("holdfast: {e}");
            ExitCode::FAILURE
        }
    }
}
