//! The payments service as a test sees it: charge a card for a reservation (SPEC 7.3: every
//! payment is bound to the reservation it is for), read a payment back, and a gate in front of
//! the real service that can hold refunds back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use holdfast::proto;
use holdfast::proto::payments_client::PaymentsClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// Charges `amount_minor` EUR on `account` at the payments participant at `url`, for
/// reservation `reservation_id`; the payment as Confirm cites it (participant `payments`).
pub async fn charge_for(
    url: &str,
    account: &str,
    reservation_id: &str,
    amount_minor: i64,
) -> proto::Payment {
    let payment_ref = PaymentsClient::connect(url.to_owned())
        .await
        .unwrap()
        .charge(proto::ChargeRequest {
            account: account.into(),
            amount_minor,
            currency: "EUR".into(),
            reservation_id: reservation_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .payment_ref;
    proto::Payment {
        participant: "payments".into(),
        payment_ref,
        amount_minor,
        currency: "EUR".into(),
    }
}

/// A payment as the payments participant at `url` records it (with its refunds).
pub async fn payment_record(url: &str, payment_ref: &str) -> proto::PaymentRecord {
    PaymentsClient::connect(url.to_owned())
        .await
        .unwrap()
        .get_payment(proto::GetPaymentRequest {
            payment_ref: payment_ref.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A `tcc.v1.Payments` in front of a real payments participant: forwards every call, except
/// that Refund fails (UNAVAILABLE, nothing forwarded) while `refunds_fail` is set, so a refund
/// can be recorded (the payment verified) and still not reach the payment service; and that a
/// Refund of a payment_ref in `refund_answers` is answered with that status (nothing
/// forwarded). It counts the Refund calls it got per payment_ref.
pub struct PaymentsGate {
    pub url: String,
    pub refunds_fail: Arc<AtomicBool>,
    pub refund_answers: Arc<Mutex<HashMap<String, Code>>>,
    refund_calls: Arc<Mutex<HashMap<String, usize>>>,
}

impl PaymentsGate {
    /// Answers every later Refund of `payment_ref` with `code` (`None`: forward it again).
    pub fn answer_refunds(&self, payment_ref: &str, code: Option<Code>) {
        let mut answers = self.refund_answers.lock().unwrap();
        match code {
            Some(code) => answers.insert(payment_ref.to_owned(), code),
            None => answers.remove(payment_ref),
        };
    }

    /// How many Refund calls of `payment_ref` the gate got.
    pub fn refund_calls(&self, payment_ref: &str) -> usize {
        self.refund_calls
            .lock()
            .unwrap()
            .get(payment_ref)
            .copied()
            .unwrap_or(0)
    }
}

struct Gate {
    target: PaymentsClient<Channel>,
    refunds_fail: Arc<AtomicBool>,
    refund_answers: Arc<Mutex<HashMap<String, Code>>>,
    refund_calls: Arc<Mutex<HashMap<String, usize>>>,
}

#[tonic::async_trait]
impl proto::payments_server::Payments for Gate {
    async fn refund(
        &self,
        request: Request<proto::RefundRequest>,
    ) -> Result<Response<proto::RefundResponse>, Status> {
        let payment_ref = request.get_ref().payment_ref.clone();
        *self
            .refund_calls
            .lock()
            .unwrap()
            .entry(payment_ref.clone())
            .or_default() += 1;
        if self.refunds_fail.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the gate holds refunds back"));
        }
        let answer = self
            .refund_answers
            .lock()
            .unwrap()
            .get(&payment_ref)
            .copied();
        if let Some(code) = answer {
            return Err(Status::new(code, format!("the gate answers {code:?}")));
        }
        self.target.clone().refund(request.into_inner()).await
    }

    async fn get_payment(
        &self,
        request: Request<proto::GetPaymentRequest>,
    ) -> Result<Response<proto::PaymentRecord>, Status> {
        self.target.clone().get_payment(request.into_inner()).await
    }

    async fn charge(
        &self,
        request: Request<proto::ChargeRequest>,
    ) -> Result<Response<proto::ChargeResponse>, Status> {
        self.target.clone().charge(request.into_inner()).await
    }
}

/// Starts a [`PaymentsGate`] on 127.0.0.1:0 in front of the payments participant at `target`.
pub async fn spawn_payments_gate(target: &str) -> PaymentsGate {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let refunds_fail = Arc::new(AtomicBool::new(false));
    let refund_answers = Arc::new(Mutex::new(HashMap::new()));
    let refund_calls = Arc::new(Mutex::new(HashMap::new()));
    let gate = Gate {
        target: PaymentsClient::connect(target.to_owned()).await.unwrap(),
        refunds_fail: refunds_fail.clone(),
        refund_answers: refund_answers.clone(),
        refund_calls: refund_calls.clone(),
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(proto::payments_server::PaymentsServer::new(gate))
            .add_service(tonic_health::server::health_reporter().1)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    PaymentsGate {
        url,
        refunds_fail,
        refund_answers,
        refund_calls,
    }
}

/// A real seats and payments participant on one database: seat `A1` for one, and `card-1`
/// holding `balance` minor units.
pub struct Shop {
    pub seats: String,
    pub payments: String,
}

impl Shop {
    pub async fn open(pool: &sqlx::PgPool, balance: i64) -> Shop {
        use holdfast::participants::Kind;
        let shop = Shop {
            seats: super::spawn_participant(Kind::Seats, pool).await,
            payments: super::spawn_participant(Kind::Payments, pool).await,
        };
        super::put_resources(&shop.seats, &[("A1", 1)]).await;
        super::put_resources(&shop.payments, &[("card-1", balance)]).await;
        shop
    }
}
