//! `holdfast admin ...`: the operator's actions over `tcc.v1.Admin` (SPEC 8.1) - find stuck
//! work, push it, cancel or settle it with a reason, read the audit log, and see and resume
//! the event sinks (SPEC 10), and see who waits in a resource's queue (SPEC 11, [`super::queue`]).

use std::time::Duration;

use chrono::Utc;

use super::target::CliChannel;
use super::{CliError, Target, json, out, parse_state, print_page, print_reservation, render};
use crate::proto::admin_client::AdminClient;
use crate::proto::{self, reservation::State};

/// `holdfast admin` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum AdminCommand {
    /// Reservations not finished past their due time, with a branch error, or FAILED.
    Stuck {
        /// Only these states (repeatable).
        #[arg(long = "state", value_parser = parse_state)]
        states: Vec<State>,
        /// Only reservations with a branch at this participant.
        #[arg(long)]
        participant: Option<String>,
        /// Only work overdue by at least this much (e.g. 5m).
        #[arg(long, value_parser = crate::config::parse_duration)]
        older_than: Option<Duration>,
        /// Results per page (at most 500).
        #[arg(long, default_value_t = 50)]
        page_size: i32,
        /// Continue from a previous page.
        #[arg(long, default_value = "")]
        page_token: String,
        #[command(flatten)]
        target: Target,
    },
    /// Drive now: one reservation, or every one waiting on a participant that is back.
    #[command(group = clap::ArgGroup::new("what").required(true).args(["id", "participant"]))]
    Retry {
        /// The reservation's id.
        id: Option<String>,
        /// Every reservation with unfinished work at this participant.
        #[arg(long)]
        participant: Option<String>,
        /// Why (recorded in the audit log; without it the entry says what was retried).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        target: Target,
    },
    /// Release a TRYING or HELD reservation without its token (audited).
    ForceCancel {
        /// The reservation's id.
        id: String,
        /// Why (recorded in the audit log).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        target: Target,
    },
    /// Settle a FAILED reservation after checking its participants (audited).
    Resolve {
        /// The reservation's id.
        id: String,
        /// What it ends as: confirmed or cancelled.
        #[arg(long, value_parser = parse_outcome)]
        outcome: State,
        /// Why (recorded in the audit log).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        target: Target,
    },
    /// Who did what, when and why (newest first).
    Audit {
        /// Only this reservation's entries.
        id: Option<String>,
        /// Entries per page (at most 500).
        #[arg(long, default_value_t = 50)]
        page_size: i32,
        /// Continue from a previous page.
        #[arg(long, default_value = "")]
        page_token: String,
        #[command(flatten)]
        target: Target,
    },
    /// The event sinks (NATS, webhooks): how far each has delivered, its lag, paused or not.
    Sinks {
        #[command(flatten)]
        target: Target,
    },
    /// A resource's waitlist in offer order: position, reservation, holder, quantity, since,
    /// until, and the queue's length (every page read).
    Queue {
        #[command(flatten)]
        query: super::queue::QueueQuery,
        #[command(flatten)]
        target: Target,
    },
    /// Resume a webhook paused after failing for --webhook-give-up: delivery restarts where it
    /// stopped.
    ResumeWebhook {
        /// The webhook's name, as given to --webhook NAME=URL.
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

impl AdminCommand {
    pub(super) fn target(&self) -> &Target {
        match self {
            AdminCommand::Stuck { target, .. }
            | AdminCommand::Retry { target, .. }
            | AdminCommand::ForceCancel { target, .. }
            | AdminCommand::Resolve { target, .. }
            | AdminCommand::Audit { target, .. }
            | AdminCommand::Sinks { target }
            | AdminCommand::ResumeWebhook { target, .. }
            | AdminCommand::Queue { target, .. } => target,
        }
    }
}

/// Runs one admin command and prints its answer.
pub async fn run(command: AdminCommand) -> Result<(), CliError> {
    let target = command.target().clone();
    let mut admin = target.admin()?;
    let refused = |s: tonic::Status| CliError::from_status(&s, &target.coordinator);
    match command {
        AdminCommand::Stuck {
            states,
            participant,
            older_than,
            page_size,
            page_token,
            ..
        } => {
            let request = proto::ListStuckRequest {
                states: states.into_iter().map(|s| s as i32).collect(),
                participant: participant.unwrap_or_default(),
                older_than: older_than.map(duration),
                page_size,
                page_token,
            };
            let page = admin.list_stuck(request).await.map_err(refused)?;
            let page = page.into_inner();
            print_page(&target, &page.reservations, &page.next_page_token);
        }
        AdminCommand::Retry {
            id,
            participant,
            reason,
            ..
        } => {
            let request = retry_request(id, participant, reason)?;
            let answer = admin.retry(request).await.map_err(refused)?.into_inner();
            print_retried(&target, &answer);
        }
        AdminCommand::ForceCancel { id, reason, .. } => {
            let request = proto::ForceCancelRequest {
                reservation_id: id,
                reason,
            };
            let r = admin.force_cancel(request).await.map_err(refused)?;
            print_reservation(&target, &r.into_inner());
        }
        AdminCommand::Resolve {
            id,
            outcome,
            reason,
            ..
        } => {
            let r = admin
                .resolve(proto::ResolveRequest {
                    reservation_id: id,
                    outcome: outcome as i32,
                    reason,
                })
                .await
                .map_err(refused)?
                .into_inner();
            print_reservation(&target, &r);
        }
        AdminCommand::Audit {
            id,
            page_size,
            page_token,
            ..
        } => {
            let request = proto::ListAuditRequest {
                reservation_id: id.unwrap_or_default(),
                page_size,
                page_token,
            };
            let page = admin.list_audit(request).await.map_err(refused)?;
            print_audit(&target, &page.into_inner());
        }
        AdminCommand::Queue { query, .. } => super::queue::run(query, &target, &mut admin).await?,
        sink @ (AdminCommand::Sinks { .. } | AdminCommand::ResumeWebhook { .. }) => {
            print_sinks(&target, &sinks(sink, &mut admin).await.map_err(refused)?)
        }
    }
    Ok(())
}

/// `admin sinks` and `admin resume-webhook`: the sinks to print.
async fn sinks(
    command: AdminCommand,
    admin: &mut AdminClient<CliChannel>,
) -> Result<Vec<proto::Sink>, tonic::Status> {
    Ok(match command {
        AdminCommand::ResumeWebhook { name, .. } => {
            let request = proto::ResumeWebhookRequest { name };
            let answer = admin.resume_webhook(request).await?;
            answer.into_inner().sink.into_iter().collect()
        }
        _ => {
            let answer = admin.list_sinks(proto::ListSinksRequest {}).await?;
            answer.into_inner().sinks
        }
    })
}

fn print_sinks(target: &Target, sinks: &[proto::Sink]) {
    if target.json {
        let list: Vec<_> = sinks.iter().map(json::sink).collect();
        out(&format!("{}\n", serde_json::json!({ "sinks": list })));
    } else {
        out(&render::sinks(sinks, Utc::now()));
    }
}

/// What `admin retry` drives (one reservation, or the work waiting on one participant) and
/// why.
fn retry_request(
    id: Option<String>,
    participant: Option<String>,
    reason: String,
) -> Result<proto::RetryRequest, CliError> {
    let target = match (id, participant) {
        (Some(id), _) => proto::retry_request::Target::ReservationId(id),
        (None, Some(p)) => proto::retry_request::Target::Participant(p),
        (None, None) => {
            return Err(CliError::Usage(
                "give a reservation id or --participant".into(),
            ));
        }
    };
    Ok(proto::RetryRequest {
        target: Some(target),
        reason,
    })
}

fn print_retried(target: &Target, answer: &proto::RetryResponse) {
    if target.json {
        let list: Vec<_> = answer.reservations.iter().map(json::reservation).collect();
        let v = serde_json::json!({ "driven": answer.driven, "reservations": list });
        out(&format!("{v}\n"));
    } else {
        out(&format!("driven: {}\n", answer.driven));
        out(&render::reservations(&answer.reservations, Utc::now()));
    }
}

fn print_audit(target: &Target, page: &proto::ListAuditResponse) {
    if target.json {
        let entries: Vec<_> = page.entries.iter().map(json::audit_entry).collect();
        let v = serde_json::json!({
            "entries": entries,
            "next_page_token": page.next_page_token,
        });
        out(&format!("{v}\n"));
    } else {
        out(&render::audit(&page.entries));
        if !page.next_page_token.is_empty() {
            eprintln!("more: --page-token {}", page.next_page_token);
        }
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn parse_outcome(s: &str) -> Result<State, String> {
    match parse_state(s)? {
        s @ (State::Confirmed | State::Cancelled) => Ok(s),
        _ => Err(format!(
            "{s:?}: a FAILED reservation resolves as confirmed or cancelled"
        )),
    }
}
