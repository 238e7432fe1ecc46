//! Settings as the binary reads them: flags beat `HOLDFAST_*` environment variables, which beat
//! the TOML file, which beats the defaults (shown by `--print-config`, secrets masked); a bad
//! setting fails at start, naming it.

use super::run_holdfast;

#[test]
fn settings_come_from_flags_then_env_then_file_then_defaults() {
    let file = std::env::temp_dir().join(format!("holdfast-cfg-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        r#"
max_ttl = "30m"
default_ttl = "5m"
participant_timeout = "3s"
max_extensions = 4
redis_url = "redis://:hunter2@cache:6379/0"
redis_retention = "48h"
redis_prefix = "hf:shop-a:"
idle_timeout = "2m"
[participants]
seats = "http://127.0.0.1:50061"
stock = { url = "http://127.0.0.1:50062", timeout = "1s" }
"#,
    )
    .unwrap();
    let out = run_holdfast(
        &[
            "coordinator",
            "--print-config",
            "--default-ttl",
            "7m",
            "--header-timeout",
            "3s",
        ],
        &[
            ("HOLDFAST_CONFIG", file.to_str().unwrap()),
            ("HOLDFAST_MAX_CONNECTIONS", "500"),
            ("HOLDFAST_MAX_TTL", "2h"),
            ("DATABASE_URL", "postgres://app:s3cret@db:5432/holdfast"),
        ],
    );
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in [
        "default_ttl = \"7m\"",            // flag beats everything
        "max_ttl = \"2h\"",                // env beats the file
        "max_extensions = 4",              // file beats the default
        "participant_timeout = \"3s\"",    // file
        "max_active_holds_per_holder = 5", // default
        "seats = { url = \"http://127.0.0.1:50061\", timeout = \"3s\" }",
        "stock = { url = \"http://127.0.0.1:50062\", timeout = \"1s\" }",
        "database_url = \"postgres://app:***@db:5432/holdfast\"", // never print a password
        "redis_url = \"redis://:***@cache:6379/0\"",              // file, masked too
        "redis_retention = \"48h\"",                              // file
        "redis_prefix = \"hf:shop-a:\"",                          // file
        "header_timeout = \"3s\"",                                // flag
        "idle_timeout = \"2m\"",                                  // file
        "max_connections = 500",                                  // env
        "max_watches_per_principal = 256",                        // default
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "{line:?} not in:\n{printed}"
        );
    }
    assert!(!printed.contains("hunter2"), "{printed}");
    // From its env var; the all-in-one (no subcommand) prints it as well.
    let out = run_holdfast(
        &["--print-config"],
        &[("HOLDFAST_REDIS_URL", "redis://127.0.0.1:6380")],
    );
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l == "redis_url = \"redis://127.0.0.1:6380\""),
        "{printed}"
    );
    assert!(
        printed.lines().any(|l| l == "redis_retention = \"168h\""),
        "default 7 days: {printed}"
    );
    // Unset, it is named as such (a comment: the printed settings stay valid TOML).
    let out = run_holdfast(&["coordinator", "--print-config"], &[]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("# redis_url: not set")),
        "{printed}"
    );
    assert!(printed.parse::<toml::Table>().is_ok(), "{printed}");
}

