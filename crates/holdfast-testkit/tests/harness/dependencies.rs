//! SPEC 13: the testkit does not need the reference participants' code (nor the binary's: its
//! HTTP listener, CLI, bench). Without the feature `reference-participants` its normal
//! dependency tree names neither `holdfast` nor `holdfast-participants` (nor Redis's client);
//! with it, the reference participants come in.

/// The crates `holdfast-testkit`'s normal dependency tree names with `args` (one each).
fn tree(args: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            "holdfast-testkit",
            "-e",
            "normal",
        ])
        .args(["--prefix", "none"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn without_the_feature_the_testkit_builds_no_reference_participant() {
    let crates = tree(&[]);
    assert!(
        crates.iter().any(|c| c == "holdfast-coordinator"),
        "{crates:?}"
    );
    for banned in ["holdfast", "holdfast-participants", "redis"] {
        assert!(
            !crates.iter().any(|c| c == banned),
            "holdfast-testkit depends on {banned}: {crates:?}"
        );
    }
    let with = tree(&["--features", "reference-participants"]);
    assert!(
        with.iter().any(|c| c == "holdfast-participants"),
        "{with:?}"
    );
    assert!(!with.iter().any(|c| c == "holdfast"), "{with:?}");
}
