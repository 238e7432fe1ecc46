//! The caller's side of API keys: an interceptor that presents `authorization: Bearer <key>`
//! on every call (SPEC 7.2), marked sensitive so it never shows in debug output or logs.

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;

/// Adds `authorization: Bearer <key>` to every call (nothing without a key).
#[derive(Clone, Debug, Default)]
pub struct Bearer(Option<AsciiMetadataValue>);

/// An API key that cannot travel in a header.
#[derive(Debug, thiserror::Error)]
#[error("an API key must be printable ASCII")]
pub struct UnprintableKey;

impl Bearer {
    /// Presents `key`.
    pub fn new(key: &str) -> Result<Bearer, UnprintableKey> {
        let mut value =
            AsciiMetadataValue::try_from(format!("Bearer {key}")).map_err(|_| UnprintableKey)?;
        value.set_sensitive(true);
        Ok(Bearer(Some(value)))
    }

    /// Presents `key` when there is one.
    pub fn optional(key: Option<&str>) -> Result<Bearer, UnprintableKey> {
        key.map_or(Ok(Bearer::default()), Bearer::new)
    }

    /// Whether calls carry a key.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presents_the_key_and_refuses_what_a_header_cannot_carry() {
        let mut bearer = Bearer::new("k-123").unwrap();
        let request = bearer.call(tonic::Request::new(())).unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer k-123"
        );
        assert!(!format!("{bearer:?}").contains("k-123"));
        assert!(Bearer::new("line\nbreak").is_err());
        let mut none = Bearer::default();
        assert!(
            none.call(tonic::Request::new(()))
                .unwrap()
                .metadata()
                .is_empty()
        );
    }
}
