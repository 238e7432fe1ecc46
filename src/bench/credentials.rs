//! Who the bench's calls are from. With `--auth`, every in-process server authenticates
//! (principals made for the run, in a file of their own): the bench's clients present a
//! `client` key to the coordinator and an `admin` key to `ResourceAdmin`, and the coordinator
//! presents its own `coordinator` key to its participants, exactly as a deployment with
//! `--auth-keys` does. With `--target`, `--api-key` is presented on every call.

use std::path::PathBuf;
use std::sync::Arc;

use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use super::BenchArgs;
use crate::auth::{Authenticator, Bearer, Role, keys};

/// A channel whose every call carries the bench's credential for that service.
pub(crate) type BenchChannel = InterceptedService<Channel, Bearer>;

/// The credentials of one run. Cheap to clone; the default is no authentication.
#[derive(Clone, Debug, Default)]
pub(crate) struct Credentials {
    /// What every in-process server checks.
    pub(crate) servers: Authenticator,
    /// What the in-process coordinator presents to its participants.
    pub(crate) coordinator_key: Option<String>,
    client: Bearer,
    admin: Bearer,
    /// The principals file of an in-process run, removed when the last clone goes.
    _file: Option<Arc<RunFile>>,
}

impl Credentials {
    /// The credentials `args` ask for (in-process: `--auth`; with `--target`: `--api-key`).
    pub(crate) fn from_args(args: &BenchArgs) -> Result<Credentials, String> {
        match (&args.target, args.auth, &args.api_key) {
            (None, false, None) | (Some(_), false, None) => Ok(Credentials::default()),
            (None, true, None) => Credentials::in_process(),
            (Some(_), _, Some(key)) => Ok(Credentials {
                client: bearer(key)?,
                admin: bearer(key)?,
                ..Credentials::default()
            }),
            (Some(_), true, None) => Err(
                "--auth makes keys for the in-process servers; with --target give --api-key".into(),
            ),
            (None, _, Some(_)) => {
                Err("--api-key is for --target; in-process, --auth makes the run's own keys".into())
            }
        }
    }

    fn in_process() -> Result<Credentials, String> {
        let key = |_| keys::new_key().map_err(|e| format!("no randomness for a key: {e}"));
        let (client, admin, coordinator) = (key(0)?, key(1)?, key(2)?);
        let text = [
            keys::principal_entry("bench-client", &[Role::Client], &client),
            keys::principal_entry("bench-admin", &[Role::Admin], &admin),
            keys::principal_entry("coordinator", &[Role::Coordinator], &coordinator),
        ]
        .concat();
        let dir = std::env::temp_dir().join(format!("holdfast-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let file = RunFile(dir);
        let path = file.0.join("principals.toml");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        let servers = Authenticator::from_file("--auth", &path).map_err(|e| e.to_string())?;
        Ok(Credentials {
            servers,
            coordinator_key: Some(coordinator),
            client: bearer(&client)?,
            admin: bearer(&admin)?,
            _file: Some(Arc::new(file)),
        })
    }

    /// Whether calls carry keys.
    pub fn is_on(&self) -> bool {
        self.client.is_some()
    }

    /// What calls to the coordinator present.
    pub fn client(&self) -> Bearer {
        self.client.clone()
    }

    /// What calls straight to a participant's `tcc.v1.Participant` present (the
    /// coordinator's own key: only the coordinator role may Try).
    pub fn participant(&self) -> Bearer {
        match &self.coordinator_key {
            Some(key) => Bearer::new(key).unwrap_or_default(),
            None => self.client.clone(),
        }
    }

    /// What calls to `ResourceAdmin` present.
    pub fn admin(&self) -> Bearer {
        self.admin.clone()
    }
}

fn bearer(key: &str) -> Result<Bearer, String> {
    Bearer::new(key).map_err(|e| e.to_string())
}

/// A folder of the run's own, removed when dropped.
#[derive(Debug)]
struct RunFile(PathBuf);

impl Drop for RunFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
