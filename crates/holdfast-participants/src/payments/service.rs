//! `tcc.v1.Payments` of the reference payments participant: [`PaymentsService`] checks each
//! request once and runs its backend's [`PaymentsSql`]; the refund rules (same refund on a
//! repeated `refund_id`, never more than was captured) are written once here for both backends.

use async_trait::async_trait;
use sqlx::{Pool, Postgres};
use tonic::{Request, Response, Status};

use crate::participant::validate::check_id;
use crate::participant::{Backend, ResourceError};
use crate::proto::payments_server;
use crate::proto::{
    ChargeRequest, ChargeResponse, GetPaymentRequest, PaymentRecord, RefundRequest, RefundResponse,
    refund,
};

/// The `tcc.v1.Payments` service of the reference payments participant, on database `DB`
/// (PostgreSQL by default, or SQLite): checks requests once, then runs its backend's
/// [`PaymentsSql`].
pub(crate) struct PaymentsService<DB: PaymentsSql = Postgres> {
    pool: Pool<DB>,
}

impl<DB: PaymentsSql> PaymentsService<DB> {
    /// Payments on the accounts in `pool`.
    pub fn new(pool: Pool<DB>) -> Self {
        Self { pool }
    }

    async fn charge(&self, req: ChargeRequest) -> Result<String, ResourceError> {
        check_id("account", &req.account)?;
        check_id("reservation_id", &req.reservation_id)?;
        check_amount(req.amount_minor)?;
        check_currency(&req.currency)?;
        let payment_ref = format!("pay_{}", uuid::Uuid::now_v7().simple());
        DB::charge(&self.pool, &req, &payment_ref).await?;
        Ok(payment_ref)
    }

    async fn refund(&self, req: RefundRequest) -> Result<refund::State, ResourceError> {
        check_id("refund_id", &req.refund_id)?;
        check_id("reservation_id", &req.reservation_id)?;
        check_id("payment_ref", &req.payment_ref)?;
        check_amount(req.amount_minor)?;
        check_currency(&req.currency)?;
        DB::refund(&self.pool, &req).await
    }

    async fn get_payment(&self, payment_ref: String) -> Result<PaymentRecord, ResourceError> {
        check_id("payment_ref", &payment_ref)?;
        DB::get_payment(&self.pool, payment_ref).await
    }
}

/// The `tcc.v1.Payments` SQL of one backend (requests are already checked).
#[async_trait]
pub(crate) trait PaymentsSql: Backend {
    /// Captures `amount_minor` from the account outside any reservation, recorded as
    /// `payment_ref`: NotFound for an unknown account, FailedPrecondition when funds are short.
    async fn charge(
        pool: &Pool<Self>,
        req: &ChargeRequest,
        payment_ref: &str,
    ) -> Result<(), ResourceError>;

    /// Refunds under the payment's lock: repeats of a `refund_id` find its row and move no
    /// money ([`same_refund`]); the running `refunded_minor` never exceeds the captured amount
    /// ([`refund_fits`]).
    async fn refund(pool: &Pool<Self>, req: &RefundRequest)
    -> Result<refund::State, ResourceError>;

    /// A payment with its refunds.
    async fn get_payment(
        pool: &Pool<Self>,
        payment_ref: String,
    ) -> Result<PaymentRecord, ResourceError>;
}

/// The error of a charge that debited nothing: no such account, or not enough on it.
pub(crate) fn charge_refused(req: &ChargeRequest, account_exists: bool) -> ResourceError {
    if account_exists {
        ResourceError::FailedPrecondition(format!("insufficient funds on account {}", req.account))
    } else {
        ResourceError::NotFound(format!("account {:?} does not exist", req.account))
    }
}

/// The refund's currency must be the payment's.
pub(crate) fn check_refund_currency(
    req: &RefundRequest,
    currency: &str,
) -> Result<(), ResourceError> {
    if req.currency != currency {
        return Err(ResourceError::invalid(
            "currency",
            format!("must match the payment's currency {currency}"),
        ));
    }
    Ok(())
}

/// A repeated `refund_id` must name the same refund (payment, amount, currency).
pub(crate) fn same_refund(
    req: &RefundRequest,
    payment_ref: &str,
    amount_minor: i64,
    currency: &str,
) -> Result<refund::State, ResourceError> {
    if payment_ref == req.payment_ref
        && amount_minor == req.amount_minor
        && currency == req.currency
    {
        Ok(refund::State::Refunded)
    } else {
        Err(ResourceError::invalid(
            "refund_id",
            "was already used for a different refund",
        ))
    }
}

/// A new refund must fit in what was captured and not yet refunded.
pub(crate) fn refund_fits(
    req: &RefundRequest,
    amount: i64,
    refunded: i64,
) -> Result<(), ResourceError> {
    if refunded + req.amount_minor > amount {
        return Err(ResourceError::FailedPrecondition(format!(
            "refund of {} would exceed the captured {amount} (already refunded {refunded})",
            req.amount_minor
        )));
    }
    Ok(())
}

fn check_amount(amount_minor: i64) -> Result<(), ResourceError> {
    if amount_minor <= 0 {
        return Err(ResourceError::invalid("amount_minor", "must be > 0"));
    }
    Ok(())
}

fn check_currency(currency: &str) -> Result<(), ResourceError> {
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ResourceError::invalid(
            "currency",
            "must be an ISO 4217 code such as EUR",
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl<DB: PaymentsSql> payments_server::Payments for PaymentsService<DB> {
    async fn refund(
        &self,
        request: Request<RefundRequest>,
    ) -> Result<Response<RefundResponse>, Status> {
        let state = PaymentsService::refund(self, request.into_inner()).await?;
        Ok(Response::new(RefundResponse {
            state: state as i32,
        }))
    }

    async fn get_payment(
        &self,
        request: Request<GetPaymentRequest>,
    ) -> Result<Response<PaymentRecord>, Status> {
        let record = PaymentsService::get_payment(self, request.into_inner().payment_ref).await?;
        Ok(Response::new(record))
    }

    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeResponse>, Status> {
        let payment_ref = PaymentsService::charge(self, request.into_inner()).await?;
        Ok(Response::new(ChargeResponse { payment_ref }))
    }
}
