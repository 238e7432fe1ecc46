//! `WatchReservation`: [`Coordinator::watch`], and [`Publishing`], the store wrapper that
//! publishes every reservation a store write returns to the watchers of that reservation in
//! this process (so no write path can forget). The hub itself - caps, the one shared poller
//! for changes made elsewhere and lazy expiry, the end of streams at shutdown - is
//! [`super::watchers`].

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use uuid::Uuid;

use super::watchers::{WatchConnection, Watchers};
use super::{Coordinator, Error};
use crate::domain::PresentedToken;
use crate::domain::RequestId;
use crate::domain::admin::{
    AuditEntry, AuditNote, AuditQuery, RetryTarget, StateCounts, StuckQuery, WorkState,
};
use crate::domain::policy::{Backoff, HoldLimits};
use crate::domain::waitlist::{QueueKey, QueuePage, QueuePlace};
use crate::domain::{
    Actor, Decision, ExtraPayment, ListQuery, NewReservation, Rejection, Reservation, State,
};
use crate::store::{
    AdminDecided, BranchReport, Claimed, Created, Decided, JoinQueue, Joined, PhaseRecorded,
    QueueHead, QueueStore, RefundAnswer, Stamp, Store, StoreError, Waiting, Woken, WorkLease,
};

/// Reservations a watch may have read but its client not yet taken.
const WATCH_BUFFER: usize = 16;

