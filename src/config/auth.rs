//! The identity settings of each role (SPEC 7.2, 7.3): who may call a server (`--auth-keys`,
//! or deliberately nobody checked: `--insecure-no-auth`), the coordinator's own credential
//! towards participants, and the keys hold tokens are derived with. Misconfiguration is refused
//! at start with a message naming the flag; `--print-config` shows paths, never a secret.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::auth::Authenticator;
use crate::domain::TokenKeys;

/// Who may call this process's gRPC servers.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServerAuthArgs {
    /// TOML file of principals (`[[principal]]` with name, roles, key_sha256 and/or
    /// tls_identity); every call must then prove a principal with the method's role. Re-read
    /// when it changes.
    #[arg(long, env = "HOLDFAST_AUTH_KEYS")]
    pub auth_keys: Option<PathBuf>,

    /// Without --auth-keys, listen on a non-loopback address anyway: anyone who can reach the
    /// port can do anything.
    #[arg(long, env = "HOLDFAST_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
}

impl ServerAuthArgs {
    /// The authenticator of servers listening on `listen`. Without `--auth-keys`, a
    /// non-loopback address is refused unless `--insecure-no-auth`.
    pub fn authenticator(&self, listen: &[SocketAddr]) -> Result<Authenticator, String> {
        if let Some(path) = &self.auth_keys {
            return Authenticator::from_file("--auth-keys", path).map_err(|e| e.to_string());
        }
        if let Some(open) = listen.iter().find(|a| !a.ip().is_loopback()) {
            if !self.insecure_no_auth {
                return Err(format!(
                    "refusing to listen on {open} without authentication: give --auth-keys FILE (see `holdfast keys new`), listen on a loopback address, or pass --insecure-no-auth to let anyone who reaches the port do anything"
                ));
            }
            tracing::warn!(%open, "authentication off on a non-loopback address (--insecure-no-auth): anyone who reaches it can do anything");
            return Ok(Authenticator::InsecureNoAuth);
        }
        Ok(Authenticator::Off)
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        match &self.auth_keys {
            Some(p) => out.push_str(&format!("auth_keys = {:?}\n", p.display().to_string())),
            None => out.push_str("# auth_keys: not set (authentication off)\n"),
        }
        out.push_str(&format!("insecure_no_auth = {}\n", self.insecure_no_auth));
    }
}

/// The coordinator's secrets: its credential towards participants and its token keys.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct CoordinatorSecretArgs {
    /// File holding the API key the coordinator presents to participants (`authorization:
    /// Bearer`); a principal with the `coordinator` role in the participants' --auth-keys.
    #[arg(long, env = "HOLDFAST_PARTICIPANT_API_KEY_FILE")]
    pub participant_api_key_file: Option<PathBuf>,

    /// TOML file of the keys hold tokens are derived with (`current = "ID"` and `[[key]]`
    /// entries of id and hex secret; see `holdfast keys token-secret`). Shared by replicas;
    /// rotate by adding a key and making it current. Default: a file beside a SQLite database,
    /// else a key of this process only.
    #[arg(long, env = "HOLDFAST_TOKEN_SECRET_FILE")]
    pub token_secret_file: Option<PathBuf>,

    /// On PostgreSQL without --token-secret-file: derive hold tokens with a key of this
    /// process only (a repeated Reserve answered by another replica or after a restart then
    /// comes without its token). Without it such a coordinator refuses to start.
    #[arg(long, env = "HOLDFAST_EPHEMERAL_TOKEN_SECRET")]
    pub ephemeral_token_secret: bool,
}

impl CoordinatorSecretArgs {
    /// The API key in `--participant-api-key-file`, if given.
    pub fn participant_key(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.participant_api_key_file else {
            return Ok(None);
        };
        let key = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "--participant-api-key-file {}: cannot read it: {e}",
                path.display()
            )
        })?;
        let key = key.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "--participant-api-key-file {}: must hold one API key (printable ASCII, no spaces)",
                path.display()
            ));
        }
        Ok(Some(key.to_owned()))
    }

    /// The token keys: `--token-secret-file`; else, on SQLite, `token-secret.toml` beside the
    /// database (created on first start, owner-only); else, with `--ephemeral-token-secret`, a
    /// key of this process only (a repeat Reserve after a restart, or at another replica, then
    /// answers without its token); else refused, naming both flags.
    pub(crate) fn token_keys(&self, sqlite_dir: Option<&Path>) -> Result<TokenKeys, String> {
        if let Some(path) = &self.token_secret_file {
            return read_token_keys("--token-secret-file", path);
        }
        if let Some(dir) = sqlite_dir {
            let path = dir.join(TOKEN_SECRET_FILE);
            if !path.exists() {
                create_secret_file(&path)?;
            }
            return read_token_keys("token secret", &path);
        }
        if !self.ephemeral_token_secret {
            return Err(MISSING_TOKEN_SECRET.to_owned());
        }
        tracing::warn!(
            "--ephemeral-token-secret: hold tokens are derived with a key of this process only; a repeated Reserve answered by another replica or after a restart comes without its token"
        );
        TokenKeys::ephemeral().map_err(|e| e.to_string())
    }

    /// The settings as TOML lines for `--print-config` (paths only).
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!(
            "ephemeral_token_secret = {}\n",
            self.ephemeral_token_secret
        ));
        for (key, path) in [
            ("participant_api_key_file", &self.participant_api_key_file),
            ("token_secret_file", &self.token_secret_file),
        ] {
            match path {
                Some(p) => out.push_str(&format!("{key} = {:?}\n", p.display().to_string())),
                None => out.push_str(&format!("# {key}: not set\n")),
            }
        }
    }
}

