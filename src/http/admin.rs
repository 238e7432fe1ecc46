//! `tcc.v1.Admin` as JSON, for the console's operator views and actions:
//! `GET /v1/admin/stuck?state=&participant=&older_than=&page_size=&page_token=`,
//! `POST /v1/admin/retry` (`{"reservation_id"}` or `{"participant"}`, optionally `"reason"`),
//! `POST /v1/admin/reservations/{id}:force-cancel` (`{"reason"}`),
//! `POST /v1/admin/reservations/{id}:resolve` (`{"outcome","reason"}`),
//! `GET /v1/admin/audit?reservation_id=&page_size=&page_token=`,
//! `GET /v1/admin/participants` (each registered participant: URL, health, latency, last
//! error),
//! `GET /v1/admin/sinks` (the event sinks, SPEC 10),
//! `GET /v1/admin/counts` (reservations by state, counted in the database),
//! `GET /v1/admin/inventory?resource=PARTICIPANT/RESOURCE` (repeated; stock levels),
//! `GET /v1/admin/queue?participant=&resource=&during=START/END&page_size=&page_token=` (a
//! resource's waitlist in offer order, SPEC 11) and
//! `POST /v1/admin/webhooks/{name}:resume` (a paused webhook).

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;

use super::Shared;
use super::body::{self, duration, timestamp};
use super::credentials::Credentials;
use super::error::{ApiError, invalid};
use super::grpc::admin;
use super::reservations::{ok, split_target, state, unknown_verb};
use crate::proto;

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/v1/admin/stuck", get(stuck))
        .route("/v1/admin/retry", post(retry))
        .route("/v1/admin/reservations/{target}", post(act))
        .route("/v1/admin/audit", get(audit))
        .route("/v1/admin/participants", get(participants))
        .route("/v1/admin/sinks", get(sinks))
        .route("/v1/admin/counts", get(counts))
        .route("/v1/admin/inventory", get(inventory))
        .route("/v1/admin/queue", get(queue))
        .route("/v1/admin/webhooks/{target}", post(resume_webhook))
}

/// The gRPC message of a stuck-work query string (`state` repeats).
fn stuck_message(raw: Option<&str>) -> Result<proto::ListStuckRequest, tonic::Status> {
    let params = body::query(
        raw,
        &[
            "state",
            "participant",
            "older_than",
            "page_size",
            "page_token",
        ],
        &["state"],
    )?;
    let mut states = Vec::new();
    for s in params.get("state").into_iter().flatten() {
        states.push(state("state", s)?);
    }
    Ok(proto::ListStuckRequest {
        states,
        participant: body::one(&params, "participant").unwrap_or("").to_owned(),
        older_than: body::one(&params, "older_than")
            .filter(|v| !v.is_empty())
            .map(|v| duration("older_than", v))
            .transpose()?,
        page_size: body::int32(&params, "page_size")?,
        page_token: body::one(&params, "page_token").unwrap_or("").to_owned(),
    })
}

async fn stuck(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let message = stuck_message(raw.as_deref())
        .map_err(|bad| service.refuse(&credentials, "/tcc.v1.Admin/ListStuck", bad))?;
    let page = admin(&service.grpc)
        .list_stuck(credentials.request(message)?)
        .await?
        .into_inner();
    let mut answer = crate::json::reservations(&page.reservations, &page.next_page_token);
    answer["work"] = page.work.iter().map(crate::json::stuck_work).collect();
    Ok(ok(answer))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    #[serde(default)]
    reservation_id: Option<String>,
    #[serde(default)]
    participant: Option<String>,
    #[serde(default)]
    reason: String,
}

