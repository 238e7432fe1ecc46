//! Hold tokens: the secret a holder needs to confirm, cancel or extend.

use std::fmt;

use subtle::ConstantTimeEq;

/// 256 random bits, hex-encoded. Compared in constant time; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct HoldToken(String);

impl HoldToken {
    /// A fresh token from the operating system's CSPRNG.
    pub fn generate() -> Result<HoldToken, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        let mut s = String::with_capacity(64);
        for b in bytes {
            s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
            s.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
        }
        Ok(HoldToken(s))
    }

    /// Wraps a stored token.
    pub fn from_stored(s: String) -> HoldToken {
        HoldToken(s)
    }

    /// Constant-time comparison with a presented token.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    /// The secret itself, for storing and for the Reserve answer only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for HoldToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HoldToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_distinct_and_redacted() {
        let a = HoldToken::generate().unwrap();
        let b = HoldToken::generate().unwrap();
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(a.matches(a.expose()));
        assert!(!a.matches(b.expose()));
        assert!(!a.matches(""));
        assert!(!format!("{a:?}").contains(a.expose()));
    }
}
