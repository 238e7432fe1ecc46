//! `tcc.v1.Events/Subscribe` in the coordinator: a reader's subscription to the event log
//! (`crate::events::subscription`) scoped to what the actor may see - a client its own
//! reservations' events, an admin all - on a task of its own, under the same caps as Watch
//! streams (a stream of either kind takes a slot, `super::watchers`), ended with
//! [`Error::ShuttingDown`] when the coordinator shuts down (as Watch streams are).

use tokio::sync::mpsc;
use tokio_stream::Stream;

use super::{Coordinator, Error, WatchConnection};
use crate::domain::{Actor, EventFilter};
pub(crate) use crate::events::subscription::Delivery;
use crate::events::subscription::{self, Subscription};

impl Coordinator {
    /// The events after `after` that `actor` may see and `filter` matches, oldest first, then
    /// live, with heartbeats (`policy.events_heartbeat`). Ends when dropped, after a failed
    /// read (its error the last item), or at shutdown ([`Error::ShuttingDown`] the last item).
    /// Beyond the stream caps (`policy.watch`, shared with Watch: `connection` is the
    /// client's) it is [`Error::WatchLimit`].
    pub(crate) fn subscribe_events(
        &self,
        actor: &Actor,
        connection: Option<WatchConnection>,
        after: i64,
        filter: EventFilter,
    ) -> Result<impl Stream<Item = Result<Delivery, Error>> + Send + 'static, Error> {
        let slot = self.watchers.admit(&actor.principal, connection)?;
        let subscription = Subscription {
            after,
            owner: actor.scope().map(str::to_owned),
            filter,
            heartbeat: self.policy.events_heartbeat,
        };
        let (tx, rx) = mpsc::channel(subscription::BUFFER);
        let feed = self.events.clone();
        tokio::spawn(async move {
            let _slot = slot;
            subscription::run(&feed, subscription, &tx).await;
        });
        let closed = Box::pin(self.watchers.closed());
        // Shutdown first: a reader with a full channel still learns of it at once.
        Ok(futures_util::stream::unfold(
            Some((rx, closed)),
            |open| async move {
                let (mut rx, mut closed) = open?;
                tokio::select! {
                    biased;
                    _ = &mut closed => Some((Err(Error::ShuttingDown), None)),
                    item = rx.recv() => {
                        let item = item?;
                        let more = item.is_ok();
                        Some((item, more.then_some((rx, closed))))
                    }
                }
            },
        ))
    }

    /// The largest sequence of the event log (0 when it is empty); with `back`, the sequence
    /// just before the last `back` events `actor` may see.
    pub(crate) async fn latest_event_sequence(
        &self,
        actor: &Actor,
        back: Option<u32>,
    ) -> Result<i64, Error> {
        let log = self.events.log();
        Ok(match back {
            None => log.latest_sequence().await?,
            Some(n) => log.before_last(actor.scope(), n).await?,
        })
    }
}
