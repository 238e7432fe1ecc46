//! SPEC 13: the order-service fragments in other languages - `examples/python` (grpcio) and
//! `examples/typescript` (@grpc/grpc-js) - pass their saga tests against the real binary run as
//! `holdfast --test-mode` (the embedded SQLite default in a folder of the test's own, on a
//! loopback IP of its own: the all-in-one's participants have fixed ports). Each test asserts
//! real outcomes: HELD, CONFIRMED with the payment recorded, EXPIRED after
//! `tcc.v1.Testing/AdvanceClock`, the expiry seen on `tcc.v1.Events` Subscribe.
//!
//! Ignored in the plain suite: they need Python 3.11 with `examples/python/requirements.txt`
//! and Node 20 with npm. `.ci/run` installs those and runs them after the suite:
//! `cargo test --locked --test coordinator process::other_languages -- --ignored`.
//! `HOLDFAST_TEST_PYTHON` names another interpreter (a virtualenv's).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Holdfast, embedded_command, listen_addr, participant_addr, serving};

/// What one language's saga test may take, stubs generated and all (npm ci apart).
const SAGA_LIMIT: Duration = Duration::from_secs(60);

/// What `npm ci` may take (a cold npm cache downloads the packages).
const INSTALL_LIMIT: Duration = Duration::from_secs(300);

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A folder removed (best effort) when the guard goes, even if the test panicked.
struct TempFolder(PathBuf);

impl TempFolder {
    fn new(what: &str) -> TempFolder {
        let path =
            std::env::temp_dir().join(format!("holdfast-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        TempFolder(path)
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `holdfast --test-mode` on the embedded default in `dir`, serving on loopback slot `slot`
/// once the coordinator and the seats and payments participants answer.
async fn test_mode(dir: &Path, slot: u8) -> (Holdfast, SocketAddr) {
    let listen = listen_addr(slot);
    let mut cmd = embedded_command(dir, listen);
    cmd.env("HOLDFAST_TEST_MODE", "true");
    let mut process = Holdfast::spawn(cmd, dir.join("holdfast.log"));
    serving(&mut process, listen).await;
    process
        .wait_serving(participant_addr(listen, 50064), "tcc.v1.Participant")
        .await;
    (process, listen)
}

/// Runs `program args` in `cwd` with `env` within `limit`; panics with its output unless it
/// exits 0. Returns its output.
async fn run(
    program: &str,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, String)],
    limit: Duration,
) -> String {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let line = format!("{program} {}", args.join(" "));
    let output = match tokio::time::timeout(limit, cmd.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("cannot run `{line}` in {}: {e}", cwd.display()),
        Err(_) => panic!("`{line}` did not finish within {limit:?}"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "`{line}` failed ({}):\n{text}",
        output.status
    );
    text
}

/// Where the saga tests find the all-in-one.
fn addresses(listen: SocketAddr) -> Vec<(&'static str, String)> {
    vec![
        ("HOLDFAST_ADDR", listen.to_string()),
        (
            "HOLDFAST_SEATS_ADDR",
            participant_addr(listen, 50061).to_string(),
        ),
        (
            "HOLDFAST_PAYMENTS_ADDR",
            participant_addr(listen, 50064).to_string(),
        ),
    ]
}

#[tokio::test]
#[ignore = "needs Python 3.11 with grpcio and grpcio-tools; run by .ci/run"]
async fn the_python_order_service_passes_its_saga_test() {
    let dir = TempFolder::new("python-saga");
    let (_holdfast, listen) = test_mode(&dir.0, 40).await;
    let python = std::env::var("HOLDFAST_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let example = repository().join("examples/python");
    let mut env = addresses(listen);
    // Bytecode of the example and its stubs goes to the temporary folder, not the repository.
    env.push((
        "PYTHONPYCACHEPREFIX",
        dir.0.join("pycache").display().to_string(),
    ));
    let output = run(&python, &["test_saga.py"], &example, &env, SAGA_LIMIT).await;
    // unittest's verdict: every test ran and passed, none skipped.
    assert!(output.contains("Ran 3 tests"), "{output}");
    assert!(output.trim_end().ends_with("OK"), "{output}");
}

#[tokio::test]
#[ignore = "needs Node 20 with npm (npm ci reaches the registry); run by .ci/run"]
async fn the_typescript_order_service_passes_its_saga_test() {
    let dir = TempFolder::new("typescript-saga");
    // The example is installed and compiled in a copy, so no node_modules/ or dist/ lands in
    // the repository; the proto is the repository's.
    let example = repository().join("examples/typescript");
    let work = dir.0.join("example");
    copy_tree(&example, &work, &["node_modules", "dist"]);
    run(
        "npm",
        &["ci", "--no-audit", "--no-fund"],
        &work,
        &[],
        INSTALL_LIMIT,
    )
    .await;
    let (_holdfast, listen) = test_mode(&dir.0, 41).await;
    let mut env = addresses(listen);
    env.push((
        "HOLDFAST_PROTO",
        repository().join("proto").display().to_string(),
    ));
    let output = run("npm", &["test"], &work, &env, SAGA_LIMIT).await;
    // node:test's summary: the three tests passed, none failed or skipped.
    for summary in ["tests 3", "pass 3", "fail 0", "skipped 0"] {
        let found = output.lines().any(|l| l.trim_end().ends_with(summary));
        assert!(found, "no `{summary}` line in:\n{output}");
    }
}

/// Copies `from` into `to`, leaving out entries named in `skip`.
fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    for entry in entries {
        let entry = entry.expect("a folder entry");
        let name = entry.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let (source, dest) = (entry.path(), to.join(&name));
        if source.is_dir() {
            copy_tree(&source, &dest, skip);
        } else {
            std::fs::copy(&source, &dest)
                .unwrap_or_else(|e| panic!("copy {}: {e}", source.display()));
        }
    }
}
