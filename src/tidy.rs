//! The house rules of `ARCHITECTURE.md`, checked on every `cargo test`: which module may use
//! which (the layers point one way), how long a source file and a function may grow
//! (`fn_length.rs`), that a public item is used outside its crate (`unused_pub.rs`), and that
//! the published crates' READMEs quote their examples as they are (`readmes.rs`). Test-only.

mod fn_length;
mod readmes;
mod unused_pub;
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each module of a crate may use of that crate besides itself, per crate (its folder
/// from the repository root). A module missing here is wiring and may use anything of its
/// crate: `serving` in the coordinator crate; `app`, `config`, `bench`, `main`, `lib` in the
/// binary's. Which crate may use which is cargo's to check (each crate's manifest names only
/// the crates before it in the workspace's layer order); `auth`, `conn`, `db`, `server`, `tls`,
/// `watched` and `participant` are `holdfast-serve` and `holdfast-participant` re-exported, and
/// the binary's `api`, `coordinator`, `domain`, `proto`, `registry`, `store`, `telemetry`,
/// `testing` and `participants` are the crates below re-exported: the rules still name them.
const LAYERS: &[(&str, Rules)] = &[("crates/holdfast-coordinator", COORDINATOR), ("", BINARY)];

/// Each module of a crate, and what it may use of that crate besides itself.
type Rules = &'static [(&'static str, &'static [&'static str])];

/// The coordinator crate's modules.
const COORDINATOR: Rules = &[
    ("domain", &[]),
    ("proto", &[]),
    ("telemetry", &["auth", "conn", "domain", "tls"]),
    ("store", &["db", "domain"]),
    ("events", &["background", "domain", "store", "telemetry"]),
    ("registry", &["domain", "proto", "telemetry", "tls"]),
    (
        "coordinator",
        &[
            "background",
            "domain",
            "events",
            "registry",
            "store",
            "telemetry",
        ],
    ),
    (
        "api",
        &[
            "auth",
            "coordinator",
            "domain",
            "proto",
            "telemetry",
            "testing",
        ],
    ),
    ("testing", &["coordinator", "db", "participant", "store"]),
];

/// The binary crate's modules.
const BINARY: Rules = &[
    ("cli", &["auth", "config", "json", "proto", "tls"]),
    ("json", &["proto"]),
    (
        "sinks",
        &[
            "api",
            "background",
            "coordinator",
            "events",
            "json",
            "proto",
            "store",
            "telemetry",
            "tls",
        ],
    ),
    (
        "participant_check",
        &["auth", "config", "json", "proto", "tls"],
    ),
    (
        "http",
        &[
            "auth",
            "conn",
            "json",
            "proto",
            "server",
            "telemetry",
            "tls",
        ],
    ),
];

/// What the reference participants (`crates/holdfast-participants`) may use of the coordinator
/// crate, which their manifest names for these only: its metrics, the test clock and the
/// generated code it re-exports; never its store, domain, registry or coordinator.
const PARTICIPANTS_USE_OF_COORDINATOR: &[&str] = &["proto", "telemetry", "testing"];

/// No source file grows past this many lines (generated code is not under `src/`).
const MAX_LINES: usize = 600;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src_files() -> Vec<(String, String)> {
    crate_src("")
}

/// The sources under `src/` of the crate in `dir` (from the repository root; `""`: the root's).
fn crate_src(dir: &str) -> Vec<(String, String)> {
    files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join("src"))
}

/// The workspace's library crates' sources, named from the repository root.
fn crate_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Ok(crates) = std::fs::read_dir(root.join("crates")) else {
        return Vec::new();
    };
    let mut all = Vec::new();
    for krate in crates.flatten() {
        let name = krate.file_name().to_string_lossy().into_owned();
        for (rel, text) in files_under(&krate.path().join("src")) {
            all.push((format!("crates/{name}/src/{rel}"), text));
        }
    }
    all
}

fn files_under(src: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(src)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            (rel, text)
        })
        .collect()
}

