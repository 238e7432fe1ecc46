//! `waitlist`: a flash sale with a waitlist (SPEC 11). Every client Reserves one unit with
//! `queue`: the first `units` are held, the rest wait in the item's queue. Then each holder
//! confirms, cancels or lets its hold expire (by its index); every release is offered to the
//! head of the queue, until every unit is sold. The bench follows the run on Events/Subscribe
//! and fails unless the offers went to the waiting reservations in their queue order exactly
//! (all ask one unit, so the oldest always fits), nothing was oversold and every unit ended
//! sold or available. It reports the join latency (the Reserve that answered QUEUED), the
//! offer latency (a release's event to the next offer's `RESERVATION_HELD`, database clock)
//! and what the queue costs per waiting client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use prost_types::Timestamp;

use super::{Ctx, Measured, Progress, describe, hold, put};
use crate::bench::credentials::BenchChannel;
use crate::bench::stats::{Outcome, Recorder, micros, percentiles};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::event::Type;
use crate::proto::events_client::EventsClient;
use crate::proto::reservation::State;
use crate::proto::{
    CancelRequest, ConfirmRequest, EventFilter, GetLatestSequenceRequest, GetResourceRequest,
    QueueOptions, ReserveRequest, ResourceSpec, SubscribeRequest,
};

/// The holds of holders that let them expire last this long.
const TTL: Duration = Duration::from_secs(2);

/// A run stalls (and fails) when no event arrives for this long.
const STALL_AFTER: Duration = Duration::from_secs(30);

/// What a holder does once it holds: by its client index.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Act {
    Confirm,
    Cancel,
    Expire,
}

fn act_of(i: usize) -> Act {
    match i % 3 {
        0 => Act::Confirm,
        1 => Act::Cancel,
        _ => Act::Expire,
    }
}

/// One client's reservation: its index, id and token.
#[derive(Clone)]
struct Ticket {
    index: usize,
    id: String,
    token: String,
}

/// What the event stream showed: the queue in join order (each reservation's first
/// `RESERVATION_QUEUED`: joins of one queue commit one at a time, in their order), the offers
/// in the order they were placed, each offer's latency after the release it followed, and how
/// many units were sold.
#[derive(Default)]
struct Followed {
    joined: Vec<String>,
    offers: Vec<String>,
    latencies: Vec<u64>,
    sold: i64,
}

pub async fn waitlist(
    ctx: Arc<Ctx>,
    clients: usize,
    concurrency: usize,
    units: i64,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    let item = format!("{}-waitlist", ctx.run_id);
    let (stock_name, stock_admin) = ctx.endpoints.stock.clone();
    let mut stock = ctx.transport.admin_client(&stock_admin)?;
    let spec = ResourceSpec {
        resource: item.clone(),
        capacity: units,
    };
    put(&mut stock, vec![spec])
        .await
        .map_err(|e| format!("provisioning: {e}"))?;
    let channels = ctx
        .transport
        .channels(&ctx.endpoints.coordinator, concurrency.min(32))?;
    let stream = subscribe(&ctx, channels[0].clone()).await?;
    let start = Instant::now();
    let joined = join(
        &ctx,
        &channels,
        &stock_name,
        &item,
        clients,
        concurrency,
        &progress,
    )
    .await;
    let (recorder, held, queued) = sort_answers(joined);
    let placed = queued.iter().all(|(position, _)| *position >= 1);
    let queue: Vec<Ticket> = queued.into_iter().map(|(_, t)| t).collect();
    let client = CoordinatorClient::new(channels[0].clone());
    let followed = follow(client.clone(), stream, &held, &queue, units).await?;
    let elapsed = start.elapsed();
    let offered: std::collections::HashSet<&str> =
        followed.offers.iter().map(String::as_str).collect();
    let waiting: Vec<Ticket> = queue
        .iter()
        .filter(|t| !offered.contains(t.id.as_str()))
        .cloned()
        .collect();
    cancel_all(&channels, &waiting, concurrency).await;
    let counts = stock
        .get_resource(GetResourceRequest {
            resource: item.clone(),
        })
        .await
        .map_err(|s| describe("GetResource", &s))?
        .into_inner();
    let sale = Sale {
        participant: stock_name,
        item,
        units,
        clients,
        held: held.len(),
        queued: queue.len(),
        placed,
    };
    Ok(measured(sale, followed, counts, recorder, elapsed))
}

