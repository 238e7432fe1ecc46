//! Authentication in a harness, when the test names principals (SPEC 7.2): each gets a fresh
//! API key; the principals file the coordinator reads holds only the keys' SHA-256, in a
//! temporary folder removed with the harness. The harness calls as a principal of its own.

use holdfast_serve::auth::{Authenticator, Role, keys};

use crate::TestkitError;

/// The principal the harness itself (and [`crate::Harness::client`]) calls as: an admin, so
/// moving the clock and reading any reservation keep working with authentication on.
pub(crate) const HARNESS_PRINCIPAL: &str = "holdfast-testkit";

/// The principals of a harness with authentication on, and their keys.
pub(crate) struct Access {
    pub(crate) authenticator: Authenticator,
    /// `(principal, API key)`, the harness's own first.
    keys: Vec<(String, String)>,
    _folder: tempfile::TempDir,
}

/// The harness's own principal (an admin) first, then the test's, each name once.
pub(crate) fn everyone(
    principals: &[(String, Vec<Role>)],
) -> Result<Vec<(&str, &[Role])>, TestkitError> {
    let mut everyone: Vec<(&str, &[Role])> = vec![(HARNESS_PRINCIPAL, &[Role::Admin])];
    for (name, roles) in principals {
        if everyone.iter().any(|(named, _)| named == name) {
            return Err(TestkitError::DuplicatePrincipal(name.clone()));
        }
        everyone.push((name.as_str(), roles.as_slice()));
    }
    Ok(everyone)
}

impl Access {
    /// The principals' keys and the authenticator over them; `None` (authentication off) when
    /// the test named none.
    /// With `by_certificate` (mutual TLS) each principal is also admitted by a client
    /// certificate whose common name is its name.
    pub(crate) fn new(
        principals: &[(String, Vec<Role>)],
        by_certificate: bool,
    ) -> Result<Option<Access>, TestkitError> {
        if principals.is_empty() {
            return Ok(None);
        }
        let everyone = everyone(principals)?;
        let mut file = String::new();
        let mut keys: Vec<(String, String)> = Vec::with_capacity(everyone.len());
        for (name, roles) in everyone {
            let key = keys::new_key().map_err(|e| TestkitError::Auth(e.to_string()))?;
            file.push_str(&keys::principal_entry(name, roles, &key));
            if by_certificate {
                // The same table: the entry's last line is its key's digest.
                file.push_str(&format!("tls_identity = {name:?}\n"));
            }
            file.push('\n');
            keys.push((name.to_owned(), key));
        }
        let folder = tempfile::Builder::new()
            .prefix("holdfast-testkit-auth-")
            .tempdir()
            .map_err(TestkitError::TempDir)?;
        let path = folder.path().join("principals.toml");
        std::fs::write(&path, file).map_err(TestkitError::TempDir)?;
        let authenticator = Authenticator::from_file("HarnessBuilder::principal", &path)
            .map_err(|e| TestkitError::Auth(e.to_string()))?;
        Ok(Some(Access {
            authenticator,
            keys,
            _folder: folder,
        }))
    }

    /// The API key of principal `name`.
    pub(crate) fn key(&self, name: &str) -> Option<&str> {
        self.keys
            .iter()
            .find(|(named, _)| named == name)
            .map(|(_, key)| key.as_str())
    }

    /// The harness's own key.
    pub(crate) fn harness_key(&self) -> &str {
        self.key(HARNESS_PRINCIPAL).unwrap_or_default()
    }
}
