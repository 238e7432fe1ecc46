//! The coordinator suite: a real coordinator over gRPC on loopback, a fresh Postgres database
//! per test, and in-test participants that record their calls; `process/` runs the real
//! `holdfast` binary as a child process (crashes, configuration, the bench).

mod common;
#[path = "../shared/parallel.rs"]
mod parallel;
mod real;

mod admin;
mod auth;
mod backoff;
mod caller_deadline;
mod cli;
mod client;
mod concurrency;
mod concurrent_payments;
mod confirm_edge;
mod connections;
mod db_clock;
mod end_to_end;
mod error_classes;
mod events;
mod example;
mod extend;
mod extend_edge;
mod fanout;
mod http;
mod invalid_holds;
mod late_partial;
mod late_payment;
mod lifecycle;
mod limits;
mod list_filters;
mod migrate;
mod nats;
mod overload;
mod payment_binding;
mod process;
mod recovery;
mod refund_failures;
mod retention;
mod retry_info;
mod service;
mod sold_out;
mod testing;
mod tls;
mod tracing;
mod unknown_try;
mod unregistered;
mod validation;
mod waitlist;
mod watch;
mod webhooks;
