//! The event sinks a coordinator process delivers to (SPEC 10), as its flags configure them:
//! the webhooks (`--webhook NAME=URL`, [`crate::sinks::webhook`]) and NATS JetStream
//! (`--events-nats-url`). Each runs its delivery loop beside the coordinator
//! ([`super::Beside`]).

use std::sync::Arc;

use super::AppError;
use crate::config::CoordinatorArgs;
use crate::sinks::Sink;
use crate::sinks::webhook::Webhook;

/// The sinks `args` configure, checked (files read, URLs parsed); none when none is given.
pub(super) async fn configured_sinks(
    args: &CoordinatorArgs,
) -> Result<Vec<Arc<dyn Sink>>, AppError> {
    let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
    for settings in args.sinks.webhooks().map_err(AppError::Config)? {
        let webhook = Webhook::new(settings).map_err(|e| AppError::Config(e.to_string()))?;
        sinks.push(Arc::new(webhook));
    }
    Ok(sinks)
}
