//! `holdfast watch ID`: follows a reservation through `WatchReservation` until it ends. On a
//! terminal the status line is redrawn every second (the countdown to `expires_at`); every
//! state change is printed as a line of its own, so a pipe gets one line per change (with
//! `--json`, one object per line).

use std::io::IsTerminal;
use std::time::Duration;

use chrono::Utc;

use super::{CliError, Target, json, out, render};
use crate::proto::{self, coordinator_client::CoordinatorClient};

/// Watches `id` until its stream ends (after a terminal state).
pub async fn run(target: &Target, id: String) -> Result<(), CliError> {
    let mut client = CoordinatorClient::new(target.stream_channel()?);
    let refused = |s: tonic::Status| CliError::from_status(&s, &target.coordinator);
    let mut stream = client
        .watch_reservation(proto::WatchReservationRequest { reservation_id: id })
        .await
        .map_err(refused)?
        .into_inner();
    let live = !target.json && std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last: Option<proto::Reservation> = None;
    loop {
        tokio::select! {
            message = stream.message() => match message.map_err(refused)? {
                Some(r) => {
                    let line = if target.json {
                        json::reservation(&r).to_string()
                    } else {
                        render::watch_line(&r, Utc::now())
                    };
                    out(&format!("{}{line}\n", if live { "\r\x1b[2K" } else { "" }));
                    last = Some(r);
                }
                None => {
                    if live {
                        out("\r\x1b[2K");
                    }
                    return Ok(());
                }
            },
            _ = tick.tick(), if live => {
                if let Some(r) = &last {
                    out(&format!("\r\x1b[2K{}", render::watch_line(r, Utc::now())));
                }
            }
        }
    }
}