async fn retry(
    State(service): State<Shared>,
    credentials: Credentials,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    use proto::retry_request::Target;
    let (target, reason) = body::json(body)
        .await
        .and_then(|b: RetryBody| {
            let target = match (b.reservation_id, b.participant) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "participant",
                        "give reservation_id or participant, not both",
                    ));
                }
                (Some(id), None) => Some(Target::ReservationId(id)),
                (None, Some(p)) => Some(Target::Participant(p)),
                (None, None) => None,
            };
            Ok((target, b.reason))
        })
        .map_err(|bad| service.refuse(&credentials, "/tcc.v1.Admin/Retry", bad))?;
    let answer = admin(&service.grpc)
        .retry(credentials.request(proto::RetryRequest { target, reason })?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({
        "driven": answer.driven,
        "reservations": answer.reservations.iter().map(crate::json::reservation).collect::<Vec<_>>(),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceCancelBody {
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    reason: String,
}

/// `POST /v1/admin/reservations/{id}:force-cancel|:resolve`.
async fn act(
    State(service): State<Shared>,
    Path(target): Path<String>,
    credentials: Credentials,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let (id, verb) = split_target(&target);
    let reservation_id = id.to_owned();
    let mut client = admin(&service.grpc);
    let local = |method: &str, bad| service.refuse(&credentials, method, bad);
    let r = match verb {
        Some("force-cancel") => {
            let b: ForceCancelBody = body::json(body)
                .await
                .map_err(|e| local("/tcc.v1.Admin/ForceCancel", e))?;
            let message = proto::ForceCancelRequest {
                reservation_id,
                reason: b.reason,
            };
            client.force_cancel(credentials.request(message)?).await?
        }
        Some("resolve") => {
            const METHOD: &str = "/tcc.v1.Admin/Resolve";
            let b: ResolveBody = body::json(body).await.map_err(|e| local(METHOD, e))?;
            let outcome = if b.outcome.is_empty() {
                0
            } else {
                state("outcome", &b.outcome).map_err(|e| local(METHOD, e))?
            };
            let message = proto::ResolveRequest {
                reservation_id,
                outcome,
                reason: b.reason,
            };
            client.resolve(credentials.request(message)?).await?
        }
        _ => return Err(unknown_verb(&target, "POST", &["force-cancel", "resolve"])),
    };
    Ok(ok(crate::json::reservation(r.get_ref())))
}

/// The gRPC message of an audit query string.
fn audit_message(raw: Option<&str>) -> Result<proto::ListAuditRequest, tonic::Status> {
    let params = body::query(raw, &["reservation_id", "page_size", "page_token"], &[])?;
    Ok(proto::ListAuditRequest {
        reservation_id: body::one(&params, "reservation_id")
            .unwrap_or("")
            .to_owned(),
        page_size: body::int32(&params, "page_size")?,
        page_token: body::one(&params, "page_token").unwrap_or("").to_owned(),
    })
}

async fn audit(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let message = audit_message(raw.as_deref())
        .map_err(|bad| service.refuse(&credentials, "/tcc.v1.Admin/ListAudit", bad))?;
    let page = admin(&service.grpc)
        .list_audit(credentials.request(message)?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({
        "entries": page.entries.iter().map(crate::json::audit_entry).collect::<Vec<_>>(),
        "next_page_token": page.next_page_token,
    })))
}

/// Each registered participant and whether it answers its health check (admins only: it
/// names the deployment's services). No gRPC method serves it; the auth layer judges it as an
/// unlisted `tcc.v1.Admin` method, which is admin-only (`auth/rules.rs`).
async fn participants(
    State(service): State<Shared>,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    service.admit(&credentials, "/tcc.v1.Admin/ParticipantHealth")?;
    let list = (service.participants)().await;
    Ok(ok(serde_json::json!({
        "participants": list.iter().map(participant).collect::<Vec<_>>(),
    })))
}

/// One participant: `latency_ms` of its health check, `last_error` and `last_error_at`
/// (RFC 3339) of its last failed call, null if none failed.
fn participant(p: &super::ParticipantStatus) -> serde_json::Value {
    let at = p.last_error.as_ref().map(|(_, at)| {
        chrono::DateTime::<chrono::Utc>::from(*at)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    });
    serde_json::json!({
        "name": p.name,
        "url": p.url,
        "serving": p.serving,
        "latency_ms": p.latency.as_secs_f64() * 1000.0,
        "last_error": p.last_error.as_ref().map(|(e, _)| e),
        "last_error_at": at,
    })
}

/// `GET /v1/admin/sinks`: every event sink's delivery state.
async fn sinks(
    State(service): State<Shared>,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let answer = admin(&service.grpc)
        .list_sinks(credentials.request(proto::ListSinksRequest {})?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({
        "sinks": answer.sinks.iter().map(crate::json::sink).collect::<Vec<_>>(),
    })))
}

/// `GET /v1/admin/counts`: reservations by state, live and over the last hour per minute.
async fn counts(
    State(service): State<Shared>,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let answer = admin(&service.grpc)
        .count_reservations(credentials.request(proto::CountReservationsRequest {})?)
        .await?
        .into_inner();
    Ok(ok(crate::json::state_counts(&answer)))
}

/// The gRPC message of an inventory query string: `resource` repeats, each
/// `PARTICIPANT/RESOURCE` (the resource may hold further slashes).
fn inventory_message(raw: Option<&str>) -> Result<proto::GetInventoryRequest, tonic::Status> {
    let params = body::query(raw, &["resource"], &["resource"])?;
    let mut resources = Vec::new();
    for item in params.get("resource").into_iter().flatten() {
        let (participant, resource) = item
            .split_once('/')
            .ok_or_else(|| invalid("resource", format!("{item:?} is not PARTICIPANT/RESOURCE")))?;
        resources.push(proto::ResourceRef {
            participant: participant.to_owned(),
            resource: resource.to_owned(),
        });
    }
    Ok(proto::GetInventoryRequest { resources })
}

/// `GET /v1/admin/inventory?resource=seats/A1&resource=...`: each resource's stock levels.
async fn inventory(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let message = inventory_message(raw.as_deref())
        .map_err(|bad| service.refuse(&credentials, "/tcc.v1.Admin/GetInventory", bad))?;
    let answer = admin(&service.grpc)
        .get_inventory(credentials.request(message)?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({
        "lines": answer.lines.iter().map(crate::json::inventory_line).collect::<Vec<_>>(),
    })))
}