impl Coordinator {
    /// Follows one reservation: as it is now, then each change until it is terminal. Ends
    /// when the stream is dropped, after the first failed read (its error is the last item),
    /// or at shutdown ([`Error::ShuttingDown`] the last item). `connection` is the client's
    /// connection: at most `policy.watch.per_connection` streams per connection,
    /// `per_principal` per actor's principal and `per_process` in all, beyond which it is
    /// [`Error::WatchLimit`].
    pub async fn watch(
        &self,
        actor: &Actor,
        id: Uuid,
        connection: Option<WatchConnection>,
    ) -> Result<impl Stream<Item = Result<Reservation, Error>> + Send + 'static, Error> {
        let slot = self.watchers.admit(&actor.principal, connection)?;
        // Subscribe before the first read, so no change falls between the two.
        let mut changes = self.watchers.subscribe(id, &self.store);
        let first = self.read(id).await?;
        if !actor.sees(&first) {
            return Err(Error::NotFound(id));
        }
        self.watchers.saw(&first);
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let coordinator = self.clone();
        let closed = self.watchers.closed();
        tokio::spawn(async move {
            let _slot = slot;
            let follow = coordinator.follow(first, &mut changes, &tx);
            tokio::select! {
                _ = follow => {}
                _ = closed => {
                    let _ = tx.try_send(Err(Error::ShuttingDown));
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    /// Sends `first`, then every newer image of it published here (by this process's writes or
    /// the shared poller), until it is terminal or the client went away.
    async fn follow(
        &self,
        first: Reservation,
        changes: &mut broadcast::Receiver<Arc<Reservation>>,
        tx: &mpsc::Sender<Result<Reservation, Error>>,
    ) {
        let id = first.id;
        let mut last = first.version;
        let mut state = first.state;
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        while !state.is_terminal() {
            let r = tokio::select! {
                _ = tx.closed() => return,
                event = changes.recv() => match event {
                    Ok(r) => (*r).clone(),
                    // Missed some: the reservation as it is now is what matters.
                    Err(broadcast::error::RecvError::Lagged(_)) => match self.read(id).await {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            // Versions only grow; a lazily expired read has the same version but a new state.
            if r.version < last || (r.version == last && r.state == state) {
                continue;
            }
            last = r.version;
            state = r.state;
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
        }
    }

    /// Ends every open Watch stream and refuses new ones (graceful shutdown).
    pub fn close_watches(&self) {
        self.watchers.close();
    }
}

/// A store that publishes every reservation its writes return, and tells the event loop that
/// this process wrote.
pub struct Publishing {
    pub inner: Arc<dyn Store>,
    pub watchers: Arc<Watchers>,
    pub written: Arc<tokio::sync::Notify>,
}

impl Publishing {
    fn out(&self, r: Result<Reservation, StoreError>) -> Result<Reservation, StoreError> {
        if let Ok(r) = &r {
            self.watchers.publish(r);
            self.written.notify_one();
        }
        r
    }
}

#[async_trait]
impl Store for Publishing {
    fn event_log(&self) -> &dyn crate::store::events::EventLog {
        self.inner.event_log()
    }

    async fn create(
        &self,
        new: &NewReservation,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        let created = self.inner.create(new, lease, limits).await?;
        self.written.notify_one();
        Ok(created)
    }

    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        self.inner.get(id).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
        self.inner.list(query).await
    }

    async fn request_recorded(
        &self,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<bool, StoreError> {
        self.inner.request_recorded(owner, holder, request_id).await
    }

    async fn versions(&self, ids: &[Uuid]) -> Result<Vec<Stamp>, StoreError> {
        self.inner.versions(ids).await
    }

    async fn decide(
        &self,
        id: Uuid,
        scope: Option<&str>,
        presented_token: &PresentedToken,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError> {
        let decided = self
            .inner
            .decide(id, scope, presented_token, decision, lease)
            .await?;
        if let Decided::Judged { reservation, .. } = &decided {
            self.watchers.publish(reservation);
            self.written.notify_one();
        }
        Ok(decided)
    }

    async fn record_held(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        self.out(self.inner.record_held(id, reports).await)
    }

    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        self.out(self.inner.record_rejected(id, rejection, reports).await)
    }

    async fn record_phase(
        &self,
        id: Uuid,
        from: State,
        reports: &[BranchReport],
        finish: Option<State>,
        backoff: Backoff,
    ) -> Result<PhaseRecorded, StoreError> {
        let phase = self
            .inner
            .record_phase(id, from, reports, finish, backoff)
            .await?;
        self.watchers.publish(&phase.reservation);
        self.written.notify_one();
        Ok(phase)
    }

    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        self.inner.claim_due(lease, limit).await
    }

    async fn expire_lapsed_hold(&self, id: Uuid) -> Result<bool, StoreError> {
        // Watchers see the new version through the poller, as with `make_due`.
        let expired = self.inner.expire_lapsed_hold(id).await?;
        if expired {
            self.written.notify_one();
        }
        Ok(expired)
    }

    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError> {
        self.out(self.inner.begin_retake(id).await)
    }

    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        self.out(self.inner.finish_retake(id, reports).await)
    }

    async fn fail_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
        reason: &str,
    ) -> Result<Reservation, StoreError> {
        self.out(self.inner.fail_retake(id, reports, reason).await)
    }

    async fn record_refund_attempt(
        &self,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<Reservation, StoreError> {
        self.out(self.inner.record_refund_attempt(id, answer, backoff).await)
    }

    async fn pending_extra_payments(&self, id: Uuid) -> Result<Vec<ExtraPayment>, StoreError> {
        self.inner.pending_extra_payments(id).await
    }

    async fn further_payments_of(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError> {
        self.inner.further_payments_of(ids).await
    }

    async fn record_extra_refund_attempt(
        &self,
        id: Uuid,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<ExtraPayment, StoreError> {
        self.inner
            .record_extra_refund_attempt(id, extra, answer, backoff)
            .await
    }

    async fn renew_lease(&self, id: Uuid, lease: WorkLease) -> Result<bool, StoreError> {
        self.inner.renew_lease(id, lease).await
    }

    async fn make_due(&self, id: Uuid) -> Result<bool, StoreError> {
        // Watchers see it lapse through the poller (`lapsed`); the release is published.
        self.inner.make_due(id).await
    }

    async fn wake_backlog(&self, participant: &str) -> Result<u64, StoreError> {
        self.inner.wake_backlog(participant).await
    }

    async fn probe_write(&self) -> Result<(), StoreError> {
        self.inner.probe_write().await
    }

    async fn backlog(&self) -> Result<i64, StoreError> {
        self.inner.backlog().await
    }

    async fn oldest_work_age(&self) -> Result<std::time::Duration, StoreError> {
        self.inner.oldest_work_age().await
    }

    async fn waiting_on(&self, examples: u32) -> Result<Vec<Waiting>, StoreError> {
        self.inner.waiting_on(examples).await
    }

    async fn discard(&self, id: Uuid, lease_owner: Uuid) -> Result<bool, StoreError> {
        // Nothing to publish: the request was never answered with this reservation.
        self.inner.discard(id, lease_owner).await
    }

    async fn force_cancel(
        &self,
        id: Uuid,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        let decided = self.inner.force_cancel(id, note, lease).await?;
        if let AdminDecided::Done { reservation, .. } = &decided {
            self.watchers.publish(reservation);
            self.written.notify_one();
        }
        Ok(decided)
    }

    async fn resolve(
        &self,
        id: Uuid,
        to: State,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        let decided = self.inner.resolve(id, to, note, lease).await?;
        if let AdminDecided::Done { reservation, .. } = &decided {
            self.watchers.publish(reservation);
            self.written.notify_one();
        }
        Ok(decided)
    }

    async fn retry(
        &self,
        target: &RetryTarget,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<Option<Vec<Woken>>, StoreError> {
        self.inner.retry(target, note, lease).await
    }

    async fn list_stuck(&self, query: &StuckQuery) -> Result<Vec<Reservation>, StoreError> {
        self.inner.list_stuck(query).await
    }

    async fn work_of(&self, ids: &[Uuid]) -> Result<Vec<WorkState>, StoreError> {
        self.inner.work_of(ids).await
    }

    async fn count_by_state(&self) -> Result<StateCounts, StoreError> {
        self.inner.count_by_state().await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.audit(query).await
    }

    async fn audit_of(&self, ids: &[Uuid]) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.audit_of(ids).await
    }

    async fn purge_finished(
        &self,
        keep: std::time::Duration,
        limit: u32,
    ) -> Result<crate::store::Purged, StoreError> {
        // Nothing to publish: only finished reservations go, and a watch ends at the finish.
        self.inner.purge_finished(keep, limit).await
    }
}

/// The waitlists' writes are published like every other (Watch, the event follower).
#[async_trait]
impl QueueStore for Publishing {
    async fn join_queue(&self, job: &JoinQueue<'_>) -> Result<Joined, StoreError> {
        let joined = self.inner.join_queue(job).await?;
        if let Joined::Queued(r) | Joined::Moved(r) = &joined {
            self.watchers.publish(r);
            self.written.notify_one();
        }
        Ok(joined)
    }

    async fn begin_offer(
        &self,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<Reservation>, StoreError> {
        let offered = self.inner.begin_offer(id, lease).await?;
        if let Some(r) = &offered {
            self.watchers.publish(r);
            self.written.notify_one();
        }
        Ok(offered)
    }

    async fn lease_queue(&self, key: &QueueKey, lease: WorkLease) -> Result<bool, StoreError> {
        self.inner.lease_queue(key, lease).await
    }

    async fn queue_heads(&self, key: &QueueKey, limit: u32) -> Result<Vec<QueueHead>, StoreError> {
        self.inner.queue_heads(key, limit).await
    }

    async fn queues(&self) -> Result<Vec<(QueueKey, i64)>, StoreError> {
        self.inner.queues().await
    }

    async fn end_waits(&self, limit: u32) -> Result<Vec<Reservation>, StoreError> {
        let ended = self.inner.end_waits(limit).await?;
        for r in &ended {
            self.watchers.publish(r);
        }
        if !ended.is_empty() {
            self.written.notify_one();
        }
        Ok(ended)
    }

    async fn queue_place(&self, id: Uuid) -> Result<Option<QueuePlace>, StoreError> {
        self.inner.queue_place(id).await
    }

    async fn list_queue(
        &self,
        key: &QueueKey,
        after: i64,
        limit: u32,
    ) -> Result<QueuePage, StoreError> {
        self.inner.list_queue(key, after, limit).await
    }
}
