//! holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

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
