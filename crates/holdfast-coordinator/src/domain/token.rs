//! Hold tokens: the secret a holder needs to confirm, cancel or extend (SPEC 7.3).
//!
//! A token is never stored. It is derived from the reservation id with a keyed hash
//! (HMAC-SHA-256 under one of the [`TokenKeys`], named by key id), so a repeat Reserve by the
//! reservation's own principal can answer it again; the database keeps only a [`TokenCheck`]:
//! the SHA-256 digest of the token (which verifies a presented token and cannot be turned
//! back into one) and the id of the key that derived it. Whoever reads the database learns no
//! token; whoever holds the keys but not the database cannot know which ids exist.

use std::collections::HashMap;
use std::fmt;

use ring::hmac;
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::validate::FieldError;

/// What makes a derived token specific to holdfast's hold tokens (domain separation).
const DERIVATION_CONTEXT: &[u8] = b"holdfast hold token v1\0";

/// A hold token: 256 bits, hex-encoded. `Debug` never shows it. Lives only for one request.
#[derive(Clone, PartialEq, Eq)]
pub struct HoldToken(String);

impl HoldToken {
    /// A fresh random token from the operating system's CSPRNG (tests, and a last resort).
    pub fn generate() -> Result<HoldToken, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(HoldToken(hex(&bytes)))
    }

    /// The secret itself, for the Reserve answer only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the store keeps of this token: its digest, and the key that derived it.
    pub fn check(&self, key_id: Option<&str>) -> TokenCheck {
        TokenCheck::of(&self.0, key_id.map(str::to_owned))
    }
}

impl fmt::Debug for HoldToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HoldToken(<redacted>)")
    }
}

/// A hold token as a caller presented it: its shape checked once at the edge
/// ([`PresentedToken::parse`]), its value compared by the store in constant time. `Debug` never
/// shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct PresentedToken(String);

impl PresentedToken {
    /// A presented token: required, at most 256 bytes (the error names `hold_token`).
    pub fn parse(value: impl Into<String>) -> Result<PresentedToken, FieldError> {
        let value = value.into();
        super::validate::hold_token(&value)?;
        Ok(PresentedToken(value))
    }

    /// The secret itself, for the constant-time comparison only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<HoldToken> for PresentedToken {
    fn from(token: HoldToken) -> PresentedToken {
        PresentedToken(token.0)
    }
}

impl fmt::Debug for PresentedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PresentedToken(<redacted>)")
    }
}

/// What verifies a hold token without revealing it: the SHA-256 of the token, and the id of the
/// key it was derived with (`None` for tokens issued before derivation, which a repeat Reserve
/// cannot answer again).
#[derive(Clone, PartialEq, Eq)]
pub struct TokenCheck {
    pub digest: [u8; 32],
    pub key_id: Option<String>,
}

impl TokenCheck {
    /// The check of a token given as text.
    pub fn of(token: &str, key_id: Option<String>) -> TokenCheck {
        TokenCheck {
            digest: sha256(token.as_bytes()),
            key_id,
        }
    }

    /// Whether `presented` is the token, compared in constant time.
    pub fn verifies(&self, presented: &str) -> bool {
        sha256(presented.as_bytes()).ct_eq(&self.digest).into()
    }

    /// The stored digest as bytes; `digest` is the same as a fixed array.
    pub fn from_stored(digest: &[u8], key_id: Option<String>) -> Option<TokenCheck> {
        Some(TokenCheck {
            digest: digest.try_into().ok()?,
            key_id,
        })
    }
}

impl fmt::Debug for TokenCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCheck")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The keys hold tokens are derived with, by key id; one of them derives new tokens. Shared by
/// every coordinator replica (`--token-secret-file`); rotating adds a key and makes it current,
/// keeping the old ones so earlier reservations' tokens can still be answered.
#[derive(Clone)]
pub struct TokenKeys {
    current: String,
    current_key: hmac::Key,
    keys: HashMap<String, hmac::Key>,
}

/// A key set that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenKeysError {
    #[error("key {0:?}: the secret must be at least 32 bytes (64 hex digits)")]
    ShortSecret(String),
    #[error("the current key {0:?} is not among the keys")]
    NoCurrent(String),
    #[error("key id {0:?} must be 1 to 64 characters of a-z, A-Z, 0-9, '-', '_', '.'")]
    BadKeyId(String),
    #[error("no randomness for an ephemeral key: {0}")]
    Random(getrandom::Error),
}

