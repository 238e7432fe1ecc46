//! The shipped deploy files scrape `/metrics` where holdfast serves it (SPEC 8.5). In each
//! Kubernetes manifest the `prometheus.io/port` annotation, the container port named `metrics`,
//! the Service's metrics port and `HOLDFAST_METRICS_LISTEN` (the ConfigMap's, or the
//! container's own) name one port, on all interfaces; in `compose.yaml` every published
//! metrics port leads to the port `HOLDFAST_METRICS_LISTEN` gives. And that variable is the
//! one the binary reads: a participant given only it serves `/metrics` there.

use std::net::SocketAddr;
use std::path::Path;

use super::{Holdfast, holdfast_command, listen_addr, scrape};

fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value on the line after the one that is (trimmed) `line` in `yaml`, if that next line
/// is `key: value`.
fn next_value<'a>(yaml: &'a str, line: &str, key: &str) -> Option<&'a str> {
    let mut lines = yaml.lines();
    lines.find(|l| l.trim() == line)?;
    let next = lines.next()?.trim().strip_prefix(key)?;
    Some(next.strip_prefix(':')?.trim().trim_matches('"'))
}

/// Every value of `key:` in `yaml`, quotes removed.
fn values<'a>(yaml: &'a str, key: &str) -> Vec<&'a str> {
    yaml.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"'))
        .collect()
}

/// The port of a `0.0.0.0:<port>` listen address (all interfaces: a scraper reaches it from
/// outside the pod or container).
fn all_interfaces_port(listen: &str) -> &str {
    listen
        .strip_prefix("0.0.0.0:")
        .unwrap_or_else(|| panic!("HOLDFAST_METRICS_LISTEN {listen:?} is not on 0.0.0.0"))
}

#[test]
fn the_kubernetes_manifests_scrape_the_port_metrics_are_served_on() {
    let configmap = deploy_file("kubernetes/configmap.yaml");
    let listen = values(&configmap, "HOLDFAST_METRICS_LISTEN");
    assert_eq!(listen.len(), 1, "{listen:?}");
    let coordinator_port = all_interfaces_port(listen[0]);

    let deployment = deploy_file("kubernetes/coordinator-deployment.yaml");
    assert_eq!(
        values(&deployment, "prometheus.io/port"),
        [coordinator_port]
    );
    assert_eq!(values(&deployment, "prometheus.io/path"), ["/metrics"]);
    assert_eq!(
        next_value(&deployment, "- name: metrics", "containerPort"),
        Some(coordinator_port)
    );
    let service = deploy_file("kubernetes/coordinator-service.yaml");
    assert_eq!(
        next_value(&service, "- name: metrics", "port"),
        Some(coordinator_port)
    );
    assert!(
        service.contains(&format!(
            "port: {coordinator_port}\n      targetPort: metrics"
        )),
        "the Service's metrics port targets the container port named metrics"
    );

    let seats = deploy_file("kubernetes/participant-seats.yaml");
    let own = next_value(&seats, "- name: HOLDFAST_METRICS_LISTEN", "value")
        .expect("the participant's HOLDFAST_METRICS_LISTEN");
    let seats_port = all_interfaces_port(own);
    assert_eq!(values(&seats, "prometheus.io/port"), [seats_port]);
    assert_eq!(
        next_value(&seats, "- name: metrics", "containerPort"),
        Some(seats_port)
    );
}

#[test]
fn compose_publishes_the_port_metrics_are_served_on() {
    let compose = deploy_file("compose.yaml");
    let listen = values(&compose, "HOLDFAST_METRICS_LISTEN");
    assert!(
        listen.len() >= 2,
        "coordinators' and participants': {listen:?}"
    );
    let ports: Vec<&str> = listen.iter().map(|l| all_interfaces_port(l)).collect();
    assert!(ports.iter().all(|p| *p == ports[0]), "{ports:?}");
    // The coordinators publish theirs on the host (9464, 9465, ...).
    let published: Vec<&str> = compose
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- \"127.0.0.1:946"))
        .collect();
    assert!(published.len() >= 2, "{published:?}");
    for mapping in published {
        let container_port = mapping.trim_end_matches('"').rsplit(':').next();
        assert_eq!(container_port, Some(ports[0]), "127.0.0.1:946{mapping}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_serves_metrics_where_holdfast_metrics_listen_says() {
    let dir =
        std::env::temp_dir().join(format!("holdfast-deploy-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let listen = listen_addr(21);
    let grpc = SocketAddr::new(listen.ip(), 50061);
    let metrics = SocketAddr::new(listen.ip(), 9464);
    let database = format!("sqlite://{}", dir.join("seats.db").display());
    let mut cmd = holdfast_command();
    cmd.args(["participant", "seats", "--listen", &grpc.to_string()])
        .args(["--database-url", &database])
        .env("HOLDFAST_METRICS_LISTEN", metrics.to_string());
    let mut seats = Holdfast::spawn(cmd, dir.join("seats.log"));
    seats.wait_serving(grpc, "tcc.v1.Participant").await;
    let page = scrape(metrics).await;
    assert!(page.contains("holdfast_"), "{page}");
    drop(seats);
    let _ = std::fs::remove_dir_all(&dir);
}
