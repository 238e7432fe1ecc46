//! holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations; this crate is the
//! `holdfast` binary's library: the wiring of each role (`app`), its configuration, the HTTP
//! listener, the CLI, `holdfast bench` and `holdfast participant-check`.
//!
//! See `ARCHITECTURE.md` for the map of the workspace.

// The layers below (crates of their own, see the workspace's Cargo.toml), here under the paths
// the code has always used: the serving layer, the participant SDK, the coordinator and the
// reference participants.
pub use holdfast_coordinator::{
    api, background, coordinator, domain, proto, registry, store, telemetry,
};
pub use holdfast_participant as participant;
pub use holdfast_participants as participants;
pub use holdfast_serve::{auth, conn, db, server, tls, watched};

pub mod app;
pub mod bench;
pub mod cli;
pub mod config;
pub mod http;
pub mod json;
pub mod participant_check;
pub mod sinks;

/// Test mode (`holdfast --test-mode`, the testkit): the coordinator crate's movable clock and
/// the reference participants' databases opened with it.
pub mod testing {
    pub use holdfast_coordinator::testing::*;
    pub use holdfast_participants::testing::{open_participant_db, serve_test_participant};
}

#[cfg(test)]
mod tidy;
