//! holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

// The serving layer's `sqlite_now_us!` macro, in scope for every module below.
#[macro_use]
extern crate holdfast_serve;

// The serving layer (every port, every database pool) and the participant SDK are crates of
// their own (`crates/holdfast-serve`, `crates/holdfast-participant`), so a participant team
// depends on them without the coordinator; here under the paths the code has always used.
pub use holdfast_participant as participant;
pub use holdfast_serve::{auth, conn, db, server, tls, watched};

pub mod api;
pub mod app;
pub mod bench;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod domain;
pub mod http;
pub mod json;
pub mod participant_check;
pub mod participants;
pub mod proto;
pub mod registry;
pub mod store;
pub mod telemetry;
pub mod testing;

#[cfg(test)]
mod tidy;
