//! Test a saga against holdfast without starting the binary or sleeping through real ttls
//! (SPEC 9).
//!
//! ```no_run
//! # async fn demo() -> Result<(), holdfast_testkit::TestkitError> {
//! use std::time::Duration;
//! use holdfast_testkit::{Harness, Kind, Script};
//! use holdfast_client::{Hold, Reserve};
//!
//! let harness = Harness::builder()
//!     .participants([Kind::Seats])
//!     .resources("seats", [("A1", 1)])
//!     .fake("loyalty", Script::new().fail_next(2))
//!     .start()
//!     .await?;
//! let held = harness
//!     .client()
//!     .reserve(Reserve::new("order-1", "alice").hold(Hold::new("seats", "A1")).ttl(Duration::from_secs(600)))
//!     .await?;
//! harness.advance(Duration::from_secs(601)).await?; // the hold expires, no sleep
//! # Ok(()) }
//! ```
//!
//! - [`Harness`]: a coordinator with reference participants ([`Kind`]) and scripted fakes, on
//!   a temporary SQLite folder or a PostgreSQL database, each participant behind a [`Relay`]
//!   ([`Harness::cut`] / [`Harness::heal`]); [`Harness::kill_coordinator`] and
//!   [`Harness::restart`]; [`Harness::advance`] moves the clock expiry, the reaper and orphan
//!   reclaim read; with [`HarnessBuilder::principal`], authentication on and a client per
//!   principal ([`Harness::client_as`]); with [`HarnessBuilder::tls`], the coordinator on TLS
//!   under a CA of the harness's own ([`Harness::tls_ca_pem`]), and with
//!   [`HarnessBuilder::mutual_tls`] a client certificate per principal
//!   ([`Harness::client_certificate`]); [`Harness::events`] is the event log so far (SPEC 10), and
//!   the client's `events` stream follows it live.
//! - [`FakeParticipant`]: a `tcc.v1.Participant` that plays a [`Script`] (reject, fail with
//!   `UNAVAILABLE` n times, stall, answer after the coordinator gave up) and records every
//!   call with its answer ([`CallLog`]).

mod access;
mod builder;
mod coordinator;
mod data;
mod error;
pub mod fake;
mod harness;
#[cfg(feature = "reference-participants")]
mod reference;
mod relay;
mod tls;

pub use builder::HarnessBuilder;
pub use error::TestkitError;
pub use fake::{Answer, Call, CallLog, FakeParticipant, Script};
pub use harness::{Advanced, Harness};
pub use holdfast_client as client;
#[cfg(feature = "reference-participants")]
pub use holdfast_participants::Kind;
pub use holdfast_serve::auth::Role;
pub use relay::Relay;
