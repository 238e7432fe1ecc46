//! `payments` on PostgreSQL: authorisations take the account's row lock with their guarded
//! UPDATE; capture and void lock each account before their winning transition moves money.
//! Also the `tcc.v1.Payments` SQL ([`PaymentsSql`]): charges and refunds under the account's
//! and the payment's row locks.

use async_trait::async_trait;
use sqlx::{PgConnection, Pool, Postgres, Row};

use super::service::{charge_refused, check_refund_currency, refund_fits, same_refund};
use super::{Payments, PaymentsSql, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};
use crate::proto::{ChargeRequest, PaymentRecord, Refund, RefundRequest, refund};

async fn lock_account(conn: &mut PgConnection, account: &str) -> Result<(), ResourceError> {
    sqlx::query("SELECT 1 FROM account WHERE resource = $1 FOR UPDATE")
        .bind(account)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Resource for Payments {
    const RELEASED_TABLE: Option<&'static str> = Some("authorisation");

    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for item in &branch.items {
            let authorised = sqlx::query(
                "WITH taken AS ( \
                     UPDATE account SET available = available - $2, authorised = authorised + $2 \
                     WHERE resource = $1 AND available >= $2 RETURNING resource) \
                 INSERT INTO authorisation (reservation_id, branch_id, resource, amount_minor, state, held_until) \
                 SELECT $3, $4, resource, $2, 'authorised', $5 FROM taken RETURNING 1",
            )
            .bind(&item.resource)
            .bind(item.quantity)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(branch.hold_until)
            .fetch_optional(&mut *conn)
            .await?;
            if authorised.is_none() {
                let exists: Option<i32> =
                    sqlx::query_scalar("SELECT 1 FROM account WHERE resource = $1")
                        .bind(&item.resource)
                        .fetch_optional(&mut *conn)
                        .await?;
                let reason = match exists {
                    Some(_) => format!("insufficient funds on account {}", item.resource),
                    None => format!("account {} does not exist", item.resource),
                };
                return Ok(TryAnswer::Rejected(reason));
            }
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        for item in &branch.items {
            lock_account(conn, &item.resource).await?;
            let captured = sqlx::query(
                "WITH won AS ( \
                     UPDATE authorisation SET state = 'captured' \
                     WHERE reservation_id = $2 AND branch_id = $3 AND resource = $1 AND state = 'authorised' \
                     RETURNING resource, amount_minor) \
                 UPDATE account a SET authorised = a.authorised - w.amount_minor, \
                                      captured = a.captured + w.amount_minor \
                 FROM won w WHERE a.resource = w.resource RETURNING 1",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .fetch_optional(&mut *conn)
            .await?;
            if captured.is_none() {
                return Ok(ConfirmOutcome::HoldLost);
            }
        }
        Ok(ConfirmOutcome::Confirmed)
    }

    async fn cancel(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        for item in &branch.items {
            lock_account(conn, &item.resource).await?;
            // Money returns only if this void wins the transition from 'authorised'.
            sqlx::query(
                "WITH voided AS ( \
                     UPDATE authorisation SET state = 'voided' \
                     WHERE reservation_id = $2 AND branch_id = $3 AND resource = $1 AND state = 'authorised' \
                     RETURNING resource, amount_minor) \
                 UPDATE account a SET available = a.available + v.amount_minor, \
                                      authorised = a.authorised - v.amount_minor \
                 FROM voided v WHERE a.resource = v.resource",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    /// Extend: the deadline on the branch's hold rows follows the barrier's (for people
    /// reading them; reclaim reads the barrier).
    async fn extend(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE authorisation SET held_until = $3 \
             WHERE reservation_id = $1 AND branch_id = $2 AND state = 'authorised'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(branch.hold_until)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn forget_released(
        &self,
        conn: &mut PgConnection,
        branches: &[crate::participant::BranchKey],
    ) -> Result<u64, ResourceError> {
        let mut gone = 0;
        for key in branches {
            gone += sqlx::query(
                "DELETE FROM authorisation WHERE reservation_id = $1 AND branch_id = $2 AND state = 'voided'",
            )
            .bind(&key.reservation_id)
            .bind(&key.branch_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        Ok(gone)
    }
}

#[async_trait]
impl Inventory for Payments {
    async fn put(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        let created = sqlx::query(
            "INSERT INTO account (resource, available, capacity) VALUES ($1, $2, $2) \
             ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(resource)
        .bind(capacity)
        .fetch_optional(&mut *conn)
        .await?;
        if created.is_none() {
            let row = sqlx::query(
                "SELECT authorised, captured FROM account WHERE resource = $1 FOR UPDATE",
            )
            .bind(resource)
            .fetch_one(&mut *conn)
            .await?;
            let authorised: i64 = row.try_get("authorised")?;
            let captured: i64 = row.try_get("captured")?;
            if authorised + captured > capacity {
                return Err(ResourceError::FailedPrecondition(format!(
                    "cannot set account {resource} to {capacity}: {authorised} authorised and {captured} captured"
                )));
            }
            sqlx::query(
                "UPDATE account SET capacity = $2, available = $2 - authorised - captured \
                 WHERE resource = $1",
            )
            .bind(resource)
            .bind(capacity)
            .execute(&mut *conn)
            .await?;
        }
        Inventory::<sqlx::Postgres>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("account {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut PgConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        // The balance as set, the counter Try takes from, and what the rows say is out:
        // authorised holds; captured holds plus charges not refunded. One snapshot.
        let row = sqlx::query(
            "SELECT a.capacity, a.available, \
                 (SELECT CAST(coalesce(sum(amount_minor), 0) AS BIGINT) FROM authorisation \
                  WHERE resource = a.resource AND state = 'authorised') AS held, \
                 (SELECT CAST(coalesce(sum(amount_minor), 0) AS BIGINT) FROM authorisation \
                  WHERE resource = a.resource AND state = 'captured') \
                 + (SELECT CAST(coalesce(sum(amount_minor - refunded_minor), 0) AS BIGINT) \
                    FROM payment WHERE resource = a.resource) AS confirmed \
             FROM account a WHERE a.resource = $1",
        )
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await?;
        row.map(|row| ResourceCounts::from_row(resource, &row))
            .transpose()
    }
}

#[async_trait]
impl PaymentsSql for Postgres {
    async fn charge(
        pool: &Pool<Self>,
        req: &ChargeRequest,
        payment_ref: &str,
    ) -> Result<(), ResourceError> {
        let mut tx = pool.begin().await?;
        let debited = sqlx::query(
            "UPDATE account SET available = available - $2, captured = captured + $2 \
             WHERE resource = $1 AND available >= $2 RETURNING 1",
        )
        .bind(&req.account)
        .bind(req.amount_minor)
        .fetch_optional(&mut *tx)
        .await?;
        if debited.is_none() {
            let exists: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM account WHERE resource = $1")
                    .bind(&req.account)
                    .fetch_optional(&mut *tx)
                    .await?;
            return Err(charge_refused(req, exists.is_some()));
        }
        sqlx::query(
            "INSERT INTO payment (payment_ref, resource, amount_minor, currency, reservation_id) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(payment_ref)
        .bind(&req.account)
        .bind(req.amount_minor)
        .bind(&req.currency)
        .bind(&req.reservation_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn refund(
        pool: &Pool<Self>,
        req: &RefundRequest,
    ) -> Result<refund::State, ResourceError> {
        let mut tx = pool.begin().await?;
        let payment = sqlx::query(
            "SELECT resource, amount_minor, currency, refunded_minor FROM payment \
             WHERE payment_ref = $1 FOR UPDATE",
        )
        .bind(&req.payment_ref)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| {
            ResourceError::NotFound(format!("payment {:?} does not exist", req.payment_ref))
        })?;
        let account: String = payment.try_get("resource")?;
        let amount: i64 = payment.try_get("amount_minor")?;
        let currency: String = payment.try_get("currency")?;
        let refunded: i64 = payment.try_get("refunded_minor")?;
        check_refund_currency(req, &currency)?;
        // ON CONFLICT waits for a concurrent insert of the same refund_id, then sees it.
        let inserted = sqlx::query(
            "INSERT INTO refund (refund_id, payment_ref, reservation_id, amount_minor, currency, reason) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (refund_id) DO NOTHING RETURNING 1",
        )
        .bind(&req.refund_id)
        .bind(&req.payment_ref)
        .bind(&req.reservation_id)
        .bind(req.amount_minor)
        .bind(&req.currency)
        .bind(&req.reason)
        .fetch_optional(&mut *tx)
        .await?;
        if inserted.is_none() {
            let earlier = sqlx::query(
                "SELECT payment_ref, amount_minor, currency FROM refund WHERE refund_id = $1",
            )
            .bind(&req.refund_id)
            .fetch_one(&mut *tx)
            .await?;
            return same_refund(
                req,
                &earlier.try_get::<String, _>("payment_ref")?,
                earlier.try_get("amount_minor")?,
                &earlier.try_get::<String, _>("currency")?,
            );
        }
        refund_fits(req, amount, refunded)?;
        sqlx::query(
            "UPDATE payment SET refunded_minor = refunded_minor + $2 WHERE payment_ref = $1",
        )
        .bind(&req.payment_ref)
        .bind(req.amount_minor)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE account SET captured = captured - $2, available = available + $2 WHERE resource = $1",
        )
        .bind(&account)
        .bind(req.amount_minor)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(refund::State::Refunded)
    }

    async fn get_payment(
        pool: &Pool<Self>,
        payment_ref: String,
    ) -> Result<PaymentRecord, ResourceError> {
        let mut conn = pool.acquire().await?;
        let payment = sqlx::query(
            "SELECT amount_minor, currency, refunded_minor, reservation_id FROM payment \
             WHERE payment_ref = $1",
        )
        .bind(&payment_ref)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| {
            ResourceError::NotFound(format!("payment {payment_ref:?} does not exist"))
        })?;
        let refunds = sqlx::query(
            "SELECT refund_id, amount_minor, currency FROM refund WHERE payment_ref = $1 \
             ORDER BY created_at, refund_id",
        )
        .bind(&payment_ref)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| {
            Ok(Refund {
                refund_id: r.try_get("refund_id")?,
                state: refund::State::Refunded as i32,
                amount_minor: r.try_get("amount_minor")?,
                currency: r.try_get("currency")?,
                failure_reason: String::new(),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(PaymentRecord {
            payment_ref,
            amount_minor: payment.try_get("amount_minor")?,
            currency: payment.try_get("currency")?,
            refunded_minor: payment.try_get("refunded_minor")?,
            refunds,
            reservation_id: payment
                .try_get::<Option<String>, _>("reservation_id")?
                .unwrap_or_default(),
        })
    }
}
