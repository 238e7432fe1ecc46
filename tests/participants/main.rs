//! Integration tests of the participant SDK and the reference participants: real Postgres
//! (a fresh database per test through `#[sqlx::test]`), real gRPC on loopback.

mod barrier;
mod barrier_plans;
mod batched;
mod check;
mod checks;
mod common;
mod conservation;
mod extend;
#[path = "../shared/folded_checks.rs"]
mod folded_checks;
#[path = "../shared/generic_plans.rs"]
mod generic_plans;
mod hold_lost;
mod leaving;
mod max_hold;
mod noop;
mod open_listen;
#[path = "../shared/parallel.rs"]
mod parallel;
mod payments;
mod retention;
mod rooms;
mod sdk_crate;
mod seats;
mod settle_in_one;
mod stock;
mod stock_redis;
