//! One group transaction's outcome: its COMMIT's result, published once to every member
//! ([`Group`]), "unknown" should its committer be cancelled first ([`Unpublished`]), and what a
//! member makes of it ([`await_group`]).

use std::sync::Arc;

use tokio::sync::watch;

use super::Writer;

/// One group transaction: its COMMIT's outcome, published once for every member.
pub(super) struct Group {
    outcome: watch::Sender<Option<Result<(), String>>>,
}

impl Group {
    pub(super) fn new() -> Arc<Group> {
        Arc::new(Group {
            outcome: watch::Sender::new(None),
        })
    }

    pub(super) fn publish(&self, outcome: &Result<(), sqlx::Error>) {
        let outcome = outcome.as_ref().map(|_| ()).map_err(ToString::to_string);
        self.outcome.send_replace(Some(outcome));
    }
}

/// Publishes "outcome unknown" to a group's members if the COMMIT's caller is cancelled before
/// it could publish the real outcome (a member never waits for an answer that cannot come).
/// The transaction may then still be open on the connection: it is ended soon
/// ([`Writer::clean_up_soon`]).
pub(super) struct Unpublished {
    pub(super) group: Option<Arc<Group>>,
    pub(super) writer: Arc<Writer>,
}

impl Unpublished {
    pub(super) fn publish(mut self, outcome: &Result<(), sqlx::Error>) {
        if let Some(group) = self.group.take() {
            group.publish(outcome);
        }
    }
}

impl Drop for Unpublished {
    fn drop(&mut self) {
        if let Some(group) = self.group.take() {
            group.publish(&Err(group_failed(
                "its COMMIT was cancelled; the outcome is unknown",
            )));
            self.writer.clean_up_soon();
        }
    }
}

/// The error a member sees when the group it finished in did not commit.
pub(super) fn group_failed(reason: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!(
        "the SQLite group commit this write was part of failed: {reason}"
    )))
}

/// Waits for `group`'s COMMIT: by its last member, or by the clean-up should the queue
/// have emptied without one ([`Writer::clean_up_soon`]).
pub(super) async fn await_group(group: Arc<Group>) -> Result<(), sqlx::Error> {
    let mut outcome = group.outcome.subscribe();
    match outcome.wait_for(Option::is_some).await.as_deref() {
        Ok(Some(Ok(()))) => Ok(()),
        Ok(Some(Err(reason))) => Err(group_failed(reason)),
        Ok(None) | Err(_) => Err(group_failed("no outcome was published")),
    }
}
