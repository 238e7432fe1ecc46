//! `sqlx::migrate!` embeds the reference participants' business schema, so a new migration
//! file must rebuild the crate.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
