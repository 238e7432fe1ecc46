//! The principals file of `--auth-keys` (SPEC 7.2): who may call, with which roles, proven by
//! an API key (only its SHA-256 is in the file) or by a verified client certificate's identity.
//!
//! ```toml
//! [[principal]]
//! name = "order-service"
//! roles = ["client"]
//! key_sha256 = "9f86d08..."
//! [[principal]]
//! name = "coordinator"
//! roles = ["coordinator"]
//! tls_identity = "coordinator.holdfast.internal"
//! ```

use std::collections::HashSet;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use super::{Caller, Role};

/// Longest principal name (it is stored with every reservation).
const MAX_NAME_BYTES: usize = 128;

/// One `[[principal]]`.
#[derive(Clone, Debug)]
struct Principal {
    caller: Caller,
    key_sha256: Option<[u8; 32]>,
    tls_identity: Option<String>,
}

/// Every principal of the file.
#[derive(Clone, Debug, Default)]
pub struct Principals {
    principals: Vec<Principal>,
}

impl Principals {
    /// Parses the file's text; an error names the entry and the field.
    pub fn parse(text: &str) -> Result<Principals, String> {
        let table: toml::Table = text.parse().map_err(|e| format!("not valid TOML: {e}"))?;
        if let Some(other) = table.keys().find(|k| *k != "principal") {
            return Err(format!(
                "unknown setting `{other}` (the file holds [[principal]] entries only)"
            ));
        }
        let entries = match table.get("principal") {
            None => &Vec::new(),
            Some(toml::Value::Array(entries)) => entries,
            Some(_) => return Err("`principal` must be an array of tables ([[principal]])".into()),
        };
        let mut principals = Vec::with_capacity(entries.len());
        let (mut names, mut keys, mut identities) =
            (HashSet::new(), HashSet::new(), HashSet::new());
        for (i, entry) in entries.iter().enumerate() {
            let p = parse_entry(entry).map_err(|e| format!("principal[{i}]: {e}"))?;
            let name = p.caller.principal().to_owned();
            if !names.insert(name.clone()) {
                return Err(format!("principal[{i}]: name {name:?} is used twice"));
            }
            if let Some(k) = p.key_sha256
                && !keys.insert(k)
            {
                return Err(format!(
                    "principal[{i}] ({name}): key_sha256 is also another principal's"
                ));
            }
            if let Some(id) = &p.tls_identity
                && !identities.insert(id.clone())
            {
                return Err(format!(
                    "principal[{i}] ({name}): tls_identity {id:?} is also another principal's"
                ));
            }
            principals.push(p);
        }
        Ok(Principals { principals })
    }

    /// How many principals there are.
    pub fn len(&self) -> usize {
        self.principals.len()
    }

    /// Whether the file names no principal (then nobody can call).
    pub fn is_empty(&self) -> bool {
        self.principals.is_empty()
    }

    /// The principal whose API key this is. Every entry is compared, in constant time, so the
    /// time taken says nothing about which (or whether one) matched.
    pub fn by_key(&self, presented: &str) -> Option<&Caller> {
        let digest = crate::digest::sha256(presented.as_bytes());
        let mut found = None;
        for p in &self.principals {
            if let Some(k) = &p.key_sha256
                && bool::from(k.ct_eq(&digest))
            {
                found = Some(&p.caller);
            }
        }
        found
    }

    /// The principal a verified client certificate with these identities (DNS SANs, CN) is.
    pub(crate) fn by_identity<'a>(
        &self,
        identities: impl IntoIterator<Item = &'a str>,
    ) -> Option<&Caller> {
        let identities: Vec<&str> = identities.into_iter().collect();
        self.principals.iter().find_map(|p| {
            let wanted = p.tls_identity.as_deref()?;
            identities
                .iter()
                .any(|id| id.eq_ignore_ascii_case(wanted))
                .then_some(&p.caller)
        })
    }
}