/// The gRPC message of a queue query string; `during` is the slot as `START/END` (RFC 3339).
fn queue_message(raw: Option<&str>) -> Result<proto::ListQueueRequest, tonic::Status> {
    let params = body::query(
        raw,
        &[
            "participant",
            "resource",
            "during",
            "page_size",
            "page_token",
        ],
        &[],
    )?;
    let text = |name: &str| body::one(&params, name).unwrap_or("").to_owned();
    let during = match body::one(&params, "during").filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => {
            let (start, end) = v
                .split_once('/')
                .ok_or_else(|| invalid("during", format!("{v:?} is not START/END")))?;
            Some(proto::Interval {
                start: Some(timestamp("during", start)?),
                end: Some(timestamp("during", end)?),
            })
        }
    };
    Ok(proto::ListQueueRequest {
        participant: text("participant"),
        resource: text("resource"),
        during,
        page_size: body::int32(&params, "page_size")?,
        page_token: text("page_token"),
    })
}

/// `GET /v1/admin/queue?participant=seats&resource=A1`: a page of the resource's waitlist,
/// head first, and how many wait in all.
async fn queue(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let message = queue_message(raw.as_deref())
        .map_err(|bad| service.refuse(&credentials, "/tcc.v1.Admin/ListQueue", bad))?;
    let page = admin(&service.grpc)
        .list_queue(credentials.request(message)?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({
        "entries": page.entries.iter().map(crate::json::queued_reservation).collect::<Vec<_>>(),
        "next_page_token": page.next_page_token,
        "length": page.length,
    })))
}

/// `POST /v1/admin/webhooks/{name}:resume`: delivery to a paused webhook restarts where it
/// stopped.
async fn resume_webhook(
    State(service): State<Shared>,
    Path(target): Path<String>,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let (name, verb) = split_target(&target);
    if verb != Some("resume") {
        return Err(unknown_verb(&target, "POST", &["resume"]));
    }
    let message = proto::ResumeWebhookRequest {
        name: name.to_owned(),
    };
    let answer = admin(&service.grpc)
        .resume_webhook(credentials.request(message)?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({
        "sink": answer.sink.as_ref().map(crate::json::sink),
    })))
}
