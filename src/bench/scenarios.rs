//! The scenarios: the database's raw commit rate (`ceiling`), Reserve+Confirm of 2 holds by
//! one or many clients (`latency`, `throughput`) on noop or real (seats + stock) participants,
//! a flash sale of many clients on few units of one stock item through the coordinator
//! (`flash`, on `stock` or `stock-redis`), and a stock participant alone (`holds`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use super::deploy::{self, Endpoints};
use super::stats::{Outcome, Recorder};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::proto::{
    ConfirmRequest, GetResourceRequest, Hold, PutResourcesRequest, ReserveRequest, ResourceSpec,
};

/// Which participants the 2 holds of a Reserve+Confirm go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One hold on each of two noop participants (or two resources on one, with `--target`
    /// and a single noop name): the coordinator's own cost.
    Noop,
    /// One seat (distinct for every reservation) and one unit of stock (an item per client,
    /// so clients do not queue on one row lock; `flash` measures that).
    Real,
}

impl Workload {
    /// Short name used in scenario names.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Noop => "noop",
            Workload::Real => "real",
        }
    }
}

/// Shared by every scenario of one run.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub endpoints: Endpoints,
    /// Prefix of every holder, request id and resource this run creates, so runs against a
    /// long-lived `--target` never collide.
    pub run_id: String,
    /// Seats provisioned per client at a time.
    pub seat_block: usize,
}

/// Counters the progress line reads while workers run.
#[derive(Default)]
pub struct Progress {
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
    pub errors: AtomicU64,
}

impl Progress {
    fn count(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Ok => &self.ok,
            Outcome::Rejected => &self.rejected,
            Outcome::Error(_) => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Prints a progress line on stderr every second until the returned handle is aborted.
pub fn spawn_progress(
    name: String,
    progress: Arc<Progress>,
    planned: Option<Duration>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let secs = start.elapsed().as_secs_f64();
            let ok = progress.ok.load(Ordering::Relaxed);
            let of = planned
                .map(|d| format!("/{}s", d.as_secs()))
                .unwrap_or_default();
            eprintln!(
                "bench: {name:<16} {secs:>4.0}s{of}  ok={ok} rejected={} errors={}  ({:.0} ok/s)",
                progress.rejected.load(Ordering::Relaxed),
                progress.errors.load(Ordering::Relaxed),
                ok as f64 / secs.max(0.001),
            );
        }
    })
}

/// What a timed scenario measured.
pub struct Measured {
    pub recorder: Recorder,
    pub elapsed: Duration,
    pub notes: Vec<String>,
    pub extra: serde_json::Value,
    /// Database transactions the bench itself caused (provisioning, count reads), known
    /// exactly, to take out of the per-operation commit count.
    pub setup_xacts: i64,
}

/// The raw commit rate: `conns` connections each running single-statement autocommit
/// `UPDATE bench_ceiling SET n = n + 1 WHERE id = <its own row>` in a loop for `duration`.
/// With `one_row`, every connection updates the same row: commits queue on its lock, each
/// waiting for the previous one's WAL flush (the contended single-row rate).
pub async fn ceiling(
    url: &str,
    conns: usize,
    duration: Duration,
    progress: Arc<Progress>,
    one_row: bool,
) -> Result<Measured, String> {
    let n = u32::try_from(conns).map_err(|_| "too many connections".to_owned())?;
    let pool = crate::db::connect_postgres(url, n)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let setup = async {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_ceiling (id int PRIMARY KEY, n bigint NOT NULL)",
        )
        .execute(&pool)
        .await?;
        sqlx::query(
            "INSERT INTO bench_ceiling SELECT g, 0 FROM generate_series(0, $1 - 1) g \
             ON CONFLICT DO NOTHING",
        )
        .bind(i32::try_from(conns).unwrap_or(i32::MAX))
        .execute(&pool)
        .await?;
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = setup.await {
        pool.close().await;
        return Err(format!("creating bench_ceiling: {e}"));
    }
    let start = Instant::now();
    let deadline = start + duration;
    let workers = (0..conns).map(|id| {
        let (pool, progress) = (pool.clone(), progress.clone());
        tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut conn = match pool.acquire().await {
                Ok(c) => c,
                Err(e) => {
                    rec.record(Outcome::Error(format!("connect: {e}")), Duration::ZERO);
                    return rec;
                }
            };
            while Instant::now() < deadline {
                let t = Instant::now();
                let row = if one_row { 0 } else { id };
                let done = sqlx::query("UPDATE bench_ceiling SET n = n + 1 WHERE id = $1")
                    .bind(i32::try_from(row).unwrap_or(i32::MAX))
                    .execute(&mut *conn)
                    .await;
                let outcome = match done {
                    Ok(r) if r.rows_affected() == 1 => Outcome::Ok,
                    Ok(_) => Outcome::Error("UPDATE matched no row".into()),
                    Err(e) => Outcome::Error(format!("UPDATE: {e}")),
                };
                progress.count(&outcome);
                let failed = matches!(outcome, Outcome::Error(_));
                rec.record(outcome, t.elapsed());
                if failed {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            rec
        })
    });
    let recorder = join_workers(workers.collect()).await;
    let elapsed = start.elapsed();
    pool.close().await;
    Ok(Measured {
        recorder,
        elapsed,
        notes: vec![],
        extra: serde_json::json!({
            "statement": "UPDATE bench_ceiling SET n = n + 1 WHERE id = $1 (autocommit)",
            "rows": if one_row { "one row shared by every connection" } else { "one row per connection" },
        }),
        // CREATE TABLE and the INSERT of the rows.
        setup_xacts: 2,
    })
}

