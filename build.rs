//! Generates the `tcc.v1` gRPC code from `proto/`.
//!
//! protoc comes from `$PROTOC` when set, else from the `protoc-bin-vendored` crate,
//! so a fresh machine builds with nothing installed beyond cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "proto/tcc/v1/admin.proto",
        "proto/tcc/v1/common.proto",
        "proto/tcc/v1/coordinator.proto",
        "proto/tcc/v1/participant.proto",
        "proto/tcc/v1/payments.proto",
        "proto/tcc/v1/resource_admin.proto",
    ];
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("tcc_v1_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    // sqlx::migrate! embeds the migrations: a new file must rebuild the crate.
    println!("cargo:rerun-if-changed=migrations");
    Ok(())
}
