//! A data folder an earlier holdfast made, with every participant in one `participants.db`,
//! is carried over to a file per participant when the embedded binary starts in it: what the
//! participants had (resources, a live hold) is still there, each file keeps only its own
//! participant's barrier rows, the shared file is kept under another name, a restart neither
//! splits again nor loses anything, a split cut short before its last step is finished, one
//! cut short while copying starts over, and a folder with both layouts is refused.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast::participants::{self, Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::participant_client::ParticipantClient;
use sqlx::Connection;
use tokio::net::TcpListener;

use super::{Holdfast, admin, counts, embedded_command, listen_addr, participant_addr, serving};
use crate::common::{hold, put_resources_request};

#[tokio::test]
async fn an_embedded_folder_with_one_participants_file_is_split_keeping_its_data() {
    let (dir, data) = older_folder().await;

    let listen = listen_addr(11);
    let log = dir.join("holdfast.log");
    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    let (mut seats, mut stock) = (
        admin(participant_addr(listen, 50061)).await,
        admin(participant_addr(listen, 50062)).await,
    );
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0), "the hold");
    assert_eq!(counts(&mut stock, "mug").await, (5, 0, 0));
    assert!(!data.join("participants.db").exists());
    assert!(data.join("participants.db.split").exists());
    for kind in ["seats", "stock", "rooms", "payments", "noop"] {
        assert!(
            data.join("participants")
                .join(format!("{kind}.db"))
                .exists(),
            "participants/{kind}.db missing"
        );
    }
    let banner = std::fs::read_to_string(&log).expect("log");
    assert!(
        banner.contains("carried participants.db over to a file per participant"),
        "{banner}"
    );
    process.kill();
    drop((seats, stock));
    assert_eq!(
        barrier_rows(&data, "seats").await,
        vec![("seats".into(), 1)]
    );
    assert_eq!(barrier_rows(&data, "stock").await, vec![]);

    // Started again: nothing left to split, and what was carried over is still there.
    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    let mut seats = admin(participant_addr(listen, 50061)).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    process.kill();
    let banner = std::fs::read_to_string(&log).expect("log");
    assert_eq!(banner.matches("carried participants.db over").count(), 1);

    // Cut short after the shared file's rename, before the folder's: the next start finishes.
    std::fs::rename(
        data.join("participants"),
        data.join("participants.splitting"),
    )
    .expect("as if cut short");
    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    let mut seats = admin(participant_addr(listen, 50061)).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    process.kill();
    drop(seats);
    assert!(!data.join("participants.splitting").exists());

    // An older binary run after the split leaves both layouts: refused, nothing touched.
    std::fs::copy(
        data.join("participants.db.split"),
        data.join("participants.db"),
    )
    .expect("as an older binary would leave it");
    let out = embedded_command(&dir, listen)
        .output()
        .expect("run holdfast");
    assert!(!out.status.success(), "it started on both layouts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("are both there"), "{err}");
    assert_eq!(
        barrier_rows(&data, "seats").await,
        vec![("seats".into(), 1)]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A split cut short while it was still copying (a copy half made, no rename yet) starts over
/// from the shared file: what the staging folder held is gone, the copies are whole.
#[tokio::test]
async fn a_split_cut_short_while_copying_starts_over_from_the_shared_file() {
    let (dir, data) = older_folder().await;
    let staging = data.join("participants.splitting");
    std::fs::create_dir_all(&staging).expect("staging folder");
    std::fs::write(staging.join("seats.db"), b"SQLite format 3\0 cut short").expect("a torn copy");
    std::fs::write(staging.join("left-over"), b"from the run that died").expect("a stray file");

    let listen = listen_addr(12);
    let mut process = Holdfast::start_embedded(&dir, listen, dir.join("holdfast.log"));
    serving(&mut process, listen).await;
    let (mut seats, mut stock) = (
        admin(participant_addr(listen, 50061)).await,
        admin(participant_addr(listen, 50062)).await,
    );
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0), "the hold");
    assert_eq!(counts(&mut stock, "mug").await, (5, 0, 0));
    process.kill();
    drop((seats, stock));
    assert!(!staging.exists());
    assert!(!data.join("participants").join("left-over").exists());
    assert!(data.join("participants.db.split").exists());
    assert_eq!(
        barrier_rows(&data, "seats").await,
        vec![("seats".into(), 1)]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A temporary folder (removed by the test) whose `data/` an earlier holdfast left
/// ([`older_layout`]); the folder and its `data/`.
async fn older_folder() -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "holdfast-upgrade-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data folder");
    older_layout(&data).await;
    (dir, data)
}

/// What an earlier holdfast left in `data`: seats and stock served on one `participants.db`,
/// seat C7 and 5 mugs provisioned, C7 held by a Try.
async fn older_layout(data: &Path) {
    let url = format!("sqlite://{}", data.join("participants.db").display());
    let pool = holdfast::db::open_sqlite(&url, 4).await.expect("open");
    // Once, as the all-in-one did: SQLite migrations take no lock of their own.
    participants::SQLITE_MIGRATOR
        .run(&pool)
        .await
        .expect("migrate");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut served = Vec::new();
    let mut addrs = Vec::new();
    for kind in [Kind::Seats, Kind::Stock] {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        addrs.push(listener.local_addr().expect("addr"));
        let mut stopped = stopped.clone();
        served.push(tokio::spawn(participants::serve(
            ParticipantSettings::new(kind),
            pool.clone(),
            listener,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        )));
    }
    let (mut seats, mut stock) = (admin(addrs[0]).await, admin(addrs[1]).await);
    seats
        .put_resources(put_resources_request(&[("C7", 1)]))
        .await
        .expect("put C7");
    stock
        .put_resources(put_resources_request(&[("mug", 5)]))
        .await
        .expect("put mugs");
    let expires = SystemTime::now() + Duration::from_secs(3600);
    let held = ParticipantClient::connect(format!("http://{}", addrs[0]))
        .await
        .expect("connect")
        .r#try(proto::TryRequest {
            reservation_id: "older-1".into(),
            branch_id: "b1".into(),
            holder: "before-the-upgrade".into(),
            items: vec![hold("seats", "C7")],
            expires_at: Some(prost_types::Timestamp {
                seconds: expires
                    .duration_since(UNIX_EPOCH)
                    .expect("after 1970")
                    .as_secs() as i64,
                nanos: 0,
            }),
        })
        .await
        .expect("try")
        .into_inner();
    assert_eq!(held.outcome, proto::try_response::Outcome::Held as i32);
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    stop.send(true).expect("stop");
    for s in served {
        s.await.expect("join").expect("served");
    }
    pool.close().await;
}

/// `participants/<file>.db`'s barrier rows per participant.
async fn barrier_rows(data: &Path, file: &str) -> Vec<(String, i64)> {
    let path = data.join("participants").join(format!("{file}.db"));
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("open");
    sqlx::query_as(
        "SELECT participant, count(*) FROM tcc_barrier GROUP BY participant ORDER BY participant",
    )
    .fetch_all(&mut conn)
    .await
    .expect("barrier rows")
}
