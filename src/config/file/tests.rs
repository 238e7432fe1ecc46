//! The config file's sections against the flags they set: every key a flag, refusals naming
//! the key, and a flag beating the file beating the default for each kind of setting (the
//! environment's place between them is shown by the binary's own test, `process/config.rs`).

use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use super::*;
use crate::config::{CoordinatorArgs, ParticipantArgs};

/// The roles' settings as `main.rs` lays them out: the all-in-one at the top, the roles below.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    all_in_one: CoordinatorArgs,
}

#[derive(Subcommand)]
enum Role {
    Coordinator(Box<CoordinatorArgs>),
    Participant(Box<ParticipantArgs>),
}

/// The flags of `role` (the top level with `None`) a file may set.
fn flags(role: Option<&str>) -> Vec<String> {
    let cmd = Cli::command();
    let cmd = match role {
        Some(role) => cmd.find_subcommand(role).cloned().unwrap_or_default(),
        None => cmd,
    };
    let mut ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .filter(|id| !matches!(id.as_str(), "config" | "help" | "print_config"))
        .collect();
    ids.sort();
    ids
}

fn sorted(keys: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    keys.sort();
    keys
}

/// The file's error, or a panic if it was accepted.
fn refusal(text: &str) -> String {
    match read(text) {
        Ok(_) => panic!("{text:?} was accepted"),
        Err(e) => e,
    }
}

/// `argv` parsed with `text` as the config file.
fn parse(text: &str, argv: &[&str]) -> Cli {
    let file = read(text).unwrap_or_else(|e| panic!("{text:?}{e}"));
    let (cmd, extras) = file.apply(Cli::command());
    let matches = cmd
        .try_get_matches_from(std::iter::once("holdfast").chain(argv.iter().copied()))
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| panic!("{e}"));
    cli.all_in_one.participant_timeouts = extras.participant_timeouts;
    cli
}

#[test]
fn every_key_is_a_flag_of_its_role_and_every_flag_a_key() {
    let mut top = sorted(CoordinatorSection::KEYS);
    top.push("participants".into());
    top.sort();
    assert_eq!(top, flags(None));
    assert_eq!(top, flags(Some("coordinator")));
    assert_eq!(sorted(ParticipantSection::KEYS), flags(Some("participant")));
}

#[test]
fn an_unknown_key_is_refused_naming_it() {
    for (text, named) in [
        (
            "max_ttl = \"5m\"\nmax_tll = \"5m\"",
            "line 2: unknown setting `max_tll`",
        ),
        (
            "[participant]\norphan_grase = \"1h\"",
            "unknown setting `participant.orphan_grase`",
        ),
        (
            "[participants]\nstock = { url = \"http://s:1\", timeot = \"1s\" }",
            "unknown setting `participants.stock.timeot`",
        ),
        // A coordinator's key is not a participant's.
        (
            "[participant]\nmax_ttl = \"1h\"",
            "unknown setting `participant.max_ttl`",
        ),
    ] {
        let err = refusal(text);
        assert!(err.contains(named), "{text:?}: {err}");
        assert!(err.contains("expected"), "the known keys are listed: {err}");
    }
}

#[test]
fn a_wrong_type_is_refused_naming_the_key() {
    for (text, named) in [
        (
            "max_extensions = \"4\"",
            "`max_extensions`: invalid type: string \"4\", expected i32",
        ),
        (
            "max_ttl = 5",
            "`max_ttl`: invalid type: integer `5`, expected a string",
        ),
        (
            "insecure_no_auth = \"yes\"",
            "`insecure_no_auth`: invalid type: string",
        ),
        (
            "http_allowed_hosts = [1]",
            "`http_allowed_hosts`: expected a string or a list",
        ),
        (
            "[participant]\ndb_pool_size = -1",
            "line 2: `participant.db_pool_size`",
        ),
        ("participant = 3", "`participant`: invalid type"),
        (
            "[participants]\nseats = 42",
            "`participants.seats`: invalid type: integer `42`, expected a URL or a table",
        ),
        (
            "[participants]\nseats = { timeout = \"1s\" }",
            "`participants.seats`: missing field `url`",
        ),
        (
            "[participants]\nseats = { url = \"http://s:1\", timeout = \"5x\" }",
            "`participants.seats.timeout`: \"5x\" has unknown unit",
        ),
    ] {
        let err = refusal(text);
        assert!(err.contains(named), "{text:?}: {err}");
    }
    assert!(refusal("max_ttl = ").contains(": not valid TOML"));
}

