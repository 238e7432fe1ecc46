//! `payments` on SQLite (Resource, Inventory and the `tcc.v1.Payments` SQL, [`PaymentsSql`]):
//! the same transitions as the PostgreSQL SQL beside it (`postgres.rs`). The SDK's
//! `BEGIN IMMEDIATE` holds the write lock for the whole call, so a guarded UPDATE and the hold
//! row it pays for, or a winning hold transition and its counter move, are atomic.

use async_trait::async_trait;
use sqlx::{Pool, Row, Sqlite, SqliteConnection};

use super::service::{charge_refused, check_refund_currency, refund_fits, same_refund};
use super::{Payments, PaymentsSql, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{
    Backend, BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer,
};
use crate::proto::{ChargeRequest, PaymentRecord, Refund, RefundRequest, refund};

#[async_trait]
impl Resource<Sqlite> for Payments {
    const RELEASED_TABLE: Option<&'static str> = Some("authorisation");

    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for item in &branch.items {
            let taken = sqlx::query(
                "UPDATE account SET available = available - ?2, authorised = authorised + ?2 \
                 WHERE resource = ?1 AND available >= ?2",
            )
            .bind(&item.resource)
            .bind(item.quantity)
            .execute(&mut *conn)
            .await?;
            if taken.rows_affected() == 0 {
                let available: Option<i64> =
                    sqlx::query_scalar("SELECT available FROM account WHERE resource = ?1")
                        .bind(&item.resource)
                        .fetch_optional(&mut *conn)
                        .await?;
                let reason = match available {
                    Some(_) => format!("insufficient funds on account {}", item.resource),
                    None => format!("account {} does not exist", item.resource),
                };
                return Ok(TryAnswer::Rejected(reason));
            }
            sqlx::query(
                "INSERT INTO authorisation (reservation_id, branch_id, resource, amount_minor, state, held_until) \
                 VALUES (?1, ?2, ?3, ?4, 'authorised', ?5)",
            )
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(&item.resource)
            .bind(item.quantity)
            .bind(branch.hold_until.timestamp_micros())
            .execute(&mut *conn)
            .await?;
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        for item in &branch.items {
            let Some(quantity) = move_hold(conn, branch, &item.resource, "captured").await? else {
                return Ok(ConfirmOutcome::HoldLost);
            };
            sqlx::query(
                "UPDATE account SET authorised = authorised - ?2, captured = captured + ?2 WHERE resource = ?1",
            )
            .bind(&item.resource)
            .bind(quantity)
            .execute(&mut *conn)
            .await?;
        }
        Ok(ConfirmOutcome::Confirmed)
    }

    async fn cancel(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        for item in &branch.items {
            // Money returns only if this void wins the transition from 'authorised'.
            if let Some(quantity) = move_hold(conn, branch, &item.resource, "voided").await? {
                sqlx::query(
                    "UPDATE account SET available = available + ?2, authorised = authorised - ?2 WHERE resource = ?1",
                )
                .bind(&item.resource)
                .bind(quantity)
                .execute(&mut *conn)
                .await?;
            }
        }
        Ok(())
    }

    /// Extend: the deadline on the branch's hold rows follows the barrier's (for people
    /// reading them; reclaim reads the barrier).
    async fn extend(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE authorisation SET held_until = ?3 \
             WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'authorised'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(branch.hold_until.timestamp_micros())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn forget_released(
        &self,
        conn: &mut SqliteConnection,
        branches: &[crate::participant::BranchKey],
    ) -> Result<u64, ResourceError> {
        let mut gone = 0;
        for key in branches {
            gone += sqlx::query(
                "DELETE FROM authorisation WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'voided'",
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

/// Moves the branch's authorisation on `resource` from 'authorised' to `to`; the amount when
/// it won.
async fn move_hold(
    conn: &mut SqliteConnection,
    branch: &BranchCtx,
    resource: &str,
    to: &str,
) -> Result<Option<i64>, ResourceError> {
    Ok(sqlx::query_scalar(
        "UPDATE authorisation SET state = ?4 \
         WHERE reservation_id = ?1 AND branch_id = ?2 AND resource = ?3 AND state = 'authorised' \
         RETURNING amount_minor",
    )
    .bind(&branch.key.reservation_id)
    .bind(&branch.key.branch_id)
    .bind(resource)
    .bind(to)
    .fetch_optional(&mut *conn)
    .await?)
}

#[async_trait]
impl Inventory<Sqlite> for Payments {
    async fn put(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
        capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        let created = sqlx::query(
            "INSERT INTO account (resource, available, capacity) VALUES (?1, ?2, ?2) \
             ON CONFLICT DO NOTHING",
        )
        .bind(resource)
        .bind(capacity)
        .execute(&mut *conn)
        .await?;
        if created.rows_affected() == 0 {
            let row = sqlx::query("SELECT authorised, captured FROM account WHERE resource = ?1")
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
                "UPDATE account SET capacity = ?2, available = ?2 - authorised - captured \
                 WHERE resource = ?1",
            )
            .bind(resource)
            .bind(capacity)
            .execute(&mut *conn)
            .await?;
        }
        Inventory::<Sqlite>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("account {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        // The balance as set, the counter Try takes from, and what the rows say is out:
        // authorised holds; captured holds plus charges not refunded. One snapshot.
        let row = sqlx::query(
            "SELECT a.capacity AS capacity, a.available AS available, \
                 (SELECT coalesce(sum(amount_minor), 0) FROM authorisation \
                  WHERE resource = a.resource AND state = 'authorised') AS held, \
                 (SELECT coalesce(sum(amount_minor), 0) FROM authorisation \
                  WHERE resource = a.resource AND state = 'captured') \
                 + (SELECT coalesce(sum(amount_minor - refunded_minor), 0) \
                    FROM payment WHERE resource = a.resource) AS confirmed \
             FROM account a WHERE a.resource = ?1",
        )
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await?;
        row.map(|row| ResourceCounts::from_row(resource, &row))
            .transpose()
    }
}

#[async_trait]
impl PaymentsSql for Sqlite {
    async fn charge(
        pool: &Pool<Self>,
        req: &ChargeRequest,
        payment_ref: &str,
    ) -> Result<(), ResourceError> {
        let mut tx = Sqlite::begin_write(pool).await?;
        let debited = sqlx::query(
            "UPDATE account SET available = available - ?2, captured = captured + ?2 \
             WHERE resource = ?1 AND available >= ?2",
        )
        .bind(&req.account)
        .bind(req.amount_minor)
        .execute(&mut *tx)
        .await?;
        if debited.rows_affected() == 0 {
            let exists: Option<i64> =
                sqlx::query_scalar("SELECT 1 FROM account WHERE resource = ?1")
                    .bind(&req.account)
                    .fetch_optional(&mut *tx)
                    .await?;
            return Err(charge_refused(req, exists.is_some()));
        }
        sqlx::query(
            "INSERT INTO payment (payment_ref, resource, amount_minor, currency, reservation_id) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
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
        // The write lock of BEGIN IMMEDIATE stands in for the payment row lock.
        let mut tx = Sqlite::begin_write(pool).await?;
        let payment = sqlx::query(
            "SELECT resource, amount_minor, currency, refunded_minor FROM payment \
             WHERE payment_ref = ?1",
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
        let earlier = sqlx::query(
            "SELECT payment_ref, amount_minor, currency FROM refund WHERE refund_id = ?1",
        )
        .bind(&req.refund_id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(earlier) = earlier {
            return same_refund(
                req,
                &earlier.try_get::<String, _>("payment_ref")?,
                earlier.try_get("amount_minor")?,
                &earlier.try_get::<String, _>("currency")?,
            );
        }
        refund_fits(req, amount, refunded)?;
        sqlx::query(
            "INSERT INTO refund (refund_id, payment_ref, reservation_id, amount_minor, currency, reason) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .bind(&req.refund_id)
        .bind(&req.payment_ref)
        .bind(&req.reservation_id)
        .bind(req.amount_minor)
        .bind(&req.currency)
        .bind(&req.reason)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE payment SET refunded_minor = refunded_minor + ?2 WHERE payment_ref = ?1",
        )
        .bind(&req.payment_ref)
        .bind(req.amount_minor)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE account SET captured = captured - ?2, available = available + ?2 WHERE resource = ?1",
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
             WHERE payment_ref = ?1",
        )
        .bind(&payment_ref)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| {
            ResourceError::NotFound(format!("payment {payment_ref:?} does not exist"))
        })?;
        let refunds = sqlx::query(
            "SELECT refund_id, amount_minor, currency FROM refund WHERE payment_ref = ?1 \
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
