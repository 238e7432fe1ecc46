//! Where a harness keeps its data: a temporary SQLite folder laid out as the all-in-one's, or a
//! PostgreSQL database; and the participants' side of the movable clock.

use holdfast_coordinator::testing::TestClock;

use crate::TestkitError;

/// Where the harness keeps its data: a temporary SQLite folder (removed on drop) or a
/// PostgreSQL database; and the participants' side of the movable clock (the coordinator has
/// its own, see `coordinator.rs`; both are moved by the same amounts). The reference
/// participants' databases are opened beside it (`reference.rs`).
pub(crate) struct Data {
    pub(crate) coordinator_url: String,
    pub(crate) clock: TestClock,
    pub(crate) folder: Option<tempfile::TempDir>,
}

impl Data {
    pub(crate) fn open(postgres: Option<&str>) -> Result<Data, TestkitError> {
        let clock = TestClock::new();
        if let Some(url) = postgres {
            return Ok(Data {
                coordinator_url: url.to_owned(),
                clock,
                folder: None,
            });
        }
        let folder = tempfile::Builder::new()
            .prefix("holdfast-testkit-")
            .tempdir()
            .map_err(TestkitError::TempDir)?;
        let coordinator_url = format!("sqlite://{}", folder.path().join("holdfast.db").display());
        Ok(Data {
            coordinator_url,
            clock,
            folder: Some(folder),
        })
    }
}