/// One setting of each kind (string, duration, number, bool, list): the file's value, then the
/// environment's over it, then the flag's over both.
#[test]
fn each_kind_of_setting_takes_the_flag_then_the_env_then_the_file() {
    let file = std::env::temp_dir().join(format!("holdfast-kinds-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        r#"
redis_prefix = "file:"
sold_out_hint = "3s"
max_watches = 7
allow_plaintext_participants = true
http_allowed_hosts = ["file.example", "file2.example"]
"#,
    )
    .unwrap();
    let config = ("HOLDFAST_CONFIG", file.to_str().unwrap());
    let env = [
        config,
        ("HOLDFAST_REDIS_PREFIX", "env:"),
        ("HOLDFAST_SOLD_OUT_HINT", "2s"),
        ("HOLDFAST_MAX_WATCHES", "8"),
        ("HOLDFAST_ALLOW_PLAINTEXT_PARTICIPANTS", "false"),
        ("HOLDFAST_HTTP_ALLOWED_HOSTS", "env.example"),
    ];
    let flags = [
        "--redis-prefix",
        "flag:",
        "--sold-out-hint",
        "1s",
        "--max-watches",
        "9",
        "--allow-plaintext-participants",
        "--http-allowed-host",
        "flag.example",
    ];
    let printed = |flags: &[&str], env: &[(&str, &str)]| {
        let args = [&["coordinator", "--print-config"][..], flags].concat();
        let out = run_holdfast(&args, env);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let from_file = printed(&[], &[config]);
    let from_env = printed(&[], &env);
    let from_flags = printed(&flags, &env);
    let _ = std::fs::remove_file(&file);
    for (printed, lines) in [
        (
            &from_file,
            [
                "redis_prefix = \"file:\"",
                "sold_out_hint = \"3s\"",
                "max_watches = 7",
                "allow_plaintext_participants = true",
                "http_allowed_hosts = [\"file.example\", \"file2.example\"]",
            ],
        ),
        (
            &from_env,
            [
                "redis_prefix = \"env:\"",
                "sold_out_hint = \"2s\"",
                "max_watches = 8",
                "allow_plaintext_participants = false",
                "http_allowed_hosts = [\"env.example\"]",
            ],
        ),
        (
            &from_flags,
            [
                "redis_prefix = \"flag:\"",
                "sold_out_hint = \"1s\"",
                "max_watches = 9",
                "allow_plaintext_participants = true",
                "http_allowed_hosts = [\"flag.example\"]",
            ],
        ),
    ] {
        for line in lines {
            assert!(
                printed.lines().any(|l| l == line),
                "{line:?} not in:\n{printed}"
            );
        }
    }
}

#[test]
fn a_bad_config_fails_at_start_naming_the_setting() {
    let file = std::env::temp_dir().join(format!("holdfast-bad-{}.toml", std::process::id()));
    for (content, expected) in [
        ("max_tll = \"5m\"", "unknown setting `max_tll`"),
        ("max_ttl = \"5 parsecs\"", "--max-ttl"),
        ("[participants]\nseats = 42", "participants.seats"),
        ("max_ttl = ", "not valid TOML"),
        ("max_extensions = \"4\"", "`max_extensions`: invalid type"),
        (
            "[participant]\norphan_grase = \"1h\"",
            "unknown setting `participant.orphan_grase`",
        ),
    ] {
        std::fs::write(&file, content).unwrap();
        let out = run_holdfast(
            &[
                "coordinator",
                "--config",
                file.to_str().unwrap(),
                "--print-config",
            ],
            &[],
        );
        assert!(!out.status.success(), "{content:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{content:?}: {err}");
    }
    let _ = std::fs::remove_file(&file);
    // A bad flag or env value names its setting too.
    let out = run_holdfast(
        &["coordinator", "--print-config"],
        &[("HOLDFAST_LEASE", "soon")],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lease"));
}

#[test]
fn a_participant_that_cannot_start_says_which_and_why() {
    let dir = std::env::temp_dir().join(format!("holdfast-participant-{}", std::process::id()));
    let url = format!("sqlite://{}", dir.join("participants.db").display());
    let out = run_holdfast(
        &[
            "participant",
            "stock-redis",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &url,
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The error keeps its kind: which participant, and the participant's own reason (not a
    // generic "configuration" error).
    assert!(
        err.contains(
            "holdfast: participant stock-redis: the stock-redis participant needs a Redis URL"
        ),
        "{err}"
    );
    assert!(!err.contains("configuration:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without `--auth-keys` a server listens on loopback only: a non-loopback address is refused
/// at start, naming the way out, for the coordinator, a participant and the all-in-one;
/// `--insecure-no-auth` is the explicit opt-out (checked here up to the database, which this
/// test gives none).
#[test]
fn a_non_loopback_listen_without_keys_refuses_to_start() {
    let db = ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    for args in [
        &["coordinator", "--listen", "0.0.0.0:0"][..],
        &["participant", "seats", "--listen", "0.0.0.0:0"][..],
        &["--listen", "0.0.0.0:0"][..],
        // The metrics listener too.
        &[
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "0.0.0.0:0",
        ][..],
        &[
            "participant",
            "seats",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "0.0.0.0:0",
        ][..],
        &["--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"][..],
    ] {
        let out = run_holdfast(args, &[db]);
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("without authentication") && err.contains("--auth-keys"),
            "{args:?}: {err}"
        );
    }
    let out = run_holdfast(
        &["coordinator", "--listen", "0.0.0.0:0", "--insecure-no-auth"],
        &[db],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("without authentication"), "{err}");
}

/// On PostgreSQL a coordinator (and the all-in-one) without `--token-secret-file` refuses to
/// start, naming it and `--ephemeral-token-secret`, before it opens anything: a key of one
/// process would answer a Reserve repeated at another replica, or after a restart, without
/// its token. With the flag it goes on (here to the database, which this test gives none).
#[test]
fn on_postgres_a_coordinator_needs_a_token_secret_file() {
    let db = ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    let off = ["--metrics-listen", "off", "--http-listen", "off"];
    for role in [&["coordinator"][..], &[][..]] {
        let args: Vec<&str> = [role, &["--listen", "127.0.0.1:0"][..], &off[..]].concat();
        let out = run_holdfast(&args, &[db]);
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--token-secret-file") && err.contains("--ephemeral-token-secret"),
            "{args:?}: {err}"
        );
        let out = run_holdfast(&args, &[db, ("HOLDFAST_EPHEMERAL_TOKEN_SECRET", "true")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("--token-secret-file"), "{args:?}: {err}");
    }
}

/// `holdfast keys new` prints a key and the entry that admits it (never the key in the entry);
/// a name the principals file could not hold is refused.
#[test]
fn keys_new_prints_a_key_and_the_entry_that_admits_it() {
    let out = run_holdfast(&["keys", "new", "order-service", "--role", "client"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let key = printed
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .find(|l| l.len() == 64 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .expect("the key")
        .to_owned();
    let entry: String = printed
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!entry.contains(&key), "{entry}");
    let principals = holdfast::auth::Principals::parse(&entry).unwrap();
    let caller = principals.by_key(&key).expect("the entry admits the key");
    assert_eq!(caller.principal(), "order-service");
    assert!(caller.has(holdfast::auth::Role::Client));
    let bad = run_holdfast(&["keys", "new", "x", "--role", "root"], &[]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown role"));
}
