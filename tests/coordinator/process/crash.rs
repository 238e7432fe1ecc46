//! The real binary keeps what it confirmed across a SIGKILL: the all-in-one on PostgreSQL
//! (with its `/metrics` counting reservations, expiries and refunds) and the embedded default
//! on SQLite files, which also admits only one writer per folder.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use tonic::transport::Channel;

use super::{
    Holdfast, STARTUP, TempDatabase, admin, counts, embedded_command, listen_addr,
    participant_addr, scrape, serving,
};
use crate::common::{Decide, put_resources_request, state_of};

#[tokio::test]
async fn all_in_one_binary_confirms_and_keeps_it_across_a_sigkill() {
    let db = TempDatabase::create().await;
    let listen = listen_addr(0);
    let log = std::env::temp_dir().join(format!(
        "holdfast-e2e-binary-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let seats_addr = participant_addr(listen, 50061);
    let stock_addr = participant_addr(listen, 50062);

    let mut process = Holdfast::start(&db.url, listen, log.clone());
    serving(&mut process, listen).await;

    let (mut client, mut seats, mut stock, r) =
        provision_and_reserve(listen, seats_addr, stock_addr, "bin-1").await;
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    assert_eq!(counts(&mut stock, "mug").await, (3, 2, 0));

    let get = confirm_and_wait(&mut client, &r).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));

    // The operator's view: /metrics counted the reservation and its participant calls.
    let metrics = scrape(SocketAddr::new(listen.ip(), 9464)).await;
    for line in [
        "holdfast_reservations_total{state=\"HELD\"} 1",
        "holdfast_reservations_total{state=\"CONFIRMED\"} 1",
        "holdfast_rpc_requests_total{method=\"Reserve\",code=\"Ok\"} 1",
        "holdfast_hold_to_confirm_ratio 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .contains("holdfast_branch_call_seconds_count{participant=\"seats\",phase=\"try\"} 1"),
        "{metrics}"
    );

    // SIGKILL, then the same binary on the same database and addresses.
    process.kill();
    drop((client, seats, stock));
    let mut process = Holdfast::start(&db.url, listen, log.clone());
    serving(&mut process, listen).await;

    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("reconnect to the coordinator");
    let after = client
        .get_reservation(get)
        .await
        .expect("the reservation survived the restart")
        .into_inner();
    assert_eq!(state_of(&after), State::Confirmed, "{after:?}");
    assert_eq!(after.id, r.id);
    let mut seats = admin(seats_addr).await;
    let mut stock = admin(stock_addr).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));

    // And it still works: the rest of the stock can be had.
    let more = client
        .reserve(proto::ReserveRequest {
            request_id: "bin-2".into(),
            holder: "bob".into(),
            ttl: None,
            holds: vec![proto::Hold {
                participant: "stock".into(),
                resource: "mug".into(),
                quantity: 3,
                during: None,
            }],
            labels: Default::default(),
            queue: None,
        })
        .await
        .expect("reserve after the restart")
        .into_inner();
    assert_eq!(state_of(&more), State::Held, "{more:?}");
    assert_eq!(counts(&mut stock, "mug").await, (0, 3, 2));

    // An expiry and a refunded late payment show on /metrics too.
    seats
        .put_resources(put_resources_request(&[("C8", 1)]))
        .await
        .expect("add seat C8");
    let seat = |holder: &str, ttl: Option<prost_types::Duration>| proto::ReserveRequest {
        request_id: format!("{holder}-c8"),
        holder: holder.into(),
        ttl,
        holds: vec![proto::Hold {
            participant: "seats".into(),
            resource: "C8".into(),
            quantity: 1,
            during: None,
        }],
        labels: Default::default(),
        queue: None,
    };
    let lapsing = client
        .reserve(seat(
            "carol",
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        ))
        .await
        .expect("carol reserves C8")
        .into_inner();
    let deadline = Instant::now() + STARTUP;
    while counts(&mut seats, "C8").await != (1, 0, 0) {
        assert!(Instant::now() < deadline, "C8 was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client
        .reserve(seat("dave", None))
        .await
        .expect("dave takes C8");
    let payments_addr = participant_addr(listen, 50064);
    admin(payments_addr)
        .await
        .put_resources(put_resources_request(&[("card", 10_000)]))
        .await
        .expect("fund the card");
    let payment_ref =
        proto::payments_client::PaymentsClient::connect(format!("http://{payments_addr}"))
            .await
            .expect("connect to payments")
            .charge(proto::ChargeRequest {
                account: "card".into(),
                amount_minor: 500,
                currency: "EUR".into(),
                reservation_id: lapsing.id.clone(),
            })
            .await
            .expect("charge")
            .into_inner()
            .payment_ref;
    let late = client
        .confirm(Decide::on(&lapsing).confirm_with(&proto::Payment {
            participant: "payments".into(),
            payment_ref,
            amount_minor: 500,
            currency: "EUR".into(),
        }))
        .await
        .expect_err("the seat is taken: refunded");
    assert_eq!(crate::common::reason(&late), "HOLD_EXPIRED");
    let metrics = scrape(SocketAddr::new(listen.ip(), 9464)).await;
    for line in [
        "holdfast_expired_holds_total 1",
        "holdfast_refunds_total{state=\"PENDING\"} 1",
        "holdfast_refunds_total{state=\"REFUNDED\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing in:\n{metrics}"
        );
    }
    // Everything settled (the refund acknowledged): the recovery backlog gauge, sampled by
    // every sweep, reads 0 within a few sweeps.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = scrape(SocketAddr::new(listen.ip(), 9464)).await;
        let backlog = metrics
            .lines()
            .find_map(|l| l.strip_prefix("holdfast_recovery_backlog "))
            .map(str::to_owned);
        if backlog.as_deref() == Some("0") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "holdfast_recovery_backlog did not read 0 within 30 s (last: {backlog:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    process.kill();
    drop(db);
    let _ = std::fs::remove_file(&log);
}

