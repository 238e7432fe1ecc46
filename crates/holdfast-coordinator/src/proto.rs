//! The generated `tcc.v1` types, clients and servers: the `holdfast-proto` crate, under the
//! name the rest of this crate uses.
//!
//! Only the API layer and the participant SDK's service should touch these; the rest of the
//! crate speaks domain types.

pub use holdfast_proto::*;
