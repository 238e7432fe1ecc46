//! The TLS settings of each role (SPEC 7.1): a server's certificate, key and client CA (every
//! role), and how the coordinator calls `https://` participants. Misconfiguration is refused
//! at start with a message naming the flag; `--print-config` shows the paths, never a key.

use std::path::{Path, PathBuf};

use crate::tls::{ClientTlsFiles, ServerTlsFiles};

/// TLS of a role's own servers: every gRPC port of the process, and its metrics listener.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServerTlsArgs {
    /// PEM certificate chain to serve; with it every port of this process serves TLS only.
    /// Re-read when the file changes.
    #[arg(long, env = "HOLDFAST_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert. Re-read when the file changes.
    #[arg(long, env = "HOLDFAST_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s): clients must present a certificate it signed (mTLS).
    #[arg(long, env = "HOLDFAST_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    /// The files to serve, or `None` for plaintext; an error names the missing flag.
    pub fn files(&self) -> Result<Option<ServerTlsFiles>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            })),
            (Some(_), None) => Err("--tls-cert needs --tls-key (its private key)".into()),
            (None, Some(_)) => Err("--tls-key needs --tls-cert (the certificate it signs)".into()),
            (None, None) if self.tls_client_ca.is_some() => Err(
                "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked only by a TLS server"
                    .into(),
            ),
            (None, None) => Ok(None),
        }
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        path_line(out, "tls_cert", self.tls_cert.as_deref(), "plaintext");
        path_line(out, "tls_key", self.tls_key.as_deref(), "plaintext");
        path_line(
            out,
            "tls_client_ca",
            self.tls_client_ca.as_deref(),
            "no client certificate required",
        );
    }
}

/// How the coordinator calls its participants over TLS.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ParticipantTlsArgs {
    /// PEM CA certificate(s) that https:// participants' certificates must chain to (default:
    /// the system roots).
    #[arg(long, env = "HOLDFAST_PARTICIPANT_CA")]
    pub participant_ca: Option<PathBuf>,

    /// PEM client certificate chain presented to https:// participants. Re-read when it
    /// changes.
    #[arg(long, env = "HOLDFAST_PARTICIPANT_CLIENT_CERT")]
    pub participant_client_cert: Option<PathBuf>,

    /// PEM private key of --participant-client-cert.
    #[arg(long, env = "HOLDFAST_PARTICIPANT_CLIENT_KEY")]
    pub participant_client_key: Option<PathBuf>,

    /// Let a coordinator that serves TLS call http:// participants in plaintext (otherwise it
    /// refuses to start with one).
    #[arg(long, env = "HOLDFAST_ALLOW_PLAINTEXT_PARTICIPANTS")]
    pub allow_plaintext_participants: bool,
}

impl ParticipantTlsArgs {
    /// The client files (the certificate and key both or neither; an error names the flag).
    pub fn files(&self) -> Result<ClientTlsFiles, String> {
        match (&self.participant_client_cert, &self.participant_client_key) {
            (Some(_), None) => {
                Err("--participant-client-cert needs --participant-client-key".into())
            }
            (None, Some(_)) => {
                Err("--participant-client-key needs --participant-client-cert".into())
            }
            _ => Ok(ClientTlsFiles {
                ca: self.participant_ca.clone(),
                cert: self.participant_client_cert.clone(),
                key: self.participant_client_key.clone(),
            }),
        }
    }

    /// Whether any TLS client setting was given.
    pub(crate) fn any_given(&self) -> bool {
        self.participant_ca.is_some()
            || self.participant_client_cert.is_some()
            || self.participant_client_key.is_some()
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        path_line(
            out,
            "participant_ca",
            self.participant_ca.as_deref(),
            "the system roots",
        );
        path_line(
            out,
            "participant_client_cert",
            self.participant_client_cert.as_deref(),
            "none presented",
        );
        path_line(
            out,
            "participant_client_key",
            self.participant_client_key.as_deref(),
            "none presented",
        );
        out.push_str(&format!(
            "allow_plaintext_participants = {}\n",
            self.allow_plaintext_participants
        ));
    }
}

/// `key = "path"`, or a comment saying what not setting it means.
fn path_line(out: &mut String, key: &str, path: Option<&Path>, unset: &str) {
    match path {
        Some(p) => out.push_str(&format!("{key} = {:?}\n", p.display().to_string())),
        None => out.push_str(&format!("# {key}: not set ({unset})\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_tls_settings_name_the_missing_flag() {
        let cert_only = ServerTlsArgs {
            tls_cert: Some("c.pem".into()),
            ..ServerTlsArgs::default()
        };
        assert!(cert_only.files().unwrap_err().contains("--tls-key"));
        let ca_only = ServerTlsArgs {
            tls_client_ca: Some("ca.pem".into()),
            ..ServerTlsArgs::default()
        };
        assert!(ca_only.files().unwrap_err().contains("--tls-cert"));
        assert_eq!(ServerTlsArgs::default().files(), Ok(None));
        let client_cert_only = ParticipantTlsArgs {
            participant_client_cert: Some("c.pem".into()),
            ..ParticipantTlsArgs::default()
        };
        assert!(
            client_cert_only
                .files()
                .unwrap_err()
                .contains("--participant-client-key")
        );
    }
}
