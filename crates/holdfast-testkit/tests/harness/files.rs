//! On SQLite each reference participant keeps a file of its own (as the all-in-one does), so
//! one participant's writes never wait for another's on a shared file's one writer: a seat's
//! hold is a barrier row in `participants/seats.db` and nowhere else.

use std::path::Path;

use holdfast_testkit::client::State;
use holdfast_testkit::{Harness, Kind};
use sqlx::Connection;

use crate::{order, reserve};

#[tokio::test]
async fn each_reference_participant_keeps_a_sqlite_file_of_its_own() {
    let harness = Harness::builder()
        .participants([Kind::Seats, Kind::Stock])
        .resources("seats", [("A1", 1)])
        .resources("stock", [("sku-1", 5)])
        .start()
        .await
        .unwrap();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    assert_eq!(held.reservation.state, State::Held);

    let folder = harness.data_folder().expect("a SQLite folder");
    assert!(folder.join("holdfast.db").exists());
    assert!(!folder.join("participants.db").exists(), "one file for all");
    assert_eq!(barrier_rows(&folder.join("participants/seats.db")).await, 1);
    assert_eq!(barrier_rows(&folder.join("participants/stock.db")).await, 0);

    // The stock's hold goes to its own file.
    let mug = reserve(&harness, order("o-3", "stock", "sku-1")).await;
    assert_eq!(mug.reservation.state, State::Held);
    assert_eq!(barrier_rows(&folder.join("participants/stock.db")).await, 1);
    assert_eq!(barrier_rows(&folder.join("participants/seats.db")).await, 1);
}

/// The barrier rows in the SQLite file at `path` (which must exist).
async fn barrier_rows(path: &Path) -> i64 {
    assert!(path.exists(), "{} missing", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query_scalar("SELECT count(*) FROM tcc_barrier")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}