impl TokenKeys {
    /// Keys from `(key id, secret)` pairs; `current` derives new tokens.
    pub fn new<'a>(
        current: &str,
        keys: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<TokenKeys, TokenKeysError> {
        let mut out = HashMap::new();
        for (id, secret) in keys {
            if id.is_empty()
                || id.len() > 64
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(TokenKeysError::BadKeyId(id.to_owned()));
            }
            if secret.len() < 32 {
                return Err(TokenKeysError::ShortSecret(id.to_owned()));
            }
            out.insert(id.to_owned(), hmac::Key::new(hmac::HMAC_SHA256, secret));
        }
        let current_key = out
            .get(current)
            .cloned()
            .ok_or_else(|| TokenKeysError::NoCurrent(current.to_owned()))?;
        Ok(TokenKeys {
            current: current.to_owned(),
            current_key,
            keys: out,
        })
    }

    /// One random key known only to this process: tokens it derives cannot be answered again
    /// by another replica or after a restart.
    pub fn ephemeral() -> Result<TokenKeys, TokenKeysError> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(TokenKeysError::Random)?;
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).map_err(TokenKeysError::Random)?;
        let id = format!("ephemeral-{}", hex(&id));
        TokenKeys::new(&id, [(id.as_str(), secret.as_slice())])
    }

    /// The token of reservation `id` under the current key, and what the store keeps of it.
    pub fn issue(&self, id: Uuid) -> (HoldToken, TokenCheck) {
        let token = derive(&self.current_key, id);
        let check = token.check(Some(&self.current));
        (token, check)
    }

    /// The token of reservation `id` again, if the key that derived it is known here and the
    /// result still matches the stored check.
    pub fn reissue(&self, id: Uuid, check: &TokenCheck) -> Option<HoldToken> {
        let token = self.derive_with(check.key_id.as_deref()?, id)?;
        check.verifies(token.expose()).then_some(token)
    }

    /// The id of the key new tokens are derived with.
    pub fn current_key_id(&self) -> &str {
        &self.current
    }

    fn derive_with(&self, key_id: &str, id: Uuid) -> Option<HoldToken> {
        Some(derive(self.keys.get(key_id)?, id))
    }
}

/// HMAC-SHA-256 of the reservation id under `key`, with holdfast's context.
fn derive(key: &hmac::Key, id: Uuid) -> HoldToken {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(DERIVATION_CONTEXT);
    ctx.update(id.as_bytes());
    HoldToken(hex(ctx.sign().as_ref()))
}

impl fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("TokenKeys")
            .field("current", &self.current)
            .field("keys", &ids)
            .finish()
    }
}

// SHA-256 and hex are spelled once, in the serving crate (API key digests use them too).
pub use holdfast_serve::digest::{from_hex, hex, sha256};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presented_token_is_checked_once_and_never_shown() {
        let t = PresentedToken::parse("s3cret-token").unwrap();
        assert!(!format!("{t:?}").contains("s3cret"));
        assert_eq!(t.expose(), "s3cret-token");
        assert_eq!(PresentedToken::parse("").unwrap_err().field, "hold_token");
        let long = PresentedToken::parse("t".repeat(257)).unwrap_err();
        assert_eq!(long.field, "hold_token");
    }

    #[test]
    fn tokens_are_long_distinct_and_redacted() {
        let a = HoldToken::generate().unwrap();
        let b = HoldToken::generate().unwrap();
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        let check = a.check(None);
        assert!(check.verifies(a.expose()));
        assert!(!check.verifies(b.expose()));
        assert!(!check.verifies(""));
        assert!(!format!("{a:?}").contains(a.expose()));
        assert!(!format!("{check:?}").contains(&hex(&check.digest)));
    }

    #[test]
    fn derived_tokens_are_per_reservation_and_per_key_and_reissue_only_with_the_key() {
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let keys = TokenKeys::new("k1", [("k1", k1.as_slice()), ("k2", k2.as_slice())]).unwrap();
        let (id_a, id_b) = (Uuid::now_v7(), Uuid::now_v7());
        let (a, check_a) = keys.issue(id_a);
        let (b, _) = keys.issue(id_b);
        assert_ne!(a, b);
        assert_eq!(check_a.key_id.as_deref(), Some("k1"));
        assert!(check_a.verifies(a.expose()));
        assert_eq!(keys.reissue(id_a, &check_a), Some(a.clone()));
        // The check of another reservation does not reissue this one's token.
        assert_eq!(keys.reissue(id_b, &check_a), None);
        // Rotated: k2 current, k1 kept: old tokens are still answered, new ones differ.
        let rotated = TokenKeys::new("k2", [("k1", k1.as_slice()), ("k2", k2.as_slice())]).unwrap();
        assert_eq!(rotated.reissue(id_a, &check_a), Some(a.clone()));
        assert_ne!(rotated.issue(id_a).0, a);
        // Without the key, nothing is answered.
        let other = TokenKeys::new("k2", [("k2", k2.as_slice())]).unwrap();
        assert_eq!(other.reissue(id_a, &check_a), None);
        assert_eq!(keys.reissue(id_a, &a.check(None)), None);
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(from_hex(&hex(&bytes)).as_deref(), Some(bytes.as_slice()));
        assert_eq!(from_hex("ABff").as_deref(), Some([0xab, 0xff].as_slice()));
        for bad in ["abc", "+f", "0g", " 0"] {
            assert_eq!(from_hex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn weak_or_inconsistent_key_sets_are_refused() {
        assert!(matches!(
            TokenKeys::new("k", [("k", [0u8; 31].as_slice())]),
            Err(TokenKeysError::ShortSecret(_))
        ));
        assert!(matches!(
            TokenKeys::new("x", [("k", [0u8; 32].as_slice())]),
            Err(TokenKeysError::NoCurrent(_))
        ));
        assert!(matches!(
            TokenKeys::new("a b", [("a b", [0u8; 32].as_slice())]),
            Err(TokenKeysError::BadKeyId(_))
        ));
        assert!(TokenKeys::ephemeral().is_ok());
    }
}
