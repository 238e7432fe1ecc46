//! Passes run within a call rather than by the recovery loop's timer (test mode's
//! `tcc.v1.Testing`): one reaper + recovery pass ([`Coordinator::sweep_now`]) and one
//! reservation made due and released ([`Coordinator::expire_now`]). Both go through the same
//! claim (`Store::claim_due`) and the same drives (`recover`) as the loop.

use std::future::Future;

use futures_util::future::join_all;

use super::{Coordinator, Error};
use crate::domain::{Actor, Reservation};
use crate::store::Claimed;
use uuid::Uuid;

/// Most claims one pass makes (each up to `Policy::sweep_batch`): bounds a pass whose drives
/// keep failing.
const MAX_CLAIMS_PER_PASS: usize = 100;

/// What one on-demand pass did.
#[derive(Clone, Copy, Debug, Default)]
pub struct SweepPass {
    /// Reservations it claimed and drove.
    pub claimed: usize,
    /// Of those, lapsed holds (`HELD` past `expires_at`) this pass expired
    /// ([`Coordinator::expire_claimed`]; not those a decision expired first).
    pub expired: usize,
}

impl Coordinator {
    /// Runs `before` (a test clock's move), then one reaper + recovery pass: claims everything
    /// due, batch after batch, and drives each claimed reservation to its outcome (as far as
    /// its participants allow) before answering. The recovery loop's sweeps wait from before
    /// `before` until the pass is done, so what `before` made due is released by this pass.
    pub async fn sweep_now<T>(
        &self,
        before: impl Future<Output = T>,
    ) -> Result<(T, SweepPass), Error> {
        let _turn = self.sweeps.lock().await;
        let out = before.await;
        let mut pass = SweepPass::default();
        for _ in 0..MAX_CLAIMS_PER_PASS {
            let claimed = self
                .store
                .claim_due(self.lease(), self.policy.sweep_batch)
                .await?;
            pass.claimed += claimed.len();
            for (c, (expired, result)) in join_all(
                claimed
                    .iter()
                    .map(|c| async move { (c.id, self.drive_claim(*c).await) }),
            )
            .await
            {
                pass.expired += usize::from(expired);
                if let Err(e) = result {
                    tracing::warn!(reservation_id = %c, error = %e, "pass on demand: driving failed; recovery retries it");
                }
            }
            if claimed.len() < self.policy.sweep_batch as usize {
                break;
            }
        }
        // Waits the move ended end, and what the pass released is offered, within the call.
        self.offer_pass(true).await?;
        Ok((out, pass))
    }

    /// Drives one claimed reservation within the pass: a lapsed hold expired first, then
    /// recovered. Answers whether this drive expired it (also when the drive then failed),
    /// and how the drive went.
    async fn drive_claim(&self, claim: Claimed) -> (bool, Result<(), Error>) {
        match self.expire_claimed(claim).await {
            Ok(expired) => (expired, self.recover(claim.id).await.map(drop)),
            Err(e) => (false, Err(e)),
        }
    }

    /// Makes one `TRYING` or `HELD` reservation due now and releases it within the call, as
    /// the reaper would (a `TRYING` one whose placer is still at work is released once its
    /// placement ends). Answers the reservation as it stands afterwards. Another state is
    /// [`Error::NotExpirable`], nothing changed.
    pub async fn expire_now(&self, actor: &Actor, id: Uuid) -> Result<Reservation, Error> {
        let r = self.read(id).await?;
        if !actor.sees(&r) {
            return Err(Error::NotFound(id));
        }
        if !self.store.make_due(id).await? {
            let now = self.read(id).await?;
            return Err(Error::NotExpirable {
                id,
                state: now.stored_state,
            });
        }
        self.sweep_now(async {}).await?;
        self.with_audit_one(self.read(id).await?).await
    }
}
