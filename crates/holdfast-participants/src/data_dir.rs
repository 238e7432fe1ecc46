//! Where the reference participants keep their SQLite files in a data folder: a file per
//! participant under `participants/`, beside the coordinator's `holdfast.db` (the
//! all-in-one's layout, and the testkit's).

use crate::Kind;
use crate::db;

/// The folder under the data folder that holds a SQLite file per participant.
pub const PARTICIPANTS_DIR: &str = "participants";

/// The URL of `kind`'s SQLite file in the data folder of `database_url`
/// (`./data/participants/seats.db`).
pub fn participant_url(database_url: &str, kind: Kind) -> Result<String, sqlx::Error> {
    let dir = db::sqlite_dir(database_url)?;
    let file = dir
        .join(PARTICIPANTS_DIR)
        .join(format!("{}.db", kind.name()));
    Ok(format!("sqlite://{}", file.display()))
}
