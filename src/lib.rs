//! holdfast: a Try-Confirm/Cancel coordinator for time-limited reservations.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

pub mod participant;
pub mod participants;
pub mod proto;
pub mod server;