async fn join_workers(handles: Vec<tokio::task::JoinHandle<Recorder>>) -> Recorder {
    let mut all = Recorder::default();
    for h in handles {
        match h.await {
            Ok(rec) => all.merge(rec),
            Err(e) => all.record(
                Outcome::Error(format!("worker task failed: {e}")),
                Duration::ZERO,
            ),
        }
    }
    all
}

/// Names a failed call: `op: CODE REASON` (or a trimmed message when there is no reason).
fn describe(op: &str, status: &tonic::Status) -> String {
    match status.get_error_details().error_info() {
        Some(info) => format!("{op}: {:?} {}", status.code(), info.reason),
        None => {
            let msg: String = status.message().chars().take(80).collect();
            format!("{op}: {:?} {msg}", status.code())
        }
    }
}

fn is_capacity_refusal(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition
        && status
            .get_error_details()
            .error_info()
            .is_some_and(|i| i.reason == "INSUFFICIENT_CAPACITY")
}

/// Reserve then Confirm; a refusal for capacity is `Rejected`, anything else not OK an error.
async fn reserve_confirm(
    client: &mut CoordinatorClient<Channel>,
    holder: String,
    holds: Vec<Hold>,
) -> Outcome {
    let reserved = client
        .reserve(ReserveRequest {
            request_id: "bench".into(),
            holder,
            ttl: None,
            holds,
            labels: Default::default(),
        })
        .await;
    let r = match reserved {
        Ok(r) => r.into_inner(),
        Err(s) if is_capacity_refusal(&s) => return Outcome::Rejected,
        Err(s) => return Outcome::Error(describe("Reserve", &s)),
    };
    let confirmed = client
        .confirm(ConfirmRequest {
            reservation_id: r.id,
            hold_token: r.hold_token,
            payment: None,
        })
        .await;
    match confirmed {
        Ok(c) if c.get_ref().state == crate::proto::reservation::State::Confirmed as i32 => {
            Outcome::Ok
        }
        Ok(c) => Outcome::Error(format!("Confirm: answered state {}", c.get_ref().state)),
        Err(s) => Outcome::Error(describe("Confirm", &s)),
    }
}

fn hold(participant: &str, resource: &str) -> Hold {
    Hold {
        participant: participant.to_owned(),
        resource: resource.to_owned(),
        quantity: 1,
        during: None,
    }
}

async fn put(
    admin: &mut ResourceAdminClient<Channel>,
    specs: Vec<ResourceSpec>,
) -> Result<(), String> {
    admin
        .put_resources(PutResourcesRequest { resources: specs })
        .await
        .map(|_| ())
        .map_err(|s| describe("PutResources", &s))
}

/// What one client holds each time, and the resources it provisioned for that.
struct Holds {
    workload: Workload,
    ctx: Arc<Ctx>,
    client: usize,
    seats_admin: Option<ResourceAdminClient<Channel>>,
    seats_provisioned: usize,
    next_seat: usize,
    sku: String,
    top_ups: u64,
}

