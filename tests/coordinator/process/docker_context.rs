//! SPEC 13: `deploy/Dockerfile` builds from the repository as it is. No Docker daemon is
//! needed to show it: the image's build context is rebuilt in a temporary folder from the
//! builder stage's `COPY` lines and `deploy/Dockerfile.dockerignore` (BuildKit's rules:
//! patterns anchored at the context's root, `*` within a path segment, `**` across them, a
//! pattern excluding a folder excludes what is in it), and cargo works there, locked and
//! offline: the workspace resolves (every crate the manifests name, every declared target,
//! the lockfile; and fails to without `COPY crates`), every file the code embeds at compile
//! time is there, and, in the `--ignored` run `.ci/run` makes, `holdfast` compiles.

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

/// A file of `deploy/`.
fn deploy_file(name: &str) -> String {
    let path = repository().join("deploy").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The builder's working folder as the Dockerfile's `COPY` lines leave it, in a fresh folder.
fn rebuilt_context() -> PathBuf {
    context_of(&deploy_file("Dockerfile"))
}

/// The builder's working folder as `dockerfile`'s `COPY` lines leave it, in a fresh folder.
fn context_of(dockerfile: &str) -> PathBuf {
    let patterns = ignore_patterns(&deploy_file("Dockerfile.dockerignore"));
    let workdir = std::env::temp_dir().join(format!(
        "holdfast-docker-context-{}",
        uuid::Uuid::new_v4().simple()
    ));
    for (sources, dest) in builder_copies(dockerfile) {
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

/// `cargo metadata` of the workspace in `context`, for the host's platform only (the others'
/// packages need not be downloaded to resolve).
fn metadata(context: &Path) -> std::process::Output {
    let host = host_triple();
    let args = [
        "metadata",
        "--format-version",
        "1",
        "--filter-platform",
        &host,
    ];
    cargo(context, &context.join("target"), &args)
}

#[test]
fn the_root_dockerignore_has_the_dockerfiles_rules() {
    // A builder that does not read deploy/Dockerfile.dockerignore (the legacy one, podman)
    // reads the context's .dockerignore: the same rules, or it sends target/ and more.
    let root = std::fs::read_to_string(repository().join(".dockerignore")).expect(".dockerignore");
    assert_eq!(
        ignore_patterns(&root),
        ignore_patterns(&deploy_file("Dockerfile.dockerignore"))
    );
}

#[test]
fn the_dockerfile_build_context_resolves_the_workspace() {
    let context = rebuilt_context();
    let out = metadata(&context);
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

#[test]
fn a_dockerfile_that_leaves_a_crate_out_is_caught() {
    // The COPY lines are read, not assumed: without `COPY crates ./crates` (the mistake this
    // test was written for) the workspace does not resolve.
    let dockerfile = deploy_file("Dockerfile");
    let without: String = dockerfile
        .lines()
        .filter(|l| !l.trim_start().starts_with("COPY crates"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(
        without, dockerfile,
        "the Dockerfile copies crates/ on a line of its own"
    );
    let context = context_of(&without);
    let out = metadata(&context);
    let _ = std::fs::remove_dir_all(&context);
    assert!(!out.status.success(), "resolved without crates/");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("crates/holdfast-"), "{said}");
}

/// The paths a source file embeds at compile time, as written: `include_str!`,
/// `include_bytes!` (relative to the file) and `sqlx::migrate!` (relative to its crate).
fn embedded(source: &str) -> Vec<(&'static str, String)> {
    let mut found = Vec::new();
    for (mac, relative_to) in [
        ("include_str!(\"", "file"),
        ("include_bytes!(\"", "file"),
        ("migrate!(\"", "crate"),
    ] {
        let mut rest = source;
        while let Some(at) = rest.find(mac) {
            rest = &rest[at + mac.len()..];
            if let Some(end) = rest.find('"') {
                found.push((relative_to, rest[..end].to_owned()));
            }
        }
    }
    found
}

/// Every `.rs` file under `dir` (no `target/`).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a folder").flatten() {
        let path = entry.path();
        if path.is_dir() && entry.file_name() != "target" {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_dockerfile_build_context_holds_every_file_the_code_embeds() {
    // What compiling needs beyond the manifests, checked in seconds: the console's assets,
    // the Lua scripts, every migrations folder (a `.dockerignore` rule or a missing COPY
    // would only show in the --ignored compile below), and protoc's input.
    let context = rebuilt_context();
    let mut files = Vec::new();
    rust_files(&context, &mut files);
    let (mut checked, mut missing) = (0, Vec::new());
    for file in &files {
        let source = std::fs::read_to_string(file).expect("a source file");
        for (relative_to, path) in embedded(&source) {
            let base = match relative_to {
                "file" => file.parent().expect("a folder").to_path_buf(),
                _ => file
                    .ancestors()
                    .find(|d| d.join("Cargo.toml").is_file())
                    .expect("the file's crate")
                    .to_path_buf(),
            };
            checked += 1;
            if !base.join(&path).exists() {
                missing.push(format!("{}: {path}", file.display()));
            }
        }
    }
    let protos = context.join("proto/tcc/v1");
    let has_protos = protos.is_dir();
    let _ = std::fs::remove_dir_all(&context);
    assert!(
        has_protos,
        "proto/tcc/v1 (holdfast-proto's build.rs) not in the context"
    );
    assert!(
        missing.is_empty(),
        "embedded but not in the context: {missing:#?}"
    );
    assert!(checked >= 15, "only {checked} embedded paths found");
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
