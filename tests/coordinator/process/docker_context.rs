//! SPEC 13: `deploy/Dockerfile` builds from the repository as it is. No Docker daemon is
//! needed to show it: the image's build context is rebuilt in a temporary folder from the
//! builder stage's `COPY` lines and `deploy/Dockerfile.dockerignore` (BuildKit's rules:
//! patterns anchored at the context's root, `*` within a path segment, `**` across them, a
//! pattern excluding a folder excludes what is in it), and cargo works there, locked and
//! offline: the workspace resolves (every crate the manifests name, every declared target,
//! the lockfile), and, in the `--ignored` run `.ci/run` makes, `holdfast` compiles.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository: the build context `docker build -f deploy/Dockerfile .` is given.
fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The builder stage's `COPY` instructions (other stages' `--from` copies excluded): each as
/// its sources and its destination, as written.
fn builder_copies(dockerfile: &str) -> Vec<(Vec<String>, String)> {
    let joined = dockerfile.replace("\\\n", " ");
    let mut in_builder = false;
    let mut copies = Vec::new();
    for line in joined.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|w| w.to_ascii_uppercase()).as_deref() {
            Some("FROM") => {
                in_builder = words.iter().any(|w| w.eq_ignore_ascii_case("builder"));
            }
            Some("COPY") if in_builder => {
                let args: Vec<&str> = words[1..].to_vec();
                assert!(
                    !args.iter().any(|a| a.starts_with("--from")),
                    "a COPY --from in the builder stage: {line}"
                );
                let args: Vec<String> = args
                    .into_iter()
                    .filter(|a| !a.starts_with("--"))
                    .map(str::to_owned)
                    .collect();
                let (dest, sources) = args.split_last().expect("COPY has a destination");
                copies.push((sources.to_vec(), dest.clone()));
            }
            _ => {}
        }
    }
    copies
}

/// `.dockerignore` patterns, normalised (no leading `/` or `./`, no trailing `/`).
fn ignore_patterns(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            assert!(!l.starts_with('!'), "exceptions are not modelled here: {l}");
            l.trim_start_matches("./")
                .trim_start_matches('/')
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

/// Whether `path` (relative to the context, `/`-separated) matches `pattern`.
fn glob(pattern: &[u8], path: &[u8]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(b'*'), _) if pattern.starts_with(b"**/") => {
            // Zero or more whole segments.
            glob(&pattern[3..], path)
                || path
                    .iter()
                    .position(|&c| c == b'/')
                    .is_some_and(|slash| glob(pattern, &path[slash + 1..]))
        }
        (Some(b'*'), _) if pattern == b"**" => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], path)
                || path.first().is_some_and(|&c| c != b'/') && glob(pattern, &path[1..])
        }
        (Some(b'?'), Some(&c)) => c != b'/' && glob(&pattern[1..], &path[1..]),
        (Some(p), Some(c)) => p == c && glob(&pattern[1..], &path[1..]),
        _ => false,
    }
}

/// Whether BuildKit leaves `path` out of the context: a pattern matches it or a folder it is in.
fn ignored(patterns: &[String], path: &str) -> bool {
    let mut prefixes = path
        .match_indices('/')
        .map(|(i, _)| &path[..i])
        .collect::<Vec<_>>();
    prefixes.push(path);
    patterns.iter().any(|p| {
        prefixes
            .iter()
            .any(|prefix| glob(p.as_bytes(), prefix.as_bytes()))
    })
}

/// Copies what of `source` (`relative` to the context) the context holds to `dest`.
fn copy_into_context(source: &Path, relative: &str, dest: &Path, patterns: &[String]) {
    if ignored(patterns, relative) {
        return;
    }
    if source.is_dir() {
        std::fs::create_dir_all(dest).expect("a folder of the context");
        for entry in std::fs::read_dir(source).expect("read a folder") {
            let entry = entry.expect("a folder entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            copy_into_context(
                &entry.path(),
                &format!("{relative}/{name}"),
                &dest.join(&name),
                patterns,
            );
        }
    } else {
        std::fs::create_dir_all(dest.parent().expect("a parent")).expect("a folder");
        std::fs::copy(source, dest).expect("copy a file of the context");
    }
}

/// The builder's working folder as the Dockerfile's `COPY` lines leave it, in a fresh folder.
fn rebuilt_context() -> PathBuf {
    let read = |name: &str| {
        let path = repository().join("deploy").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let patterns = ignore_patterns(&read("Dockerfile.dockerignore"));
    let workdir = std::env::temp_dir().join(format!(
        "holdfast-docker-context-{}",
        uuid::Uuid::new_v4().simple()
    ));
    for (sources, dest) in builder_copies(&read("Dockerfile")) {
        let dest = dest.trim_start_matches("./");
        for source in sources {
            let relative = source.trim_start_matches("./").trim_end_matches('/');
            let from = repository().join(relative);
            assert!(from.exists(), "COPY {source}: not in the repository");
            let target = if from.is_dir() || !(dest.ends_with('/') || dest.is_empty()) {
                workdir.join(dest)
            } else {
                workdir
                    .join(dest)
                    .join(relative.rsplit('/').next().unwrap_or(relative))
            };
            copy_into_context(&from, relative, &target, &patterns);
        }
    }
    workdir
}

/// `cargo ARGS` in `dir`, locked and offline, its target folder `target_dir`.
fn cargo(dir: &Path, target_dir: &Path, args: &[&str]) -> std::process::Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    Command::new(cargo)
        .args(args)
        .args(["--locked", "--offline"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .expect("run cargo")
}

/// The triple rustc builds for here.
fn host_triple() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

#[track_caller]
fn assert_success(what: &str, out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{what} failed in the Dockerfile's build context:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_dockerignore_rules_are_buildkits() {
    let patterns = ignore_patterns("target/\n**/target/\n**/*.md\ntests/\n/data\n");
    for (path, left_out) in [
        ("target/release/holdfast", true),
        ("crates/holdfast-serve/target/x", true),
        ("README.md", true),
        ("crates/holdfast-client/README.md", true),
        ("tests/coordinator/main.rs", true),
        ("data", true),
        ("crates/holdfast-serve/tests/a.rs", false),
        ("src/main.rs", false),
        ("src/md.rs", false),
    ] {
        assert_eq!(ignored(&patterns, path), left_out, "{path}");
    }
}

#[test]
fn the_dockerfile_build_context_resolves_the_workspace() {
    let context = rebuilt_context();
    let target = context.join("target");
    // The host's platform only: the others' packages need not be downloaded to resolve.
    let host = host_triple();
    let out = cargo(
        &context,
        &target,
        &[
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &host,
        ],
    );
    let _ = std::fs::remove_dir_all(&context);
    assert_success("cargo metadata", &out);
    let metadata: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let members = metadata["workspace_members"].as_array().map_or(0, Vec::len);
    assert_eq!(
        members, 8,
        "the workspace's eight crates: {}",
        metadata["workspace_members"]
    );
}

/// Minutes on two cores: run by `.ci/run` after the suite (`-- --ignored`).
#[test]
#[ignore = "compiles the workspace in a rebuilt Docker context; .ci/run runs it"]
fn the_dockerfile_build_context_compiles_holdfast() {
    let context = rebuilt_context();
    let target = repository().join("target").join("docker-context");
    let out = cargo(&context, &target, &["check", "--bin", "holdfast"]);
    let _ = std::fs::remove_dir_all(&context);
    assert_success("cargo check --bin holdfast", &out);
}
