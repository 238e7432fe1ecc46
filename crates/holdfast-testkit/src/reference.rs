//! The reference participants a harness can start in-process (feature
//! `reference-participants`): each kind on its database - a file of its own beside the
//! coordinator's on SQLite, the shared database on PostgreSQL - with the participants' side of
//! the movable clock, on a loopback port behind a relay. Without the feature the testkit
//! builds none of their code (nor Redis's client): a saga test with scripted fakes only.

use holdfast_participants::testing::{open_participant_db, serve_test_participant};
use std::net::SocketAddr;

use holdfast_participants::{Kind, ParticipantDb, ParticipantSettings};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::data::Data;
use crate::harness::Participant;
use crate::{Relay, TestkitError};

/// Connections each participant pool may open.
const PARTICIPANT_POOL_SIZE: u32 = 8;

/// Opens each kind's database: one pool for all on PostgreSQL; on SQLite a file each, as in
/// the all-in-one (`participants/<name>.db` beside `holdfast.db`), so one participant's writes
/// never queue behind another's on a shared file's one writer.
async fn open(data: &Data, kinds: &[Kind]) -> Result<Vec<(Kind, ParticipantDb)>, TestkitError> {
    if data.folder.is_none() {
        let shared =
            open_participant_db(&data.coordinator_url, PARTICIPANT_POOL_SIZE, &data.clock).await?;
        return Ok(kinds.iter().map(|&k| (k, shared.clone())).collect());
    }
    let mut dbs = Vec::with_capacity(kinds.len());
    for &kind in kinds {
        let file = holdfast_participants::data_dir::participant_url(&data.coordinator_url, kind)
            .map_err(holdfast_coordinator::testing::TestingError::from)?;
        dbs.push((
            kind,
            open_participant_db(&file, PARTICIPANT_POOL_SIZE, &data.clock).await?,
        ));
    }
    Ok(dbs)
}

/// Serves each of `kinds` on a loopback port of its own, behind a relay, until `stop_rx`
/// turns true; each reclaims orphaned holds `orphan_grace` after their deadline.
pub(crate) async fn start(
    kinds: &[Kind],
    orphan_grace: std::time::Duration,
    data: &Data,
    stop_rx: &tokio::sync::watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> Result<Vec<Participant>, TestkitError> {
    let mut participants = Vec::new();
    for (kind, db) in open(data, kinds).await? {
        let listener = bind_loopback().await?;
        let url = local_url(&listener)?;
        let settings = ParticipantSettings {
            orphan_grace,
            ..ParticipantSettings::new(kind)
        };
        let (mut stopped, clock, name) = (stop_rx.clone(), data.clock.clone(), kind.name());
        tasks.spawn(async move {
            let until = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let served = serve_test_participant(settings, db, listener, &clock, until);
            if let Err(e) = served.await {
                eprintln!("holdfast-testkit: participant {name} stopped: {e}");
            }
        });
        let relay = Relay::start(&url).await;
        participants.push(Participant {
            name: name.to_owned(),
            direct_url: url,
            relay,
            fake: None,
        });
    }
    Ok(participants)
}

async fn bind_loopback() -> Result<TcpListener, TestkitError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    TcpListener::bind(addr)
        .await
        .map_err(|source| TestkitError::Listen { addr, source })
}

fn local_url(listener: &TcpListener) -> Result<String, TestkitError> {
    let addr = listener
        .local_addr()
        .map_err(|source| TestkitError::Listen {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            source,
        })?;
    Ok(format!("http://{addr}"))
}
