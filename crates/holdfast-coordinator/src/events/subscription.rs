//! One reader of the log (`tcc.v1.Events/Subscribe`, and through it the JSON API and the
//! CLI): the events after a sequence, page by page, those that match its [`EventFilter`] sent
//! in order on a bounded channel, then live as the feed moves, with a heartbeat at least every
//! `heartbeat`. A reader that does not take what it is sent blocks only its own task: nothing
//! is read ahead beyond the channel's [`BUFFER`] and one page.
//!
//! The reader's cursor is the sequence every event up to which has been sent or did not match:
//! the last event of a page, or - when a page was not full - the feed's latest sequence as it
//! was before the page was read (every event up to it is committed and numbered, so the page
//! held all of them that this reader may see). Heartbeats carry that cursor, so a reader whose
//! filter matches nothing still moves on, and may resume after a heartbeat's sequence.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::EventFeed;
use crate::domain::{Event, EventFilter};
use crate::store::StoreError;

/// Events read per page of the backlog.
const PAGE: u32 = 500;

/// Deliveries a subscription may have read that its reader has not yet taken.
pub(crate) const BUFFER: usize = 64;

/// Where a subscription starts and what it may see.
#[derive(Clone, Debug)]
pub(crate) struct Subscription {
    /// Events with a larger sequence (0: from the oldest kept).
    pub after: i64,
    /// Only this owner's reservations (`None`: everyone's).
    pub owner: Option<String>,
    pub filter: EventFilter,
    /// The longest time between two heartbeats.
    pub heartbeat: Duration,
}

/// What a subscription sends.
#[derive(Clone, Debug)]
pub(crate) enum Delivery {
    Event(Box<Event>),
    /// The stream is alive; every event up to this sequence was sent or did not match. The
    /// first is sent when the backlog is done.
    Heartbeat(i64),
}

/// The reader went away: stop.
struct Gone;

/// A subscription's state between pages.
struct Reader<'a, E> {
    feed: &'a EventFeed,
    subscription: Subscription,
    tx: &'a mpsc::Sender<Result<Delivery, E>>,
    cursor: i64,
    last_heartbeat: Instant,
}

impl<E> Reader<'_, E> {
    async fn send(&mut self, delivery: Delivery) -> Result<(), Gone> {
        if let Delivery::Heartbeat(_) = delivery {
            self.last_heartbeat = Instant::now();
        }
        self.tx.send(Ok(delivery)).await.map_err(|_| Gone)
    }

    async fn heartbeat(&mut self) -> Result<(), Gone> {
        self.send(Delivery::Heartbeat(self.cursor)).await
    }

    /// Reads and sends one page; `Ok(true)` when it was full (more may be waiting).
    async fn page(&mut self, known: i64) -> Result<Result<bool, StoreError>, Gone> {
        let owner = self.subscription.owner.as_deref();
        let events = match self.feed.page(self.cursor, owner, PAGE).await {
            Ok(events) => events,
            Err(e) => return Ok(Err(e)),
        };
        let full = events.len() >= PAGE as usize;
        for event in events {
            self.cursor = self.cursor.max(event.sequence);
            if self.subscription.filter.matches(&event) {
                self.send(Delivery::Event(Box::new(event))).await?;
            }
        }
        if !full {
            self.cursor = self.cursor.max(known);
        }
        Ok(Ok(full))
    }

    fn heartbeat_due(&self) -> Instant {
        self.last_heartbeat + self.subscription.heartbeat
    }
}

/// Runs `subscription` over `feed` into `tx` until the reader goes away (`tx` closed) or a
/// read fails (its error the last item sent).
pub(crate) async fn run<E: From<StoreError>>(
    feed: &EventFeed,
    subscription: Subscription,
    tx: &mpsc::Sender<Result<Delivery, E>>,
) {
    let mut follow = feed.follow();
    let mut reader = Reader {
        feed,
        cursor: subscription.after.max(0),
        subscription,
        tx,
        last_heartbeat: Instant::now(),
    };
    let mut caught_up = false;
    loop {
        let mut known = *follow.borrow_and_update();
        if !caught_up {
            // Until the first catch-up, the latest as the log has it now: the feed's follower
            // may not have seen what this reader's page reads, and the first heartbeat should
            // say how far the reader is.
            match feed.log().latest_sequence().await {
                Ok(latest) => known = known.max(latest),
                Err(e) => {
                    let _ = tx.send(Err(E::from(e))).await;
                    return;
                }
            }
        }
        let full = match reader.page(known).await {
            Err(Gone) => return,
            Ok(Err(e)) => {
                let _ = tx.send(Err(E::from(e))).await;
                return;
            }
            Ok(Ok(full)) => full,
        };
        if full {
            if Instant::now() >= reader.heartbeat_due() && reader.heartbeat().await.is_err() {
                return;
            }
            continue;
        }
        if !caught_up {
            caught_up = true;
            if reader.heartbeat().await.is_err() {
                return;
            }
        }
        if wait(&mut reader, &mut follow).await.is_err() {
            return;
        }
    }
}

/// Waits for the feed to move, sending heartbeats while it does not.
async fn wait<E>(
    reader: &mut Reader<'_, E>,
    follow: &mut tokio::sync::watch::Receiver<i64>,
) -> Result<(), Gone> {
    loop {
        tokio::select! {
            changed = follow.changed() => return changed.map_err(|_| Gone),
            _ = tokio::time::sleep_until(reader.heartbeat_due()) => reader.heartbeat().await?,
            _ = reader.tx.closed() => return Err(Gone),
        }
    }
}