/// One setting of each kind, from the file alone, and beaten by its flag.
const EACH_KIND: &str = r#"
redis_prefix = "file:"
sold_out_hint = "3s"
max_watches = 7
allow_plaintext_participants = true
http_allowed_hosts = ["file.example", "file2.example"]
[participants]
seats = "http://127.0.0.1:50061"
stock = { url = "http://127.0.0.1:50062", timeout = "1s" }
[participant]
orphan_grace = "2h"
"#;

#[test]
fn the_file_beats_the_defaults_for_every_kind_of_setting() {
    for argv in [&[][..], &["coordinator"][..]] {
        let cli = parse(EACH_KIND, argv);
        let args = match cli.role {
            Some(Role::Coordinator(args)) => *args,
            _ => cli.all_in_one,
        };
        assert_eq!(args.redis_prefix, "file:");
        assert_eq!(args.sold_out_hint, Duration::from_secs(3));
        assert_eq!(args.watch.max_watches, 7);
        assert!(args.participant_tls.allow_plaintext_participants);
        assert_eq!(
            args.http.http_allowed_hosts,
            ["file.example", "file2.example"]
        );
        // Untouched by the file: the default.
        assert_eq!(args.max_extensions, 1);
        let names: Vec<&str> = args.participants.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["seats", "stock"]);
    }
    let cli = parse(EACH_KIND, &[]);
    let endpoints = cli.all_in_one.endpoints();
    assert_eq!(
        endpoints[0].timeout,
        Duration::from_secs(5),
        "seats: the default"
    );
    assert_eq!(
        endpoints[1].timeout,
        Duration::from_secs(1),
        "stock: its own"
    );
    let Some(Role::Participant(p)) = parse(EACH_KIND, &["participant", "seats"]).role else {
        panic!("not a participant");
    };
    assert_eq!(p.orphan_grace, Duration::from_secs(7200));
}

#[test]
fn a_flag_beats_the_file_for_every_kind_of_setting() {
    let flags = [
        "coordinator",
        "--redis-prefix",
        "flag:",
        "--sold-out-hint",
        "250ms",
        "--max-watches",
        "9",
        "--allow-plaintext-participants",
        "--http-allowed-host",
        "flag.example",
        "--participant",
        "rooms=http://127.0.0.1:50063",
    ];
    let Some(Role::Coordinator(args)) = parse(EACH_KIND, &flags).role else {
        panic!("not the coordinator");
    };
    assert_eq!(args.redis_prefix, "flag:");
    assert_eq!(args.sold_out_hint, Duration::from_millis(250));
    assert_eq!(args.watch.max_watches, 9);
    assert!(args.participant_tls.allow_plaintext_participants);
    assert_eq!(args.http.http_allowed_hosts, ["flag.example"]);
    assert_eq!(
        args.participants,
        [("rooms".to_owned(), "http://127.0.0.1:50063".to_owned())]
    );
    // A bool flag can only say yes: a file's `true` stays unless the environment says no.
    let cli = parse(
        "allow_plaintext_participants = false",
        &["--allow-plaintext-participants"],
    );
    assert!(cli.all_in_one.participant_tls.allow_plaintext_participants);
}

#[test]
fn a_bad_value_in_the_file_is_refused_by_its_flags_parser() {
    let file = read("max_ttl = \"5 parsecs\"").unwrap_or_else(|e| panic!("{e}"));
    let (cmd, _) = file.apply(Cli::command());
    let err = cmd
        .try_get_matches_from(["holdfast", "coordinator"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("--max-ttl") && err.contains("unknown unit"),
        "{err}"
    );
}
