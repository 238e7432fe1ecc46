//! Helpers of the identity tests: a principals file written the way an operator (or a
//! Secret's renewal) writes it, keys made with `holdfast::auth::keys`, requests carrying a
//! bearer key, and a coordinator + real participants with authentication on.

mod at_rest;
mod certificates;
mod credentials;
mod ownership;
mod participants;

use std::path::PathBuf;

use holdfast::app::CoordinatorSettings;
use holdfast::auth::{Authenticator, Role, keys};
use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto;
use sqlx::PgPool;
use tonic::{Request, Status};

use crate::common::{TestApp, hold, settings, spawn_app, spawn_participant_with};

/// A principal of a test: its name, roles and API key.
#[derive(Clone, Debug)]
pub struct Principal {
    pub name: String,
    pub roles: Vec<Role>,
    pub key: String,
}

impl Principal {
    pub fn new(name: &str, roles: &[Role]) -> Principal {
        Principal {
            name: name.to_owned(),
            roles: roles.to_vec(),
            key: keys::new_key().unwrap(),
        }
    }
}

/// A principals file in a folder of its own, removed when dropped.
pub struct PrincipalsFile {
    dir: PathBuf,
    pub path: PathBuf,
}

impl PrincipalsFile {
    pub fn new(principals: &[&Principal]) -> PrincipalsFile {
        let dir = std::env::temp_dir().join(format!("holdfast-auth-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = PrincipalsFile {
            path: dir.join("principals.toml"),
            dir,
        };
        file.write(principals, "");
        file
    }

    /// Replaces the file (atomically, as a Secret's update does) with `principals` and `extra`
    /// raw TOML.
    pub fn write(&self, principals: &[&Principal], extra: &str) {
        let mut text: String = principals
            .iter()
            .map(|p| keys::principal_entry(&p.name, &p.roles, &p.key))
            .collect();
        text.push_str(extra);
        let partial = self.dir.join(".principals.partial");
        std::fs::write(&partial, text).unwrap();
        std::fs::rename(&partial, &self.path).unwrap();
    }

    pub fn authenticator(&self) -> Authenticator {
        Authenticator::from_file("--auth-keys", &self.path).unwrap()
    }
}

impl Drop for PrincipalsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `msg` sent with `authorization: Bearer <key>`.
pub fn keyed<T>(msg: T, key: &str) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req
}

/// The status code and ErrorInfo reason of a refusal.
pub fn refusal(status: &Status) -> (tonic::Code, String) {
    (status.code(), crate::common::reason(status))
}

/// The cast of the ownership tests: two client services, an admin, the coordinator's own
/// principal towards participants and a metrics scraper; the file that admits them.
pub struct Cast {
    pub shop: Principal,
    pub stranger: Principal,
    pub admin: Principal,
    pub coordinator: Principal,
    /// A Prometheus scraper: the `metrics` role only.
    pub scraper: Principal,
    pub file: PrincipalsFile,
}

impl Cast {
    pub fn new() -> Cast {
        let shop = Principal::new("shop", &[Role::Client]);
        let stranger = Principal::new("stranger", &[Role::Client]);
        let admin = Principal::new("ops", &[Role::Admin]);
        let coordinator = Principal::new("coordinator", &[Role::Coordinator]);
        let scraper = Principal::new("prometheus", &[Role::Metrics]);
        let file = PrincipalsFile::new(&[&shop, &stranger, &admin, &coordinator, &scraper]);
        Cast {
            shop,
            stranger,
            admin,
            coordinator,
            scraper,
            file,
        }
    }
}

/// A seats participant requiring the cast's credentials, and a coordinator with
/// authentication on that calls it with the `coordinator` principal's key; seat `A1` has
/// room for one.
pub async fn secured_shop(pool: PgPool, cast: &Cast) -> (TestApp, String) {
    let seats = spawn_participant_with(
        ParticipantSettings {
            auth: cast.file.authenticator(),
            ..ParticipantSettings::new(Kind::Seats)
        },
        &pool,
    )
    .await;
    let mut admin = crate::common::admin(&seats).await;
    admin
        .put_resources(keyed(
            crate::common::put_resources_request(&[("A1", 1), ("A2", 1)]),
            &cast.admin.key,
        ))
        .await
        .unwrap();
    let app = spawn_app(pool, secured_settings(cast, &[("seats", &seats)])).await;
    (app, seats)
}

/// Coordinator settings with the cast's file and the coordinator principal's key.
pub fn secured_settings(cast: &Cast, participants: &[(&str, &str)]) -> CoordinatorSettings {
    let mut s = settings(participants);
    s.access.auth = cast.file.authenticator();
    s.access.participant_key = Some(cast.coordinator.key.clone());
    s
}

/// `resource`'s counts at the participant at `url`, asked with `key`.
pub async fn resource_as(url: &str, resource: &str, key: &str) -> proto::ResourceStatus {
    crate::common::admin(url)
        .await
        .get_resource(keyed(
            proto::GetResourceRequest {
                resource: resource.to_owned(),
            },
            key,
        ))
        .await
        .unwrap()
        .into_inner()
}

/// A Reserve of seat `resource` for `holder`.
pub fn reserve_seat(request_id: &str, holder: &str, resource: &str) -> proto::ReserveRequest {
    proto::ReserveRequest {
        holder: holder.into(),
        ..crate::common::reserve_request(request_id, vec![hold("seats", resource)])
    }
}
