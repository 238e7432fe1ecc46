//! Each participant as the console's Participants view shows it: where it is reached, whether
//! its health service answers SERVING now and how fast, and the last error a call to it met
//! (kept after it answers again, with when, so an on-call engineer sees what happened).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::Registry;

/// One participant's health now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParticipantHealth {
    pub name: String,
    pub url: String,
    /// Its health service answered SERVING.
    pub serving: bool,
    /// How long the health check took (its deadline when it did not answer).
    pub latency: Duration,
    /// The last failed call's error and when it failed, if any call ever did.
    pub last_error: Option<(String, SystemTime)>,
}

/// The last error of a participant's calls.
#[derive(Debug, Default)]
pub(super) struct LastError(Mutex<Option<(String, SystemTime)>>);

impl LastError {
    pub(super) fn record(&self, message: &str) {
        let now = Some((message.to_owned(), SystemTime::now()));
        match self.0.lock() {
            Ok(mut last) => *last = now,
            Err(poisoned) => *poisoned.into_inner() = now,
        }
    }

    fn get(&self) -> Option<(String, SystemTime)> {
        match self.0.lock() {
            Ok(last) => last.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl Registry {
    /// Every registered participant's health, asked in parallel (each within a second;
    /// recorded like any call), by name.
    pub async fn health(&self) -> Vec<ParticipantHealth> {
        let checks = self.participants.values().map(|p| async move {
            let started = Instant::now();
            let serving = p.probe().await;
            ParticipantHealth {
                name: p.name.clone(),
                url: p.url.clone(),
                serving,
                latency: started.elapsed(),
                last_error: p.last_error.get(),
            }
        });
        let mut answers = futures_util::future::join_all(checks).await;
        answers.sort_by(|a, b| a.name.cmp(&b.name));
        answers
    }
}
