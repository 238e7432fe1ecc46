//! A start that fails before anything is written leaves nothing behind: the all-in-one and
//! the coordinator role on the embedded SQLite default, with their HTTP port taken or a
//! given participant named like a built-in one, exit naming the setting and leave no `data`
//! folder in their working directory (they made it; nothing was written in it).

use std::net::SocketAddr;
use std::process::Output;

use super::{embedded_command, holdfast_command, listen_addr};

/// A fresh, empty working directory.
fn workdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "holdfast-e2e-{what}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("a temp folder");
    dir
}

#[track_caller]
fn refused_naming(out: &Output, setting: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {err}");
    assert!(err.contains(setting), "{setting} not named: {err}");
}

#[test]
fn a_start_that_fails_before_writing_leaves_no_data_folder() {
    let listen = listen_addr(24);
    // The all-in-one's HTTP port (IP:8080, as the harness gives it) is taken.
    let taken = std::net::TcpListener::bind(SocketAddr::new(listen.ip(), 8080))
        .expect("take the HTTP port");
    let dir = workdir("http-taken");
    let out = embedded_command(&dir, listen)
        .output()
        .expect("run holdfast");
    refused_naming(&out, "--http-listen");
    assert!(!dir.join("data").exists(), "a data folder was left behind");

    // The coordinator role (SQLite default) the same.
    let out = holdfast_command()
        .current_dir(&dir)
        .args(["coordinator", "--listen", &listen.to_string()])
        .args(["--metrics-listen", "off", "--http-listen"])
        .arg(format!("{}:8080", listen.ip()))
        .output()
        .expect("run holdfast coordinator");
    refused_naming(&out, "--http-listen");
    assert!(!dir.join("data").exists(), "a data folder was left behind");
    drop(taken);

    // A given participant named like a built-in one: refused before the folder is made.
    let out = embedded_command(&dir, listen)
        .args(["--participant", "stock=http://127.0.0.1:1"])
        .output()
        .expect("run holdfast");
    refused_naming(&out, "--participant stock=");
    assert!(!dir.join("data").exists(), "a data folder was left behind");
    let _ = std::fs::remove_dir_all(&dir);
}
