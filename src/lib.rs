//! holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

// First, so its `sqlite_now_us!` macro is in scope for every module below.
#[macro_use]
pub mod db;

pub mod api;
pub mod app;
pub mod auth;
pub mod bench;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod domain;
pub mod http;
pub mod json;
pub mod participant;
pub mod participant_check;
pub mod participants;
pub mod proto;
pub mod registry;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod testing;
pub mod tls;
pub mod watched;

#[cfg(test)]
mod tidy;