impl Holds {
    async fn prepare(ctx: Arc<Ctx>, workload: Workload, client: usize) -> Result<Holds, String> {
        let sku = format!("{}-sku-{client}", ctx.run_id);
        let mut holds = Holds {
            workload,
            ctx: ctx.clone(),
            client,
            seats_admin: None,
            seats_provisioned: 0,
            next_seat: 0,
            sku: sku.clone(),
            top_ups: 0,
        };
        if workload == Workload::Real {
            let mut stock = deploy::admin_client(&ctx.endpoints.stock.1)?;
            put(
                &mut stock,
                vec![ResourceSpec {
                    resource: sku,
                    capacity: 1_000_000_000,
                }],
            )
            .await?;
            holds.seats_admin = Some(deploy::admin_client(&ctx.endpoints.seats.1)?);
            holds.provision_seats().await?;
        }
        Ok(holds)
    }

    fn seat(&self, i: usize) -> String {
        format!("{}-seat-{}-{i}", self.ctx.run_id, self.client)
    }

    async fn provision_seats(&mut self) -> Result<(), String> {
        let from = self.seats_provisioned;
        let to = from + self.ctx.seat_block;
        let specs = (from..to)
            .map(|i| ResourceSpec {
                resource: self.seat(i),
                capacity: 1,
            })
            .collect();
        let admin = self
            .seats_admin
            .as_mut()
            .ok_or_else(|| "no seats admin client".to_owned())?;
        put(admin, specs).await?;
        self.seats_provisioned = to;
        Ok(())
    }

    async fn next(&mut self) -> Result<Vec<Hold>, String> {
        let ctx = self.ctx.clone();
        let e = &ctx.endpoints;
        match self.workload {
            Workload::Noop => Ok(match e.noop.as_slice() {
                [one] => vec![hold(one, "r-a"), hold(one, "r-b")],
                [a, b, ..] => vec![hold(a, "r"), hold(b, "r")],
                [] => return Err("no noop participant named".into()),
            }),
            Workload::Real => {
                if self.next_seat == self.seats_provisioned {
                    self.provision_seats().await?;
                    self.top_ups += 1;
                }
                let seat = self.seat(self.next_seat);
                self.next_seat += 1;
                Ok(vec![hold(&e.seats.0, &seat), hold(&e.stock.0, &self.sku)])
            }
        }
    }
}

/// `clients` clients, each doing Reserve+Confirm of 2 holds one after the other (a distinct
/// holder per reservation, so the per-holder hold limit never applies) for `duration`.
pub async fn reserve_confirm_loop(
    ctx: Arc<Ctx>,
    workload: Workload,
    clients: usize,
    duration: Duration,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    let channels = deploy::channels(&ctx.endpoints.coordinator, clients.min(32))?;
    let prepared = futures_util::future::join_all(
        (0..clients).map(|c| Holds::prepare(ctx.clone(), workload, c)),
    )
    .await;
    let mut all_holds = Vec::with_capacity(clients);
    for p in prepared {
        all_holds.push(p.map_err(|e| format!("provisioning resources: {e}"))?);
    }
    let start = Instant::now();
    let deadline = start + duration;
    let workers = all_holds.into_iter().enumerate().map(|(c, mut holds)| {
        let mut client = CoordinatorClient::new(channels[c % channels.len()].clone());
        let (progress, run_id) = (progress.clone(), ctx.run_id.clone());
        tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let outcome = match holds.next().await {
                    Ok(h) => {
                        let holder = format!("{run_id}-{}-{c}-{i}", workload.name());
                        let t = Instant::now();
                        let outcome = match reserve_confirm(&mut client, holder, h).await {
                            Outcome::Rejected => {
                                Outcome::Error("Reserve: INSUFFICIENT_CAPACITY (unexpected)".into())
                            }
                            other => other,
                        };
                        progress.count(&outcome);
                        rec.record(outcome.clone(), t.elapsed());
                        outcome
                    }
                    Err(e) => {
                        let outcome = Outcome::Error(format!("provisioning: {e}"));
                        progress.count(&outcome);
                        rec.record(outcome.clone(), Duration::ZERO);
                        outcome
                    }
                };
                if matches!(outcome, Outcome::Error(_)) {
                    // Keep reporting, but do not spin on a broken deployment.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                i += 1;
            }
            (rec, holds.top_ups)
        })
    });
    let handles: Vec<_> = workers.collect();
    let mut recorder = Recorder::default();
    let mut top_ups = 0;
    for h in handles {
        match h.await {
            Ok((rec, t)) => {
                recorder.merge(rec);
                top_ups += t;
            }
            Err(e) => recorder.record(
                Outcome::Error(format!("worker task failed: {e}")),
                Duration::ZERO,
            ),
        }
    }
    let elapsed = start.elapsed();
    let mut notes = vec![];
    if top_ups > 0 {
        notes.push(format!(
            "{top_ups} seat top-ups of {} seats (PutResources) ran inside the timed window",
            ctx.seat_block
        ));
    }
    Ok(Measured {
        recorder,
        elapsed,
        notes,
        extra: serde_json::json!({ "seat_top_ups": top_ups }),
        // One PutResources transaction for the item and one per seat block.
        setup_xacts: match workload {
            Workload::Noop => 0,
            Workload::Real => (2 * clients as u64 + top_ups) as i64,
        },
    })
}