/// The token secret the embedded SQLite default keeps in its data folder (made on first start).
pub(crate) const TOKEN_SECRET_FILE: &str = "token-secret.toml";

/// Why a coordinator on PostgreSQL without a token secret file does not start: replicas (and
/// this one after a restart) must derive the same tokens, or a repeated Reserve loses its token.
const MISSING_TOKEN_SECRET: &str = "a coordinator on PostgreSQL needs --token-secret-file FILE (made by `holdfast keys token-secret`, shared by every replica), so that a repeated Reserve answers its hold token at any replica and after a restart; pass --ephemeral-token-secret to derive tokens with a key of this process only";

/// A token secret file: the id of the key new tokens use, and every key still accepted. Other
/// keys are ignored: every key this file needs is required, so a misspelt one is refused as
/// missing.
#[derive(serde::Deserialize)]
struct TokenSecretFile {
    current: Option<String>,
    key: Option<Vec<TokenSecretEntry>>,
}

/// One `[[key]]` of a token secret file.
#[derive(serde::Deserialize)]
struct TokenSecretEntry {
    id: String,
    secret: String,
}

/// Parses a token secret file: `current = "ID"` and `[[key]]` tables of `id` and `secret`
/// (hex, at least 64 digits).
pub fn parse_token_keys(text: &str) -> Result<TokenKeys, String> {
    let deserializer =
        toml::Deserializer::parse(text).map_err(|e| format!("not valid TOML: {e}"))?;
    let file: TokenSecretFile = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        // Never the value: a wrongly typed secret is still a secret.
        format!("`{}`: {}", e.path(), secret_free(e.inner().message()))
    })?;
    let current = file
        .current
        .ok_or("`current` (the id of the key new tokens use) is required")?;
    let entries = file
        .key
        .filter(|entries| !entries.is_empty())
        .ok_or("needs [[key]] entries with id and secret")?;
    let mut keys = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let secret = crate::domain::token::from_hex(entry.secret.trim())
            .ok_or_else(|| format!("key[{i}] ({}): secret must be hex digits", entry.id))?;
        keys.push((entry.id.as_str(), secret));
    }
    TokenKeys::new(&current, keys.iter().map(|(id, s)| (*id, s.as_slice())))
        .map_err(|e| e.to_string())
}

/// serde's message without the value it quotes (`invalid type: integer `5`, expected ...`
/// becomes `invalid type, expected ...`).
fn secret_free(message: &str) -> String {
    match message.split_once(", expected") {
        Some((what, expected)) => {
            let what = what.split_once(':').map_or(what, |(kind, _)| kind);
            format!("{what}, expected{expected}")
        }
        None => message.to_owned(),
    }
}

fn read_token_keys(what: &str, path: &Path) -> Result<TokenKeys, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
    parse_token_keys(&text).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// Writes a fresh token secret file readable by its owner only.
fn create_secret_file(path: &Path) -> Result<(), String> {
    use std::io::Write;
    let text = crate::auth::keys::token_secret("k1").map_err(|e| e.to_string())?;
    let mut options = std::fs::File::options();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot create the token secret {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write the token secret {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_secret_file_postgres_needs_the_ephemeral_flag() {
        let none = CoordinatorSecretArgs::default();
        let err = none.token_keys(None).err().unwrap_or_default();
        assert!(
            err.contains("--token-secret-file") && err.contains("--ephemeral-token-secret"),
            "{err}"
        );
        let ephemeral = CoordinatorSecretArgs {
            ephemeral_token_secret: true,
            ..CoordinatorSecretArgs::default()
        };
        assert!(ephemeral.token_keys(None).is_ok());
        // SQLite keeps its file beside the database: no flag needed.
        let dir = std::env::temp_dir().join(format!("holdfast-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(none.token_keys(Some(&dir)).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn token_secret_files_parse_or_say_what_is_wrong() {
        let text = crate::auth::keys::token_secret("k1").unwrap();
        let keys = parse_token_keys(&text).unwrap();
        assert_eq!(keys.current_key_id(), "k1");
        assert!(
            parse_token_keys("current = \"k\"")
                .unwrap_err()
                .contains("[[key]]")
        );
        assert!(
            parse_token_keys("current = \"k\"\n[[key]]\nid = \"k\"\nsecret = \"zz\"")
                .unwrap_err()
                .contains("hex")
        );
        assert!(
            parse_token_keys("current = \"k\"\n[[key]]\nid = \"k\"\nsecret = \"00\"")
                .unwrap_err()
                .contains("at least 32 bytes")
        );
        let err = parse_token_keys("current = \"k\"\n[[key]]\nid = \"k\"\nsecret = 123456789")
            .unwrap_err();
        assert!(
            err.contains("`key[0].secret`: invalid type, expected a string"),
            "{err}"
        );
        assert!(!err.contains("123456789"), "a secret is never shown: {err}");
        assert!(
            parse_token_keys("current = \"k\"\n[[key]]\nid = \"k\"")
                .unwrap_err()
                .contains("`key[0]`: missing field `secret`")
        );
    }

    #[test]
    fn without_keys_only_loopback_listens_unless_insecure() {
        let loopback: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let open: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let off = ServerAuthArgs::default();
        assert!(!off.authenticator(&[loopback]).unwrap().is_on());
        assert!(
            off.authenticator(&[open])
                .unwrap_err()
                .contains("--auth-keys")
        );
        let insecure = ServerAuthArgs {
            insecure_no_auth: true,
            ..ServerAuthArgs::default()
        };
        assert!(!insecure.authenticator(&[open]).unwrap().is_on());
    }
}
