//! The highly available Kubernetes example (`deploy/kubernetes-ha`, SPEC 12): a CloudNativePG
//! `Cluster` of three instances with synchronous replication that waits for a standby, and every
//! workload of the base (coordinators, migrate Job, seats) pointed at its read-write Service,
//! with the Cluster's CA and password. Built with `kubectl kustomize` (or `kustomize build`) and
//! every built-in kind checked against Kubernetes' schemas with `kubernetes-validate --strict`
//! when those are installed (`.ci/run` installs kubernetes-validate and requires both with
//! `HOLDFAST_DEPLOY_TOOLS_REQUIRED=1`); the CloudNativePG kind, which no schema there covers,
//! is checked here field by field.

use std::path::{Path, PathBuf};
use std::process::Command;

fn overlay() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes-ha")
}

fn tools_required() -> bool {
    std::env::var("HOLDFAST_DEPLOY_TOOLS_REQUIRED").is_ok_and(|v| v == "1")
}

/// The overlay built by `kubectl kustomize` or `kustomize build`; `None` when neither runs.
fn built() -> Option<String> {
    let dir = overlay();
    let attempts: [(&str, &[&str]); 2] = [("kubectl", &["kustomize"]), ("kustomize", &["build"])];
    for (program, args) in attempts {
        let Ok(out) = Command::new(program).args(args).arg(&dir).output() else {
            continue;
        };
        assert!(
            out.status.success(),
            "{program} {args:?} {}:\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        return Some(String::from_utf8(out.stdout).expect("YAML is UTF-8"));
    }
    assert!(!tools_required(), "neither kubectl nor kustomize runs");
    eprintln!("deploy_ha: SKIPPED the build: neither kubectl nor kustomize is installed");
    None
}

/// The documents of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<&str> {
    yaml.split("\n---\n").collect()
}

fn value_of<'a>(doc: &'a str, key: &str) -> Vec<&'a str> {
    doc.lines()
        .filter_map(|l| {
            l.trim()
                .trim_start_matches("- ")
                .strip_prefix(key)?
                .strip_prefix(':')
        })
        .map(|v| v.trim().trim_matches('"'))
        .collect()
}

#[test]
fn the_cluster_replicates_synchronously_and_waits_for_a_standby() {
    let path = overlay().join("postgres-cluster.yaml");
    let cluster = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    assert_eq!(value_of(&cluster, "apiVersion"), ["postgresql.cnpg.io/v1"]);
    assert_eq!(value_of(&cluster, "kind"), ["Cluster"]);
    assert_eq!(value_of(&cluster, "name"), ["holdfast-pg"]);
    assert_eq!(value_of(&cluster, "instances"), ["3"]);
    // spec.postgresql.synchronous: one standby of the quorum confirms every commit, and with
    // none to confirm, commits wait (`required`) rather than go on unreplicated.
    let synchronous = cluster
        .split_once("    synchronous:\n")
        .map(|(_, rest)| rest)
        .expect("spec.postgresql.synchronous");
    let stanza: String = synchronous
        .lines()
        .take_while(|l| l.starts_with("      "))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(value_of(&stanza, "method"), ["any"], "{stanza}");
    assert_eq!(value_of(&stanza, "number"), ["1"], "{stanza}");
    assert_eq!(
        value_of(&stanza, "dataDurability"),
        ["required"],
        "{stanza}"
    );
    assert_eq!(value_of(&cluster, "podAntiAffinityType"), ["required"]);
}

#[test]
fn every_workload_dials_the_read_write_service_with_the_cluster_s_ca() {
    let Some(yaml) = built() else { return };
    let docs = documents(&yaml);
    assert!(
        docs.iter()
            .any(|d| value_of(d, "kind") == ["Cluster"] && d.contains("name: holdfast-pg\n")),
        "the Cluster is part of the build"
    );
    let urls: Vec<&str> = docs
        .iter()
        .flat_map(|d| {
            let lines: Vec<&str> = d.lines().collect();
            lines
                .windows(2)
                .filter(|w| w[0].trim() == "- name: DATABASE_URL")
                .filter_map(|w| w[1].trim().strip_prefix("value:"))
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        urls.len(),
        3,
        "coordinator, migrate Job and seats: {urls:?}"
    );
    for url in &urls {
        assert!(
            url.starts_with("postgres://holdfast@holdfast-pg-rw:5432/")
                && url.contains("sslmode=verify-full"),
            "{url}"
        );
    }
    assert!(
        !yaml.contains("name: holdfast-db\n"),
        "the base's database Secret is not read"
    );
    assert_eq!(yaml.matches("secretName: holdfast-pg-ca").count(), 3);
    assert_eq!(yaml.matches("name: holdfast-pg-app").count(), 3);
    validate(&yaml);
}

/// `kubernetes-validate --strict` over the build: every built-in kind against its schema
/// (unknown fields refused). CRD kinds only warn there.
fn validate(yaml: &str) {
    let file = std::env::temp_dir().join(format!(
        "holdfast-deploy-ha-{}.yaml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, yaml).expect("writing the build");
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet"])
        .arg(&file)
        .output();
    let _ = std::fs::remove_file(&file);
    match out {
        Ok(out) => assert!(
            out.status.success(),
            "kubernetes-validate --strict:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            assert!(!tools_required(), "kubernetes-validate: {e}");
            eprintln!("deploy_ha: SKIPPED the schema check: kubernetes-validate: {e}");
        }
    }
}