/// The embedded default: `holdfast` with no database argument in an empty folder runs on
/// SQLite files under `./data`; a reservation across two participants confirmed before a
/// SIGKILL is CONFIRMED after the restart with the counts intact; a second holdfast on the
/// same folder refuses to start, naming the lock.
#[tokio::test]
async fn embedded_binary_on_sqlite_keeps_a_confirmation_across_a_sigkill_and_has_one_writer() {
    let dir = std::env::temp_dir().join(format!(
        "holdfast-embedded-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let listen = listen_addr(2);
    let log = dir.join("holdfast.log");
    let (seats_addr, stock_addr) = (
        participant_addr(listen, 50061),
        participant_addr(listen, 50062),
    );

    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    // The banner says plainly that the data folder holds the token secret, and the way out.
    let output = std::fs::read_to_string(&log).expect("the output");
    assert!(
        output.lines().any(|l| l.contains("token-secret.toml")
            && l.contains("a copy of that folder can make every token")
            && l.contains("--token-secret-file")),
        "{output}"
    );
    for file in [
        "holdfast.db",
        "holdfast.lock",
        "participants/seats.db",
        "participants/stock.db",
    ] {
        assert!(
            dir.join("data").join(file).exists(),
            "./data/{file} missing"
        );
    }

    // One writer: a second holdfast on the same folder fails fast, saying why.
    let second = embedded_command(&dir, listen_addr_other(listen))
        .output()
        .expect("run a second holdfast");
    assert!(!second.status.success(), "the second holdfast started");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("another holdfast is already using ./data") && err.contains("holdfast.lock"),
        "{err}"
    );

    let (mut client, mut seats, mut stock, r) =
        provision_and_reserve(listen, seats_addr, stock_addr, "emb-1").await;
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    assert_eq!(counts(&mut stock, "mug").await, (3, 2, 0));
    let get = confirm_and_wait(&mut client, &r).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));

    // SIGKILL (the lock dies with the process), then the same binary in the same folder.
    process.kill();
    drop((client, seats, stock));
    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("reconnect");
    let after = client
        .get_reservation(get)
        .await
        .expect("survived")
        .into_inner();
    assert_eq!(state_of(&after), State::Confirmed, "{after:?}");
    let mut seats = admin(seats_addr).await;
    let mut stock = admin(stock_addr).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));
    // A repeat of the Reserve after the restart still answers its token: the token key lives
    // beside the database (owner-only), the token itself nowhere.
    let (_, _, _, again) = provision_and_reserve(listen, seats_addr, stock_addr, "emb-1").await;
    assert_eq!(
        (again.id.as_str(), again.hold_token.as_str()),
        (r.id.as_str(), r.hold_token.as_str())
    );
    let secret = dir.join("data").join("token-secret.toml");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret)
            .expect("token-secret.toml")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "the token secret is readable by others: {mode:o}"
        );
    }
    process.kill();
    for path in files_under(&dir.join("data")) {
        let bytes = std::fs::read(&path).expect("read a data file");
        assert!(
            !bytes
                .windows(r.hold_token.len())
                .any(|w| w == r.hold_token.as_bytes()),
            "the hold token is stored in {}",
            path.display()
        );
    }
    let banner = std::fs::read_to_string(&log).expect("log");
    assert!(
        banner.contains("authentication off (loopback only)"),
        "{banner}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file under `dir`, in its subfolders too.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a data folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Another loopback address than `listen`'s, so the second holdfast could bind everything:
/// only the lock can stop it.
fn listen_addr_other(listen: SocketAddr) -> SocketAddr {
    let IpAddr::V4(ip) = listen.ip() else {
        return listen;
    };
    let [a, b, c, d] = ip.octets();
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(a, b, c, d.wrapping_add(1).max(1))),
        listen.port(),
    )
}

