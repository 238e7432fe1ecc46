//! The generated `tcc.v1` types, clients and servers (from `proto/`).
//!
//! Only the API layer and the participant SDK's service should touch these; the rest of the
//! crate speaks domain types.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("tcc.v1");

/// Encoded file descriptor set of `tcc.v1`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tcc_v1_descriptor");
