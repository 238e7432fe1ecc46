//! `holds`: a stock participant alone, served in-process without a coordinator, taking Try
//! calls straight from the clients (its own holds per second).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinHandle;

use super::{Measured, Progress, join_workers, put};
use crate::bench::credentials::BenchChannel;
use crate::bench::stats::{Outcome, Recorder};
use crate::bench::{Transport, deploy};
use crate::participants::{self, Kind, ParticipantSettings, stock_redis};
use crate::proto::ResourceSpec;
use crate::proto::participant_client::ParticipantClient;
use crate::tls::Listener;

/// One stock participant alone (no coordinator): `clients` clients, each on its own
/// connection (over `transport`), send Try for 1 unit of one large item with a fresh branch
/// each time, for `duration`. Measures the participant's own holds per second.
pub async fn holds(
    database_url: &str,
    transport: &Transport,
    redis_url: Option<&str>,
    kind: Kind,
    clients: usize,
    duration: Duration,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    let pool = crate::db::connect_postgres(
        database_url,
        u32::try_from(clients).unwrap_or(32).clamp(4, 32),
    )
    .await
    .map_err(|e| format!("connecting to {database_url}: {e}"))?;
    let (listener, url) = transport.bind().await?;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    };
    let (server, redis_keys) =
        spawn_participant(kind, transport, redis_url, pool.clone(), listener, stopped)?;
    let stop_all = || {
        let _ = stop.send(true);
    };
    let delete_keys = || async {
        if let Some((url, prefix)) = &redis_keys
            && let Err(e) = deploy::delete_redis_keys(url, prefix).await
        {
            eprintln!("bench: {e}");
        }
    };
    let item = format!("holds-{}", uuid::Uuid::new_v4().simple());
    if !provision(transport, &url, &item).await {
        stop_all();
        let _ = server.await;
        delete_keys().await;
        pool.close().await;
        return Err(format!("{} never accepted PutResources", kind.name()));
    }
    let channels = transport.participant_channels(&url, clients.max(1))?;
    let expires_at = prost_types::Timestamp {
        seconds: chrono::Utc::now().timestamp() + 3600,
        nanos: 0,
    };
    let start = Instant::now();
    let deadline = start + duration;
    let workers = channels.into_iter().map(|channel| {
        let (progress, item) = (progress.clone(), item.clone());
        tokio::spawn(try_until(
            channel, kind, item, expires_at, deadline, progress,
        ))
    });
    let recorder = join_workers(workers.collect()).await;
    let elapsed = start.elapsed();
    stop_all();
    let _ = server.await;
    delete_keys().await;
    pool.close().await;
    Ok(Measured {
        recorder,
        elapsed,
        notes: vec![],
        extra: serde_json::json!({ "participant": kind.name(), "item": item }),
        setup_xacts: 0,
    })
}

/// Spawns the participant `kind` on `listener`, stopped by `stopped`; its task, and for
/// stock-redis its Redis URL and key prefix (to delete the keys after the run).
#[allow(clippy::type_complexity)]
fn spawn_participant(
    kind: Kind,
    transport: &Transport,
    redis_url: Option<&str>,
    pool: PgPool,
    listener: Listener,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<(JoinHandle<Result<(), String>>, Option<(String, String)>), String> {
    if kind == Kind::StockRedis {
        let redis = redis_url.ok_or("stock-redis needs --redis-url")?;
        let mut settings = deploy::stock_redis_settings(redis);
        settings.auth = transport.credentials.servers.clone();
        let redis_keys = Some((redis.to_owned(), settings.key_prefix.clone()));
        let server = tokio::spawn(async move {
            stock_redis::serve(settings, pool, listener, stopped)
                .await
                .map_err(|e| e.to_string())
        });
        return Ok((server, redis_keys));
    }
    let settings = ParticipantSettings {
        auth: transport.credentials.servers.clone(),
        ..ParticipantSettings::new(kind)
    };
    let server = tokio::spawn(async move {
        participants::serve(settings, pool, listener, stopped)
            .await
            .map_err(|e| e.to_string())
    });
    Ok((server, None))
}

/// Puts the large `item` on the participant at `url`, retrying while it starts (up to 5 s);
/// whether it took.
async fn provision(transport: &Transport, url: &str, item: &str) -> bool {
    for _ in 0..100 {
        if let Ok(mut admin) = transport.admin_client(url)
            && put(
                &mut admin,
                vec![ResourceSpec {
                    resource: item.to_owned(),
                    capacity: 1_000_000_000,
                }],
            )
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// One client: Try for 1 unit of `item` with a fresh branch each time, until `deadline`.
async fn try_until(
    channel: BenchChannel,
    kind: Kind,
    item: String,
    expires_at: prost_types::Timestamp,
    deadline: Instant,
    progress: Arc<Progress>,
) -> Recorder {
    let mut client = ParticipantClient::new(channel);
    let mut rec = Recorder::default();
    while Instant::now() < deadline {
        let t = Instant::now();
        let answer = client
            .r#try(crate::proto::TryRequest {
                reservation_id: uuid::Uuid::new_v4().to_string(),
                branch_id: uuid::Uuid::new_v4().to_string(),
                holder: "bench".into(),
                items: vec![crate::proto::Hold {
                    participant: kind.name().into(),
                    resource: item.clone(),
                    quantity: 1,
                    during: None,
                }],
                expires_at: Some(expires_at),
            })
            .await;
        let outcome = match answer {
            Ok(r) if r.get_ref().outcome == crate::proto::try_response::Outcome::Held as i32 => {
                Outcome::Ok
            }
            Ok(_) => Outcome::Rejected,
            Err(e) => Outcome::Error(format!("{:?}", e.code())),
        };
        progress.count(&outcome);
        rec.record(outcome, t.elapsed());
    }
    rec
}
