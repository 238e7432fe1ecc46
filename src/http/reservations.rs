//! `tcc.v1.Coordinator` as JSON (SPEC 8.4): `POST /v1/reservations` (Reserve),
//! `POST /v1/reservations/{id}:confirm|:cancel|:extend`, `GET /v1/reservations/{id}`,
//! `GET /v1/reservations?holder=&state=&participant=&created_after=&created_before=&label=K=V&page_size=&page_token=`
//! (or a lookup: `?id_prefix=` or `?request_id=`),
//! and `GET /v1/reservations/{id}:watch` (server-sent events, [`super::watch`]). Field names
//! are the proto's; answers are [`crate::json`]'s shape, with `hold_token` in Reserve's only.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::body::{self, duration, timestamp};
use super::credentials::Credentials;
use super::error::{ApiError, invalid};
use super::grpc::coordinator;
use super::{Shared, watch};
use crate::proto;

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/v1/reservations", post(reserve).get(list))
        .route("/v1/reservations/{target}", get(read).post(act))
}

/// A JSON answer with 200.
pub fn ok(value: serde_json::Value) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

/// `{id}` or `{id}:{verb}`.
pub(crate) fn split_target(target: &str) -> (&str, Option<&str>) {
    match target.split_once(':') {
        Some((id, verb)) => (id, Some(verb)),
        None => (target, None),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    holder: String,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    holds: Vec<HoldBody>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    queue: Option<QueueBody>,
}

/// `"queue": {"wait_up_to": "60s"}`: wait in the resource's queue when sold out (SPEC 11).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueBody {
    #[serde(default)]
    wait_up_to: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldBody {
    #[serde(default)]
    participant: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    quantity: i64,
    #[serde(default)]
    during: Option<IntervalBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IntervalBody {
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    end: Option<String>,
}

/// The gRPC message of a Reserve body (its times and ttl parsed, naming the field).
fn reserve_message(b: ReserveBody) -> Result<proto::ReserveRequest, tonic::Status> {
    let mut holds = Vec::with_capacity(b.holds.len());
    for (i, h) in b.holds.into_iter().enumerate() {
        let during = match h.during {
            None => None,
            Some(d) => {
                let at = |part: &str, v: Option<String>| {
                    v.map(|t| timestamp(&format!("holds[{i}].during.{part}"), &t))
                        .transpose()
                };
                Some(proto::Interval {
                    start: at("start", d.start)?,
                    end: at("end", d.end)?,
                })
            }
        };
        holds.push(proto::Hold {
            participant: h.participant,
            resource: h.resource,
            quantity: h.quantity,
            during,
        });
    }
    Ok(proto::ReserveRequest {
        request_id: b.request_id,
        holder: b.holder,
        ttl: b.ttl.map(|t| duration("ttl", &t)).transpose()?,
        holds,
        labels: b.labels.into_iter().collect(),
        queue: b
            .queue
            .map(|q| -> Result<_, tonic::Status> {
                Ok(proto::QueueOptions {
                    wait_up_to: q
                        .wait_up_to
                        .map(|w| duration("queue.wait_up_to", &w))
                        .transpose()?,
                })
            })
            .transpose()?,
    })
}

async fn reserve(
    State(service): State<Shared>,
    credentials: Credentials,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let message = match body::json(body).await.and_then(reserve_message) {
        Ok(message) => message,
        Err(bad) => return Err(service.refuse(&credentials, "/tcc.v1.Coordinator/Reserve", bad)),
    };
    let r = coordinator(&service.grpc)
        .reserve(credentials.request(message)?)
        .await?
        .into_inner();
    // Reserve's answer is the one place a hold token is given, as over gRPC.
    Ok(ok(crate::json::reservation_with_token(&r)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfirmBody {
    #[serde(default)]
    hold_token: String,
    #[serde(default)]
    payment: Option<PaymentBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentBody {
    #[serde(default)]
    participant: String,
    #[serde(default)]
    payment_ref: String,
    #[serde(default)]
    amount_minor: i64,
    #[serde(default)]
    currency: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    #[serde(default)]
    hold_token: String,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    #[serde(default)]
    hold_token: String,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    request_id: String,
}

/// `POST /v1/reservations/{id}:confirm|:cancel|:extend`.
async fn act(
    State(service): State<Shared>,
    Path(target): Path<String>,
    credentials: Credentials,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let (id, verb) = split_target(&target);
    let reservation_id = id.to_owned();
    let mut client = coordinator(&service.grpc);
    let local = |method: &str, bad| service.refuse(&credentials, method, bad);
    let r = match verb {
        Some("confirm") => {
            const METHOD: &str = "/tcc.v1.Coordinator/Confirm";
            let b: ConfirmBody = body::json(body).await.map_err(|e| local(METHOD, e))?;
            let message = proto::ConfirmRequest {
                reservation_id,
                hold_token: b.hold_token,
                payment: b.payment.map(|p| proto::Payment {
                    participant: p.participant,
                    payment_ref: p.payment_ref,
                    amount_minor: p.amount_minor,
                    currency: p.currency,
                }),
            };
            client.confirm(credentials.request(message)?).await?
        }
        Some("cancel") => {
            const METHOD: &str = "/tcc.v1.Coordinator/Cancel";
            let b: CancelBody = body::json(body).await.map_err(|e| local(METHOD, e))?;
            let message = proto::CancelRequest {
                reservation_id,
                hold_token: b.hold_token,
                reason: b.reason,
            };
            client.cancel(credentials.request(message)?).await?
        }
        Some("extend") => {
            const METHOD: &str = "/tcc.v1.Coordinator/Extend";
            let b: ExtendBody = body::json(body).await.map_err(|e| local(METHOD, e))?;
            let message = proto::ExtendRequest {
                reservation_id,
                hold_token: b.hold_token,
                ttl: b
                    .ttl
                    .map(|t| duration("ttl", &t))
                    .transpose()
                    .map_err(|e| local(METHOD, e))?,
                request_id: b.request_id,
            };
            client.extend(credentials.request(message)?).await?
        }
        _ => {
            return Err(unknown_verb(
                &target,
                "POST",
                &["confirm", "cancel", "extend"],
            ));
        }
    };
    Ok(ok(crate::json::reservation(r.get_ref())))
}

/// A path that names no action.
pub(crate) fn unknown_verb(target: &str, method: &str, verbs: &[&str]) -> ApiError {
    ApiError(tonic::Status::not_found(format!(
        "no {method} action {target:?}: use {{id}}:{}",
        verbs.join(", {id}:")
    )))
}

/// `GET /v1/reservations/{id}` and `GET /v1/reservations/{id}:watch`.
async fn read(
    State(service): State<Shared>,
    Path(target): Path<String>,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let (id, verb) = split_target(&target);
    let message = proto::GetReservationRequest {
        reservation_id: id.to_owned(),
    };
    match verb {
        None => {
            let r = coordinator(&service.grpc)
                .get_reservation(credentials.request(message)?)
                .await?;
            Ok(ok(crate::json::reservation(r.get_ref())))
        }
        Some("watch") => watch::stream(&service, &credentials, id).await,
        Some(_) => Err(unknown_verb(&target, "GET", &["watch"])),
    }
}

const LIST_PARAMS: &[&str] = &[
    "holder",
    "state",
    "participant",
    "created_after",
    "created_before",
    "label",
    "page_size",
    "page_token",
    "id_prefix",
    "request_id",
];

/// A state by its name (`HELD`, case-insensitive), named `field` in errors.
pub fn state(field: &str, name: &str) -> Result<i32, tonic::Status> {
    proto::reservation::State::from_str_name(&name.to_ascii_uppercase())
        .filter(|s| *s != proto::reservation::State::Unspecified)
        .map(|s| s as i32)
        .ok_or_else(|| {
            invalid(
                field,
                format!("{name:?} is not a state (TRYING, HELD, CONFIRMING, CONFIRMED, CANCELLING, CANCELLED, EXPIRED, REJECTED, FAILED, QUEUED)"),
            )
        })
}

/// `GET /v1/reservations?...`: `label` repeats, each `KEY=VALUE`.
async fn list(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let message = list_message(raw.as_deref())
        .map_err(|bad| service.refuse(&credentials, "/tcc.v1.Coordinator/ListReservations", bad))?;
    let page = coordinator(&service.grpc)
        .list_reservations(credentials.request(message)?)
        .await?
        .into_inner();
    Ok(ok(crate::json::reservations(
        &page.reservations,
        &page.next_page_token,
    )))
}

/// The gRPC message of a List query string.
fn list_message(raw: Option<&str>) -> Result<proto::ListReservationsRequest, tonic::Status> {
    let params = body::query(raw, LIST_PARAMS, &["label"])?;
    let text = |name: &str| body::one(&params, name).unwrap_or("").to_owned();
    let time = |name: &str| {
        body::one(&params, name)
            .filter(|v| !v.is_empty())
            .map(|v| timestamp(name, v))
            .transpose()
    };
    let mut labels = std::collections::HashMap::new();
    for pair in params.get("label").into_iter().flatten() {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| invalid("label", format!("{pair:?} is not KEY=VALUE")))?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(proto::ListReservationsRequest {
        holder: text("holder"),
        state: match body::one(&params, "state").filter(|s| !s.is_empty()) {
            Some(s) => state("state", s)?,
            None => 0,
        },
        page_size: body::int32(&params, "page_size")?,
        page_token: text("page_token"),
        participant: text("participant"),
        created_after: time("created_after")?,
        created_before: time("created_before")?,
        labels,
        id_prefix: text("id_prefix"),
        request_id: text("request_id"),
    })
}
