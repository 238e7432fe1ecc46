//! holdfast-serve: what every holdfast service process stands on, the coordinator and every
//! participant alike (participants written by other teams included, through
//! `holdfast-participant`).
//!
//! - [`server`]: one gRPC port - TLS when configured, the auth layer, health, reflection of
//!   the port's own services, the overload layers, a trace span per call; and the in-process
//!   path to the same routes.
//! - [`conn`]: what an idle or slow peer can hold on any listener: a connection cap, a
//!   header timeout, an idle timeout.
//! - [`tls`]: transport security in one place (served certificates, client CAs, the
//!   `https://` connector, one ring crypto provider); [`watched`]: files re-read on change.
//! - [`auth`]: API keys and roles, who calls and whether they may (`--auth-keys`).
//! - [`db`]: PostgreSQL and SQLite pools with holdfast's conventions, and SQLite's clock in SQL
//!   ([`sqlite_now_us!`]).
//! - [`background`]: a service's long-running loops, started again should one panic.
//! - [`propagation`]: W3C trace context in and out of calls (the OpenTelemetry API only: a
//!   process that exports traces installs the SDK and says so with [`propagation::enable`]).
//!
//! Never depends on the coordinator, its store, Redis or the OpenTelemetry SDK.

// First, so its `sqlite_now_us!` macro is in scope for every module below.
#[macro_use]
pub mod db;

pub mod auth;
pub mod background;
pub mod conn;
pub mod digest;
pub mod propagation;
pub mod server;
pub mod tls;
pub mod watched;
