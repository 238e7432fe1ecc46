//! Generates the `tcc.v1` gRPC code from the crate's `proto/` folder (in the repository a link
//! to the root's `proto/`; in the packaged crate a copy of it): the only place in the workspace
//! that runs protoc.
//!
//! protoc comes from `$PROTOC` when set, else from the `protoc-bin-vendored` crate,
//! so a fresh machine builds with nothing installed beyond cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let root = std::path::Path::new("proto");
    let protos: Vec<_> = [
        "admin.proto",
        "common.proto",
        "coordinator.proto",
        "events.proto",
        "participant.proto",
        "payments.proto",
        "resource_admin.proto",
        "testing.proto",
    ]
    .iter()
    .map(|f| root.join("tcc/v1").join(f))
    .collect();
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("tcc_v1_descriptor.bin"))
        .compile_protos(&protos, &[root.to_path_buf()])?;
    println!("cargo:rerun-if-changed=proto/tcc");
    Ok(())
}
