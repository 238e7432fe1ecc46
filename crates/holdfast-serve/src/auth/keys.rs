//! `holdfast keys new NAME --role ROLE`: a fresh API key and the `[[principal]]` entry that
//! admits it (only the key's SHA-256 goes in the file), and `holdfast keys token-secret`: a
//! key for `--token-secret-file`.

use crate::digest::{hex, sha256};

use super::Role;

/// A new API key: 256 bits from the operating system, hex-encoded.
pub fn new_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex(&bytes))
}

/// The principals-file entry of `name` with `roles`, admitting `key`. (`name` is quoted as a
/// Rust string, which is TOML for the names `Principals::parse` accepts: no control
/// characters.)
pub fn principal_entry(name: &str, roles: &[Role], key: &str) -> String {
    let roles = roles
        .iter()
        .map(|r| format!("\"{}\"", r.name()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[[principal]]\nname = {name:?}\nroles = [{roles}]\nkey_sha256 = \"{}\"\n",
        hex(&sha256(key.as_bytes()))
    )
}

/// A `--token-secret-file` entry: key `id` with a fresh 256-bit secret, made current.
pub fn token_secret(id: &str) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "current = {id:?}\n\n[[key]]\nid = {id:?}\nsecret = \"{}\"\n",
        hex(&bytes),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_admitted_by_its_entry_only() {
        let key = new_key().unwrap();
        assert_eq!(key.len(), 64);
        let entry = principal_entry("orders \"east\"", &[Role::Client, Role::Admin], &key);
        assert!(!entry.contains(&key), "the key itself is never in the file");
        let p = super::super::Principals::parse(&entry).unwrap();
        let caller = p.by_key(&key).unwrap();
        assert_eq!(caller.principal(), "orders \"east\"");
        assert!(caller.has(Role::Admin));
        assert!(p.by_key(&new_key().unwrap()).is_none());
    }
}
