//! The `tcc.v1` API of holdfast, generated from the repository's `proto/`: messages, gRPC
//! clients and servers of `Coordinator`, `Admin`, `Participant`, `Payments`, `ResourceAdmin` and
//! `Testing` (served only in test mode), and the encoded descriptor set (for reflection and breaking-change checks).
//!
//! Versioning: see CHANGELOG.md at the repository root. `tcc.v1` only grows (new fields, new
//! methods, new enum values); anything else is `tcc.v2`.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("tcc.v1");

/// Encoded file descriptor set of `tcc.v1`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tcc_v1_descriptor");