/// Events/Subscribe from the latest sequence on, of this run's reservations (its label).
async fn subscribe(
    ctx: &Ctx,
    channel: BenchChannel,
) -> Result<tonic::Streaming<crate::proto::Event>, String> {
    let mut events = EventsClient::new(channel);
    let after = events
        .get_latest_sequence(GetLatestSequenceRequest::default())
        .await
        .map_err(|s| describe("GetLatestSequence", &s))?
        .into_inner()
        .sequence;
    let stream = events
        .subscribe(SubscribeRequest {
            after_sequence: after,
            filter: Some(EventFilter {
                labels: [("bench-run".to_owned(), ctx.run_id.clone())].into(),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| describe("Subscribe", &s))?
        .into_inner();

    Ok(stream)
}

/// The sale as the bench ran it.
struct Sale {
    participant: String,
    item: String,
    units: i64,
    clients: usize,
    held: usize,
    queued: usize,
    /// Every queued answer said where it waits.
    placed: bool,
}

/// The row: the checks (queue order, conservation) and what was measured.
fn measured(
    sale: Sale,
    followed: Followed,
    counts: crate::proto::ResourceStatus,
    recorder: Recorder,
    elapsed: Duration,
) -> Measured {
    let in_order = followed.joined.len() >= followed.offers.len()
        && followed
            .joined
            .iter()
            .zip(&followed.offers)
            .all(|(j, o)| j == o);
    let violations = i64::from(!in_order) + i64::from(!sale.placed);
    let offer = percentiles(&followed.latencies);
    let mut notes = vec![format!(
        "{} held at once, {} queued, {} offers placed in queue order: {in_order}; offer latency after a release p50 {:.1} ms p99 {:.1} ms",
        sale.held,
        sale.queued,
        followed.offers.len(),
        offer.p50,
        offer.p99,
    )];
    if counts.confirmed != followed.sold
        || counts.held != 0
        || counts.available + counts.confirmed != sale.units
    {
        notes.push(format!(
            "participant counts {counts:?}, {} sold",
            followed.sold
        ));
    }
    Measured {
        extra: serde_json::json!({
            "participant": sale.participant,
            "item": sale.item,
            "units": sale.units,
            "clients": sale.clients,
            "held_at_once": sale.held,
            "queued": sale.queued,
            "offers": followed.offers.len(),
            "sold": followed.sold,
            "queue_order_violations": violations,
            "offer_latency_ms": { "p50": offer.p50, "p99": offer.p99, "max": offer.max },
            "left_held": counts.held,
            "oversell": (counts.confirmed + counts.held - sale.units).max(0),
            "participant_counts": {
                "capacity": counts.capacity,
                "available": counts.available,
                "held": counts.held,
                "confirmed": counts.confirmed,
            },
        }),
        recorder,
        elapsed,
        notes,
        setup_xacts: 2,
    }
}

/// Every client's Reserve with `queue`: (index, answer, latency).
async fn join(
    ctx: &Ctx,
    channels: &[BenchChannel],
    stock: &str,
    item: &str,
    clients: usize,
    concurrency: usize,
    progress: &Arc<Progress>,
) -> Vec<(usize, Result<crate::proto::Reservation, String>, Duration)> {
    futures_util::stream::iter(0..clients)
        .map(|i| {
            let mut client = CoordinatorClient::new(channels[i % channels.len()].clone());
            let req = ReserveRequest {
                request_id: "bench".into(),
                holder: format!("{}-wait-{i}", ctx.run_id),
                ttl: Some(prost_types::Duration {
                    seconds: TTL.as_secs() as i64,
                    nanos: 0,
                }),
                holds: vec![hold(stock, item)],
                labels: [("bench-run".to_owned(), ctx.run_id.clone())].into(),
                queue: Some(QueueOptions {
                    wait_up_to: Some(prost_types::Duration {
                        seconds: 3600,
                        nanos: 0,
                    }),
                }),
            };
            let progress = progress.clone();
            async move {
                let t = Instant::now();
                let answer = client.reserve(req).await;
                let took = t.elapsed();
                let answer = answer
                    .map(|r| r.into_inner())
                    .map_err(|s| describe("Reserve", &s));
                progress.count(&if answer.is_ok() {
                    Outcome::Ok
                } else {
                    Outcome::Error(String::new())
                });
                (i, answer, took)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

type Answers = (Recorder, Vec<Ticket>, Vec<(i64, Ticket)>);

/// The join latencies, the tickets held at once and the queued ones with their positions.
fn sort_answers(
    joined: Vec<(usize, Result<crate::proto::Reservation, String>, Duration)>,
) -> Answers {
    let mut recorder = Recorder::default();
    let (mut held, mut queued) = (Vec::new(), Vec::new());
    for (index, answer, took) in joined {
        match answer {
            Ok(r) => {
                let ticket = Ticket {
                    index,
                    id: r.id.clone(),
                    token: r.hold_token.clone(),
                };
                match (r.state(), &r.queue) {
                    (State::Held, _) => held.push(ticket),
                    (State::Queued, Some(q)) => queued.push((q.position, ticket)),
                    (other, _) => {
                        recorder
                            .record(Outcome::Error(format!("Reserve answered {other:?}")), took);
                        continue;
                    }
                }
                recorder.record(Outcome::Ok, took);
            }
            Err(e) => recorder.record(Outcome::Error(e), took),
        }
    }
    (recorder, held, queued)
}

/// Drives the sale from its events: each reservation that holds acts (confirm, cancel, or
/// nothing: its hold expires); each release is paired with the next offer; until every unit
/// is sold or nobody waits.
async fn follow(
    client: CoordinatorClient<BenchChannel>,
    mut stream: tonic::Streaming<crate::proto::Event>,
    held: &[Ticket],
    queue: &[Ticket],
    units: i64,
) -> Result<Followed, String> {
    let tickets: HashMap<&str, &Ticket> = held
        .iter()
        .chain(queue)
        .map(|t| (t.id.as_str(), t))
        .collect();
    for t in held {
        act(client.clone(), t);
    }
    let mut f = Followed::default();
    let mut releases: Vec<Timestamp> = Vec::new();
    let mut offered_at: Vec<Timestamp> = Vec::new();
    let mut seen_queued: std::collections::HashSet<String> = std::collections::HashSet::new();
    while f.sold < units && f.offers.len() < queue.len() {
        let next = tokio::time::timeout(STALL_AFTER, stream.next()).await;
        let e = match next {
            Ok(Some(Ok(e))) => e,
            Ok(Some(Err(s))) => return Err(describe("Subscribe", &s)),
            Ok(None) => return Err("the event stream ended".into()),
            Err(_) => return Err(format!("no event for {STALL_AFTER:?}: the sale stalled")),
        };
        let id = e
            .reservation
            .as_ref()
            .map(|r| r.id.clone())
            .unwrap_or_default();
        let at = e.occurred_at.unwrap_or_default();
        match e.r#type() {
            Type::ReservationHeld if e.from_queue => {
                if let Some(t) = tickets.get(id.as_str()) {
                    act(client.clone(), t);
                }
                f.offers.push(id);
                offered_at.push(at);
            }
            Type::ReservationQueued if !seen_queued.contains(&id) => {
                seen_queued.insert(id.clone());
                f.joined.push(id);
            }
            Type::ReservationCancelled | Type::ReservationExpired => releases.push(at),
            Type::ReservationConfirmed => f.sold += 1,
            _ => {}
        }
    }
    for (r, o) in releases.iter().zip(&offered_at) {
        let gap = (o.seconds - r.seconds) * 1_000_000 + i64::from(o.nanos - r.nanos) / 1000;
        f.latencies
            .push(micros(Duration::from_micros(gap.max(0) as u64)));
    }
    Ok(f)
}

/// A holder's act, in a task of its own (the event loop keeps reading).
fn act(mut client: CoordinatorClient<BenchChannel>, t: &Ticket) {
    let (id, token) = (t.id.clone(), t.token.clone());
    let what = act_of(t.index);
    tokio::spawn(async move {
        let answer = match what {
            Act::Confirm => client
                .confirm(ConfirmRequest {
                    reservation_id: id,
                    hold_token: token,
                    payment: None,
                })
                .await
                .map(drop),
            Act::Cancel => client
                .cancel(CancelRequest {
                    reservation_id: id,
                    hold_token: token,
                    reason: "bench: waitlist".into(),
                })
                .await
                .map(drop),
            Act::Expire => Ok(()),
        };
        // A hold that expired before its holder acted (the joins ran longer than its ttl) is
        // released like one let go: not an error of the sale.
        match answer {
            Err(s)
                if !s.message().contains("expired")
                    && s.code() != tonic::Code::FailedPrecondition =>
            {
                eprintln!("bench: waitlist: {}", describe("a holder's call", &s));
            }
            _ => {}
        }
    });
}

/// Cancels the reservations still waiting (nothing held; they leave the queue).
async fn cancel_all(channels: &[BenchChannel], waiting: &[Ticket], concurrency: usize) {
    futures_util::stream::iter(waiting.iter().enumerate())
        .for_each_concurrent(concurrency.max(1), |(i, t)| {
            let mut client = CoordinatorClient::new(channels[i % channels.len()].clone());
            async move {
                let _ = client
                    .cancel(CancelRequest {
                        reservation_id: t.id.clone(),
                        hold_token: t.token.clone(),
                        reason: "bench: the sale is over".into(),
                    })
                    .await;
            }
        })
        .await;
}
