//! The `holdfast` binary: parses the command line and runs one role.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use holdfast::app::{self, AppError};
use holdfast::config::{CoordinatorArgs, ParticipantArgs};

/// mimalloc in place of glibc's malloc, whose malloc/free/consolidation took about a quarter of
/// an event sink's CPU in this process; holdfast's CPU per Reserve+Confirm is 12-13 % lower
/// with it (BENCHMARKS.md "An event's cost"). The libraries leave the allocator to the program
/// that embeds them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    // Boxed: its settings are far larger than the other commands'.
    Coordinator(Box<CoordinatorArgs>),
    /// Run one reference participant (tcc.v1.Participant + tcc.v1.ResourceAdmin).
    Participant(ParticipantArgs),
    /// Run benchmark scenarios (ceiling, latency, throughput, flash, holds); see BENCHMARKS.md.
    Bench(holdfast::bench::BenchArgs),
    /// Check any tcc.v1.Participant (any language) from outside against the participant's
    /// rules: repeats, disorder, capacity, deadlines, bad input. A table (or --json); exit 1
    /// on a failure.
    ParticipantCheck(holdfast::participant_check::CheckArgs),
    /// Make credentials: an API key and its principals-file entry, or a token secret.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// The command line of a running coordinator: get, list, watch, admin (SPEC 8.2).
    #[command(flatten)]
    Cli(holdfast::cli::Command),
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

#[derive(Subcommand, Debug)]
enum KeysCommand {
    /// Print a fresh API key (256 random bits) and the [[principal]] entry for --auth-keys
    /// that admits it (the file keeps only the key's SHA-256). Give the key to the caller.
    New {
        /// The principal's name (it owns the reservations it makes).
        name: String,
        /// A role: client, admin or coordinator (repeatable).
        #[arg(long = "role", required = true, value_parser = parse_role)]
        roles: Vec<holdfast::auth::Role>,
    },
    /// Print a --token-secret-file with one fresh key (to rotate: add its [[key]] to the
    /// existing file and make it `current`).
    TokenSecret {
        /// The key's id.
        #[arg(long, default_value = "k1")]
        id: String,
    },
}

fn parse_role(s: &str) -> Result<holdfast::auth::Role, String> {
    holdfast::auth::Role::parse(s)
}

/// Prints what `keys` makes.
fn keys(command: KeysCommand) -> Result<(), AppError> {
    let random = |e: getrandom::Error| AppError::Config(format!("no randomness: {e}"));
    match command {
        KeysCommand::New { name, roles } => {
            let key = holdfast::auth::keys::new_key().map_err(random)?;
            let entry = holdfast::auth::keys::principal_entry(&name, &roles, &key);
            // The same parser as --auth-keys: what it would refuse is refused here.
            holdfast::auth::Principals::parse(&entry)
                .map_err(|e| AppError::Config(format!("name {name:?}: {e}")))?;
            println!("# API key of {name:?} (give it to the caller; it is not stored anywhere):");
            println!("# {key}");
            println!("# Add to the --auth-keys file:");
            print!("{entry}");
        }
        KeysCommand::TokenSecret { id } => {
            print!(
                "{}",
                holdfast::auth::keys::token_secret(&id).map_err(random)?
            );
        }
    }
    Ok(())
}

/// Why a command failed: a role's error, or the benchmark's.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    App(#[from] AppError),
    #[error(transparent)]
    Bench(#[from] holdfast::bench::BenchError),
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let shutdown = holdfast::server::shutdown_signal();
    let Some(command) = cli.command else {
        // All-in-one: the coordinator's defaults, every reference participant beside it.
        let args = cli.all_in_one;
        if args.print_config {
            print!("{}", args.describe());
            return Ok(());
        }
        return Ok(app::run_all_in_one(args, shutdown).await?);
    };
    match command {
        Command::Coordinator(args) if args.print_config => {
            print!("{}", args.describe());
            Ok(())
        }
        Command::Coordinator(args) => Ok(app::run_coordinator(*args, shutdown).await?),
        Command::Participant(args) => Ok(app::serve_participant(args, shutdown).await?),
        Command::Bench(args) => Ok(holdfast::bench::run(args).await?),
        Command::Migrate { database_url } => Ok(app::migrate(&database_url).await?),
        Command::Keys(command) => Ok(keys(command)?),
        // Answered in main: the CLI prints its own errors and chooses its exit code.
        Command::Cli(_) | Command::ParticipantCheck(_) => Ok(()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    holdfast::telemetry::init();
    // One rustls crypto provider (ring) for the whole process, before any library builds TLS.
    holdfast::tls::crypto_provider();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli_command = holdfast::config::plain_help(Cli::command());
    let (command, extras) = match holdfast::config::apply_config_file(cli_command, &argv) {
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
    if let Some(Command::Cli(command)) = cli.command {
        return holdfast::cli::run(command).await;
    }
    if let Some(Command::ParticipantCheck(args)) = cli.command {
        return holdfast::participant_check::run(args).await;
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
