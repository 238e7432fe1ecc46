//! `sqlx::migrate!` embeds the barrier's migrations, so a new file must rebuild the crate.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
