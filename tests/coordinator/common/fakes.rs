//! In-test participants: `holdfast-testkit`'s fakes (real tonic servers of `tcc.v1.Participant`
//! on loopback that record every call and its answer in a shared log, keep the business
//! effects they applied per branch, and can be told at any time to reject, fail, stall or
//! answer late), under the names these tests use.

pub use holdfast_testkit::fake::{Call, CallLog, FakeBranch, Fakes, spawn_fake, spawn_fakes};