fn parse_entry(entry: &toml::Value) -> Result<Principal, String> {
    let toml::Value::Table(t) = entry else {
        return Err("must be a table".into());
    };
    if let Some(other) = t
        .keys()
        .find(|k| !matches!(k.as_str(), "name" | "roles" | "key_sha256" | "tls_identity"))
    {
        return Err(format!(
            "unknown field `{other}` (known: name, roles, key_sha256, tls_identity)"
        ));
    }
    let name = match t.get("name") {
        Some(toml::Value::String(n)) if !n.trim().is_empty() => n.clone(),
        _ => return Err("`name` is required (a non-empty string)".into()),
    };
    if name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(format!(
            "name {name:?} must be at most {MAX_NAME_BYTES} bytes without control characters"
        ));
    }
    let roles = match t.get("roles") {
        Some(toml::Value::Array(roles)) if !roles.is_empty() => roles
            .iter()
            .map(|r| match r {
                toml::Value::String(r) => Role::parse(r),
                _ => Err("`roles` must be strings".to_owned()),
            })
            .collect::<Result<Vec<Role>, String>>()
            .map_err(|e| format!("({name}): {e}"))?,
        _ => {
            return Err(format!(
                "({name}): `roles` is required: a list of client, admin, coordinator, metrics"
            ));
        }
    };
    let key_sha256 = match t.get("key_sha256") {
        None => None,
        Some(toml::Value::String(hex)) => Some(parse_sha256(hex).ok_or_else(|| {
            format!("({name}): key_sha256 must be 64 hex digits (the SHA-256 of the key)")
        })?),
        Some(_) => return Err(format!("({name}): key_sha256 must be a string")),
    };
    let tls_identity = match t.get("tls_identity") {
        None => None,
        Some(toml::Value::String(id)) if !id.trim().is_empty() => Some(id.clone()),
        Some(_) => return Err(format!("({name}): tls_identity must be a non-empty string")),
    };
    if key_sha256.is_none() && tls_identity.is_none() {
        return Err(format!(
            "({name}): needs key_sha256 or tls_identity (how the principal proves who it is)"
        ));
    }
    Ok(Principal {
        caller: Caller::new(Arc::from(name.as_str()), &roles),
        key_sha256,
        tls_identity,
    })
}

/// A SHA-256 written as 64 hex digits.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    crate::digest::from_hex(hex.trim())?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::{hex, sha256};

    fn file(key: &str) -> String {
        format!(
            "[[principal]]\nname = \"orders\"\nroles = [\"client\"]\nkey_sha256 = \"{}\"\n\
             [[principal]]\nname = \"coordinator\"\nroles = [\"coordinator\"]\n\
             tls_identity = \"coordinator.holdfast.internal\"\n",
            hex(&sha256(key.as_bytes()))
        )
    }

    #[test]
    fn keys_and_identities_find_their_principal_and_nothing_else() {
        let p = Principals::parse(&file("secret-key")).unwrap();
        assert_eq!(p.len(), 2);
        let orders = p.by_key("secret-key").unwrap();
        assert_eq!(orders.principal(), "orders");
        assert!(orders.has(Role::Client) && !orders.has(Role::Admin));
        assert!(p.by_key("secret-kez").is_none());
        assert!(p.by_key("").is_none());
        let c = p
            .by_identity(["other.example", "COORDINATOR.holdfast.internal"])
            .unwrap();
        assert!(c.has(Role::Coordinator));
        assert!(p.by_identity(["orders"]).is_none());
    }

    #[test]
    fn a_bad_file_says_which_entry_and_field() {
        let bad = [
            (
                "[[principal]]\nroles = [\"client\"]\nkey_sha256 = \"00\"",
                "principal[0]: `name`",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"root\"]\ntls_identity = \"x\"",
                "unknown role",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"client\"]",
                "needs key_sha256 or tls_identity",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"client\"]\nkey_sha256 = \"abc\"",
                "64 hex digits",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"client\"]\nkey = \"abc\"",
                "unknown field `key`",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"client\"]\ntls_identity = \"x\"\n[[principal]]\nname = \"a\"\nroles = [\"admin\"]\ntls_identity = \"y\"",
                "used twice",
            ),
            (
                "[[principals]]\nname = \"a\"",
                "unknown setting `principals`",
            ),
        ];
        for (text, expected) in bad {
            let e = Principals::parse(text).unwrap_err();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
    }
}
