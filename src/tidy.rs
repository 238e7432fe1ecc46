//! The house rules of `ARCHITECTURE.md`, checked on every `cargo test`: which module may use
//! which (the layers point one way), how long a source file and a function may grow
//! (`fn_length.rs`), and that a public item is used outside its crate (`unused_pub.rs`).
//! Test-only.

mod fn_length;
mod unused_pub;
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each module may use of the crate besides itself. A module missing here (`app`,
/// `config`, `bench`, `main`, `lib`) is wiring and may use anything below it. `auth`, `conn`,
/// `db`, `server`, `tls`, `watched` and `participant` are the crates `holdfast-serve` and
/// `holdfast-participant` re-exported: cargo keeps those from using anything of this crate.
const ALLOWED: &[(&str, &[&str])] = &[
    ("domain", &[]),
    ("proto", &[]),
    ("telemetry", &["auth", "conn", "domain", "tls"]),
    ("store", &["db", "domain"]),
    ("registry", &["domain", "proto", "telemetry", "tls"]),
    ("coordinator", &["domain", "registry", "store", "telemetry"]),
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
    ("cli", &["auth", "config", "json", "proto", "tls"]),
    ("json", &["proto"]),
    (
        "participant_check",
        &["auth", "config", "json", "proto", "tls"],
    ),
    (
        "testing",
        &["coordinator", "db", "participant", "participants", "store"],
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
    (
        "participants",
        &[
            "auth",
            "db",
            "participant",
            "proto",
            "server",
            "telemetry",
            "tls",
        ],
    ),
];

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
    files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
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
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let name: String = code[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
        if code.contains("sqlite_now_us!") {
            found.insert("db".to_owned());
        }
    }
    found
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut broken = Vec::new();
    for (rel, text) in src_files() {
        let module = module_of(&rel);
        if rel == "tidy.rs" {
            continue;
        }
        let Some(may) = allowed.get(module) else {
            continue;
        };
        for used in uses(&text) {
            if used != module && !may.contains(&used.as_str()) {
                broken.push(format!("src/{rel} uses crate::{used}"));
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
    assert_eq!(module_of("store/postgres/mod.rs"), "store");
    assert_eq!(module_of("app.rs"), "app");
}
