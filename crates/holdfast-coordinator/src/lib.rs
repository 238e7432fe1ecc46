//! holdfast-coordinator: the coordinator of Try-Confirm/Cancel reservations as a library.
//!
//! `domain` (the rules, no I/O), `store` (PostgreSQL and SQLite), `registry` (participants
//! over gRPC), `coordinator` (the lifecycle, recovery, retention), `api` (the tcc.v1
//! Coordinator, Admin and Testing services), `telemetry` (logs, traces, metrics), `testing`
//! (test mode's movable clock) and `serving` (all of them wired on one port). The `holdfast`
//! binary and `holdfast-testkit` build on it; it never names the reference participants.

// The serving layer's `sqlite_now_us!` macro, in scope for every module below.
#[macro_use]
extern crate holdfast_serve;

// The serving layer (every port, every database pool) and the participant SDK, under the
// paths the code has always used.
pub use holdfast_participant as participant;
pub use holdfast_serve::{auth, background, conn, db, server, tls, watched};

pub mod api;
pub mod coordinator;
pub mod domain;
pub mod events;
pub mod proto;
pub mod registry;
pub mod serving;
pub mod store;
pub mod telemetry;
pub mod testing;