/// Puts seat C7 (capacity 1) and 5 mugs at the binary's participants, then reserves the seat
/// and 2 mugs through its coordinator.
async fn provision_and_reserve(
    listen: SocketAddr,
    seats_addr: SocketAddr,
    stock_addr: SocketAddr,
    request_id: &str,
) -> (
    CoordinatorClient<Channel>,
    ResourceAdminClient<Channel>,
    ResourceAdminClient<Channel>,
    proto::Reservation,
) {
    let mut seats = admin(seats_addr).await;
    let mut stock = admin(stock_addr).await;
    for (admin, resource, capacity) in [(&mut seats, "C7", 1), (&mut stock, "mug", 5)] {
        admin
            .put_resources(put_resources_request(&[(resource, capacity)]))
            .await
            .unwrap_or_else(|e| panic!("put {resource}: {e}"));
    }
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("connect to the coordinator");
    let hold = |participant: &str, resource: &str, quantity| proto::Hold {
        participant: participant.into(),
        resource: resource.into(),
        quantity,
        during: None,
    };
    let r = client
        .reserve(proto::ReserveRequest {
            request_id: request_id.into(),
            holder: "alice".into(),
            ttl: None,
            holds: vec![hold("stock", "mug", 2), hold("seats", "C7", 1)],
            labels: Default::default(),
            queue: None,
        })
        .await
        .expect("reserve through the binary")
        .into_inner();
    (client, seats, stock, r)
}

/// Confirms `r` through the binary and waits (at most [`STARTUP`]) until it reads CONFIRMED;
/// answers the request that reads it, for reads after a restart.
async fn confirm_and_wait(
    client: &mut CoordinatorClient<Channel>,
    r: &proto::Reservation,
) -> proto::GetReservationRequest {
    client
        .confirm(Decide::on(r).confirm())
        .await
        .expect("confirm through the binary");
    let get = proto::GetReservationRequest {
        reservation_id: r.id.clone(),
    };
    let deadline = Instant::now() + STARTUP;
    loop {
        let now = client
            .get_reservation(get.clone())
            .await
            .expect("get")
            .into_inner();
        if state_of(&now) == State::Confirmed {
            break;
        }
        assert!(Instant::now() < deadline, "never CONFIRMED: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    get
}
