//! `tcc.v1.Events` (SPEC 10) over gRPC against a real coordinator and in-test participants:
//! resume from any sequence, live after the backlog, filters, heartbeats, GetLatestSequence
//! and bad input on both databases (`subscribe.rs`); owner scoping with API keys and the end
//! of a stream at shutdown (`scope.rs`); two replicas and a transaction held open
//! (`replicas.rs`).

mod replicas;
mod scope;
mod subscribe;

use std::time::Duration;

use holdfast::app::{self, CoordinatorSettings};
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::events_client::EventsClient;
use holdfast::store::AnyStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// How long a test waits for the next message of a stream.
pub const NEXT: Duration = Duration::from_secs(10);

/// A coordinator on either database, its two clients, and a way to stop it.
pub struct EventsApp {
    pub coordinator: CoordinatorClient<Channel>,
    pub events: EventsClient<Channel>,
    shutdown: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    /// A SQLite file removed when the app is dropped.
    sqlite: Option<std::path::PathBuf>,
}

impl EventsApp {
    /// Serves `settings` on `store` (migrated) on 127.0.0.1:0.
    pub async fn start(settings: CoordinatorSettings, store: impl Into<AnyStore>) -> EventsApp {
        let store = store.into();
        store.migrate().await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            app::serve_coordinator(settings, store, listener, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        EventsApp {
            coordinator: CoordinatorClient::connect(url.clone()).await.unwrap(),
            events: EventsClient::connect(url).await.unwrap(),
            shutdown: Some(tx),
            served: Some(served),
            sqlite: None,
        }
    }

    /// The same on a fresh SQLite file.
    pub async fn sqlite(settings: CoordinatorSettings) -> EventsApp {
        let path =
            std::env::temp_dir().join(format!("holdfast-events-{}.db", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}", path.display());
        let store = holdfast::store::SqliteStore::connect(&url, 8)
            .await
            .unwrap();
        let mut app = EventsApp::start(settings, store).await;
        app.sqlite = Some(path);
        app
    }

    /// Shuts the coordinator down gracefully and waits until it has stopped.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.unwrap();
        }
    }
}

impl Drop for EventsApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(path) = &self.sqlite {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// An event's type.
pub fn type_of(e: &proto::Event) -> proto::event::Type {
    proto::event::Type::try_from(e.r#type).unwrap()
}

/// Subscribes after `after` with `filter` (`key` as a bearer credential when given).
pub async fn subscribe(
    events: &EventsClient<Channel>,
    after: i64,
    filter: Option<proto::EventFilter>,
    key: Option<&str>,
) -> tonic::Streaming<proto::Event> {
    let message = proto::SubscribeRequest {
        after_sequence: after,
        filter,
    };
    let request = match key {
        Some(key) => crate::auth::keyed(message, key),
        None => tonic::Request::new(message),
    };
    events
        .clone()
        .subscribe(request)
        .await
        .unwrap()
        .into_inner()
}

/// The next message of `stream` (a test failure after [`NEXT`] or at its end).
pub async fn next(stream: &mut tonic::Streaming<proto::Event>) -> proto::Event {
    tokio::time::timeout(NEXT, stream.message())
        .await
        .expect("a message within 10 s")
        .expect("no error")
        .expect("the stream goes on")
}

/// The events of `stream` up to the first heartbeat at or past `through` (that heartbeat
/// left out).
pub async fn events_through(
    stream: &mut tonic::Streaming<proto::Event>,
    through: i64,
) -> Vec<proto::Event> {
    let mut out = Vec::new();
    loop {
        let e = next(stream).await;
        if type_of(&e) == proto::event::Type::Heartbeat {
            if e.sequence >= through {
                return out;
            }
        } else {
            out.push(e);
        }
    }
}

/// The events of `stream` until one of `reservation_id` of type `until` (included).
pub async fn events_until(
    stream: &mut tonic::Streaming<proto::Event>,
    reservation_id: &str,
    until: proto::event::Type,
) -> Vec<proto::Event> {
    let mut out = Vec::new();
    loop {
        let e = next(stream).await;
        if type_of(&e) == proto::event::Type::Heartbeat {
            continue;
        }
        let done = type_of(&e) == until
            && e.reservation.as_ref().map(|r| r.id.as_str()) == Some(reservation_id);
        out.push(e);
        if done {
            return out;
        }
    }
}

/// Declares `case` as the tests `postgres` (a fresh database) and `sqlite` (a fresh file) in a
/// module of its name; `case(start)` starts its coordinator with `start(settings)`.
macro_rules! on_both_databases {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[sqlx::test(migrations = false)]
                async fn postgres(
                    pool: sqlx::postgres::PgPoolOptions,
                    connect: sqlx::postgres::PgConnectOptions,
                ) {
                    crate::parallel::on_multi_thread(pool, connect, |pool| async move {
                        super::$case(super::Database::Postgres(pool)).await;
                    })
                    .await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$case(super::Database::Sqlite).await;
                }
            }
        )*
    };
}
pub(crate) use on_both_databases;

/// Which database a case's coordinator runs on.
pub enum Database {
    Postgres(sqlx::PgPool),
    Sqlite,
}

impl Database {
    pub async fn start(self, settings: CoordinatorSettings) -> EventsApp {
        match self {
            Database::Postgres(pool) => {
                EventsApp::start(settings, holdfast::store::PgStore::from_pool(pool)).await
            }
            Database::Sqlite => EventsApp::sqlite(settings).await,
        }
    }
}
