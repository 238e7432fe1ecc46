//! The network between the coordinator and a participant: `holdfast-testkit`'s TCP relay
//! (`cut`, `restore`, `hold_replies`).

pub use holdfast_testkit::Relay;
