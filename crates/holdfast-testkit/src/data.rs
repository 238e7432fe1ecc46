//! Where a harness keeps its data: a temporary SQLite folder laid out as the all-in-one's, or a
//! PostgreSQL database; and the participants' side of the movable clock.

use holdfast_coordinator::testing::TestClock;
use holdfast_participants::testing::open_participant_db;
use holdfast_participants::{Kind, ParticipantDb};

use crate::TestkitError;

/// Connections each participant pool may open.
const PARTICIPANT_POOL_SIZE: u32 = 8;

/// Where the harness keeps its data: a temporary SQLite folder (removed on drop) or a
/// PostgreSQL database; and the participants' side of the movable clock (the coordinator has
/// its own, see `coordinator.rs`; both are moved by the same amounts).
pub(crate) struct Data {
    pub(crate) coordinator_url: String,
    /// Each reference participant's database: one pool for all on PostgreSQL; on SQLite a file
    /// each, as in the all-in-one, so one participant's writes never queue behind another's
    /// on a shared file's one writer.
    pub(crate) participants: Vec<(Kind, ParticipantDb)>,
    pub(crate) clock: TestClock,
    pub(crate) folder: Option<tempfile::TempDir>,
}

impl Data {
    pub(crate) async fn open(postgres: Option<&str>, kinds: &[Kind]) -> Result<Data, TestkitError> {
        let clock = TestClock::new();
        if let Some(url) = postgres {
            let shared = open_participant_db(url, PARTICIPANT_POOL_SIZE, &clock).await?;
            return Ok(Data {
                coordinator_url: url.to_owned(),
                participants: kinds.iter().map(|&k| (k, shared.clone())).collect(),
                clock,
                folder: None,
            });
        }
        let folder = tempfile::Builder::new()
            .prefix("holdfast-testkit-")
            .tempdir()
            .map_err(TestkitError::TempDir)?;
        let coordinator_url = format!("sqlite://{}", folder.path().join("holdfast.db").display());
        let mut participants = Vec::with_capacity(kinds.len());
        for &kind in kinds {
            // The all-in-one's layout: `participants/<name>.db` beside `holdfast.db`.
            let file = holdfast_participants::data_dir::participant_url(&coordinator_url, kind)
                .map_err(holdfast_coordinator::testing::TestingError::from)?;
            let db = open_participant_db(&file, PARTICIPANT_POOL_SIZE, &clock).await?;
            participants.push((kind, db));
        }
        Ok(Data {
            coordinator_url,
            participants,
            clock,
            folder: Some(folder),
        })
    }
}
