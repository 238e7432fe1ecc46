//! Work stranded by the configuration: unfinished reservations waiting on a participant that is
//! no longer registered (removed since their holds were placed, or a payment participant that
//! owes a refund). The coordinator cannot finish them until the participant is registered
//! again (or a person settles them), so at start it says so: an ERROR per missing participant
//! with the count and a few reservation ids, and the gauge
//! `holdfast_unregistered_participant_backlog{participant}`. Everything else keeps working:
//! recovery drives such a reservation like any other whose participant fails (the call to the
//! missing participant fails at once, "not registered", recorded on its branch), retried with
//! the usual exponential backoff, so it never hot-loops.

use super::{Coordinator, Error};
use crate::store::Waiting;

/// How many example reservation ids the log names per missing participant.
const EXAMPLES: u32 = 5;

impl Coordinator {
    /// Counts the unfinished reservations waiting on participants that are not registered,
    /// logs each such participant at ERROR and sets its gauge. Answers what it found.
    pub async fn report_unregistered_backlog(&self) -> Result<Vec<Waiting>, Error> {
        let missing: Vec<Waiting> = self
            .store
            .waiting_on(EXAMPLES)
            .await?
            .into_iter()
            .filter(|w| self.registry.get(&w.participant).is_none())
            .collect();
        for w in &missing {
            let examples: Vec<String> = w.examples.iter().map(ToString::to_string).collect();
            tracing::error!(
                participant = %w.participant,
                reservations = w.reservations,
                examples = %examples.join(", "),
                "{} unfinished reservation(s) wait on participant {:?}, which is not registered: \
                 they cannot finish until it is registered again (or a person settles them)",
                w.reservations,
                w.participant
            );
            crate::telemetry::unregistered_backlog(&w.participant, w.reservations);
        }
        Ok(missing)
    }
}
