//! holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

/// SQLite's clock now, in integer microseconds since the Unix epoch (millisecond resolution,
/// fixed for one statement step): the participants' "now" on SQLite. A macro so statements
/// stay `&'static str`.
macro_rules! sqlite_now_us {
    () => {
        "(CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000)"
    };
}

pub mod api;
pub mod app;
pub mod bench;
pub mod config;
pub mod coordinator;
pub mod domain;
pub mod participant;
pub mod participants;
pub mod proto;
pub mod registry;
pub mod server;
pub mod store;
pub mod telemetry;