/// The top-level module a file under `src/` belongs to (`store` for `store/postgres/mod.rs`).
fn module_of(rel: &str) -> &str {
    let first = rel.split('/').next().unwrap_or(rel);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The crate modules a file's code (comments aside) names: `crate::x`, and `db` for the
/// SQLite clock macro it defines.
fn uses(text: &str) -> BTreeSet<String> {
    let mut found = names_after(text, "crate::");
    if text.lines().any(|line| {
        line.split("//")
            .next()
            .unwrap_or("")
            .contains("sqlite_now_us!")
    }) {
        found.insert("db".to_owned());
    }
    found
}

/// The module names at the start of `path` (what follows `crate::`): `x` of `x::Y`, or each
/// top-level name of a group `{x, y::{Z, w}}` (`x`, `y`).
fn leading_names(path: &str) -> Vec<String> {
    let name = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect()
    };
    let Some(group) = path.strip_prefix('{') else {
        return vec![name(path)]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect();
    };
    let (mut depth, mut names, mut start) = (1, Vec::new(), Some(0));
    for (i, c) in group.char_indices() {
        if let Some(from) = start.take() {
            names.push(name(&group[from..]));
        }
        match c {
            '{' => depth += 1,
            '}' if depth == 1 => break,
            '}' => depth -= 1,
            ',' if depth == 1 => start = Some(i + 1),
            _ => {}
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// The names a file's code (comments aside) spells right after `prefix` (`crate::x` -> `x`).
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    // Whole, so a `use` group rustfmt spread over lines is read as one.
    let code: Vec<&str> = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect();
    let code = code.join("\n");
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices(prefix) {
        // `holdfast_crate::x` is not `crate::x`.
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        found.extend(leading_names(&code[i + prefix.len()..]));
    }
    found
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let mut broken = Vec::new();
    for (dir, rules) in LAYERS {
        let allowed: BTreeMap<&str, &[&str]> = rules.iter().copied().collect();
        let at = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        for (rel, text) in crate_src(dir) {
            let module = module_of(&rel);
            if rel == "tidy.rs" {
                continue;
            }
            let Some(may) = allowed.get(module) else {
                continue;
            };
            for used in uses(&text) {
                if used != module && !may.contains(&used.as_str()) {
                    broken.push(format!("{at}src/{rel} uses crate::{used}"));
                }
            }
        }
    }
    for (rel, text) in crate_src("crates/holdfast-participants") {
        for used in names_after(&text, "holdfast_coordinator::") {
            if !PARTICIPANTS_USE_OF_COORDINATOR.contains(&used.as_str()) {
                let at = "crates/holdfast-participants/src";
                broken.push(format!("{at}/{rel} uses holdfast_coordinator::{used}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "layering rules of ARCHITECTURE.md broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let src = src_files()
        .into_iter()
        .map(|(rel, text)| (format!("src/{rel}"), text));
    let long: Vec<String> = src
        .chain(crate_files())
        .filter(|(_, text)| text.lines().count() > MAX_LINES)
        .map(|(path, text)| format!("{path}: {} lines", text.lines().count()))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by job):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_rules_read_code_not_comments() {
    let text = "use crate::store::Store; // crate::api\n/// see crate::registry\n";
    let found = uses(text);
    assert!(found.contains("store"));
    assert!(!found.contains("api") && !found.contains("registry"));
    assert!(!uses("use holdfast_crate::api;").contains("api"));
    let group = names_after(
        "use holdfast_coordinator::{store, x::{self, Y, z}};",
        "holdfast_coordinator::",
    );
    assert_eq!(group, ["store", "x"].map(String::from).into());
    assert!(
        names_after(
            "use holdfast_coordinator::store::Store;",
            "holdfast_coordinator::"
        )
        .contains("store")
    );
    assert_eq!(module_of("store/postgres/mod.rs"), "store");
    assert_eq!(module_of("app.rs"), "app");
}