/// `clients` clients, at most `concurrency` at once, each a distinct holder doing Reserve of
/// 1 unit of one item with `units` units at the stock participant `kind` (`stock` or
/// `stock-redis`), then Confirm if it won. Records Reserve latency (winners `Ok`, losers
/// `Rejected`); oversell comes from the participant's own counts.
pub async fn flash(
    ctx: Arc<Ctx>,
    kind: crate::participants::Kind,
    clients: usize,
    concurrency: usize,
    units: i64,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    use crate::participants::Kind;
    let item = format!("{}-flash", ctx.run_id);
    let (stock_name, stock_admin) = match kind {
        Kind::Stock => ctx.endpoints.stock.clone(),
        Kind::StockRedis => ctx
            .endpoints
            .stock_redis
            .clone()
            .ok_or("no stock-redis participant in this deployment")?,
        other => return Err(format!("flash runs on stock or stock-redis, not {other:?}")),
    };
    let mut stock = deploy::admin_client(&stock_admin)?;
    put(
        &mut stock,
        vec![ResourceSpec {
            resource: item.clone(),
            capacity: units,
        }],
    )
    .await
    .map_err(|e| format!("provisioning the flash item: {e}"))?;
    let channels = deploy::channels(&ctx.endpoints.coordinator, concurrency.min(32))?;
    let confirmed = crate::proto::reservation::State::Confirmed as i32;
    let start = Instant::now();
    let results: Vec<(Outcome, Duration)> = futures_util::stream::iter(0..clients)
        .map(|i| {
            let mut client = CoordinatorClient::new(channels[i % channels.len()].clone());
            let holder = format!("{}-flash-{i}", ctx.run_id);
            let holds = vec![hold(&stock_name, &item)];
            let progress = progress.clone();
            async move {
                let t = Instant::now();
                let reserved = client
                    .reserve(ReserveRequest {
                        request_id: "bench".into(),
                        holder,
                        ttl: None,
                        holds,
                        labels: Default::default(),
                    })
                    .await;
                let took = t.elapsed();
                let outcome = match reserved {
                    Err(s) if is_capacity_refusal(&s) => Outcome::Rejected,
                    Err(s) => Outcome::Error(describe("Reserve", &s)),
                    Ok(r) => {
                        let r = r.into_inner();
                        match client
                            .confirm(ConfirmRequest {
                                reservation_id: r.id,
                                hold_token: r.hold_token,
                                payment: None,
                            })
                            .await
                        {
                            Ok(c) if c.get_ref().state == confirmed => Outcome::Ok,
                            Ok(c) => Outcome::Error(format!(
                                "Confirm: answered state {} (not CONFIRMED)",
                                c.get_ref().state
                            )),
                            Err(s) => Outcome::Error(describe("Confirm", &s)),
                        }
                    }
                };
                progress.count(&outcome);
                (outcome, took)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let elapsed = start.elapsed();
    let mut recorder = Recorder::default();
    for (outcome, took) in results {
        recorder.record(outcome, took);
    }
    // A Confirm left CONFIRMING (a participant call timed out) is finished by recovery: give
    // it up to 15 s, so the counts below are final rather than in flight.
    let settle_until = Instant::now() + Duration::from_secs(15);
    let mut reads = 0;
    let counts = loop {
        reads += 1;
        let counts = stock
            .get_resource(GetResourceRequest {
                resource: item.clone(),
            })
            .await
            .map_err(|s| describe("GetResource", &s))?
            .into_inner();
        if counts.held == 0 || Instant::now() > settle_until {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let sold = counts.confirmed + counts.held;
    let oversell = (sold - units).max(0);
    let mut notes = vec![];
    if counts.confirmed != recorder.ok() as i64 {
        notes.push(format!(
            "participant counts {} confirmed but {} clients won",
            counts.confirmed,
            recorder.ok()
        ));
    }
    if counts.available < 0 || counts.capacity != units {
        notes.push(format!(
            "participant counts are off: capacity {} available {}",
            counts.capacity, counts.available
        ));
    }
    Ok(Measured {
        extra: serde_json::json!({
            "participant": stock_name,
            "item": item,
            "units": units,
            "clients": clients,
            "concurrency": concurrency,
            "winners": recorder.ok(),
            "losers": recorder.rejected(),
            "participant_counts": {
                "capacity": counts.capacity,
                "available": counts.available,
                "held": counts.held,
                "confirmed": counts.confirmed,
            },
            "oversell": oversell,
        }),
        recorder,
        elapsed,
        notes,
        // The PutResources of the item and, on `stock`, each GetResource (an autocommit
        // read; stock-redis reads its counts from Redis).
        setup_xacts: if kind == Kind::Stock { 1 + reads } else { 1 },
    })
}

/// One stock participant alone (no coordinator): `clients` clients, each on its own
/// connection, send Try for 1 unit of one large item with a fresh branch each time, for
/// `duration`. Measures the participant's own holds per second.
pub async fn holds(
    database_url: &str,
    redis_url: Option<&str>,
    kind: crate::participants::Kind,
    clients: usize,
    duration: Duration,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    use crate::participants::{self, Kind, ParticipantSettings, stock_redis};
    use crate::proto::participant_client::ParticipantClient;
    let pool = crate::db::connect_postgres(
        database_url,
        u32::try_from(clients).unwrap_or(32).clamp(4, 32),
    )
    .await
    .map_err(|e| format!("connecting to {database_url}: {e}"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("binding a loopback port: {e}"))?;
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(|e| format!("reading a bound address: {e}"))?
    );
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut redis_keys = None;
    let server = match kind {
        Kind::StockRedis => {
            let redis = redis_url.ok_or("stock-redis needs --redis-url")?;
            let settings = super::deploy::stock_redis_settings(redis);
            redis_keys = Some((redis.to_owned(), settings.key_prefix.clone()));
            let pool = pool.clone();
            tokio::spawn(async move {
                stock_redis::serve(settings, pool, listener, stopped)
                    .await
                    .map_err(|e| e.to_string())
            })
        }
        _ => {
            let pool = pool.clone();
            tokio::spawn(async move {
                participants::serve(ParticipantSettings::new(kind), pool, listener, stopped)
                    .await
                    .map_err(|e| e.to_string())
            })
        }
    };
    let stop_all = || {
        let _ = stop.send(true);
    };
    let delete_keys = || async {
        if let Some((url, prefix)) = &redis_keys
            && let Err(e) = super::deploy::delete_redis_keys(url, prefix).await
        {
            eprintln!("bench: {e}");
        }
    };
    let item = format!("holds-{}", uuid::Uuid::new_v4().simple());
    let mut ready = false;
    for _ in 0..100 {
        if let Ok(mut admin) = super::deploy::admin_client(&url)
            && put(
                &mut admin,
                vec![ResourceSpec {
                    resource: item.clone(),
                    capacity: 1_000_000_000,
                }],
            )
            .await
            .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !ready {
        stop_all();
        let _ = server.await;
        delete_keys().await;
        pool.close().await;
        return Err(format!("{} never accepted PutResources", kind.name()));
    }
    let channels = super::deploy::channels(&url, clients.max(1))?;
    let expires_at = prost_types::Timestamp {
        seconds: chrono::Utc::now().timestamp() + 3600,
        nanos: 0,
    };
    let start = Instant::now();
    let deadline = start + duration;
    let workers = channels.into_iter().map(|channel| {
        let (progress, item, expires_at) = (progress.clone(), item.clone(), expires_at);
        tokio::spawn(async move {
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
                    Ok(r)
                        if r.get_ref().outcome
                            == crate::proto::try_response::Outcome::Held as i32 =>
                    {
                        Outcome::Ok
                    }
                    Ok(_) => Outcome::Rejected,
                    Err(e) => Outcome::Error(format!("{:?}", e.code())),
                };
                progress.count(&outcome);
                rec.record(outcome, t.elapsed());
            }
            rec
        })
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
