//! Different payments for one reservation at once, against the real seats and payments
//! participants and many real concurrent clients (issue 40, items 7 and 8): one payment is
//! applied, every other one is recorded before its Confirm is answered and refunded exactly
//! once, with no storage error and without any client repeating.

use std::sync::Arc;
use std::time::Duration;

use holdfast::api::error::refund_detail;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

/// Payments for one held reservation, each cited at once ...
const PAYMENTS: usize = 24;
/// ... by this many concurrent Confirms (a client repeating a call it thinks was lost).
const REPEATS: usize = 3;

/// PostgreSQL's answers reach the coordinator this late (a database in another zone), so the
/// transactions of concurrent decisions and refunds overlap as they do under load.
const DATABASE_LATENCY: Duration = Duration::from_millis(2);

async fn shop(pool: &PgPool) -> Shop {
    Shop::open(pool, 10_000_000).await
}

/// A Confirm of `r` citing each of `payments`, from a client of its own, all at once; the
/// answers in the same order.
async fn confirm_all_at_once(
    app: &TestApp,
    r: &proto::Reservation,
    payments: &[proto::Payment],
) -> Vec<Result<proto::Reservation, tonic::Status>> {
    let start = Arc::new(tokio::sync::Barrier::new(payments.len()));
    let calls: Vec<_> = payments
        .iter()
        .map(|payment| {
            let (addr, decide, payment) = (app.addr, Decide::on(r), payment.clone());
            let start = start.clone();
            tokio::spawn(async move {
                let mut client =
                    proto::coordinator_client::CoordinatorClient::connect(format!("http://{addr}"))
                        .await
                        .unwrap();
                start.wait().await;
                client
                    .confirm(decide.confirm_with(&payment))
                    .await
                    .map(tonic::Response::into_inner)
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(call.await.expect("a client's task"));
    }
    answers
}

/// Waits (at most 20 s) until every payment but `applied` is refunded in full exactly once at
/// the payments participant and `applied` is not refunded at all.
async fn refunded_once_but(shop: &Shop, payments: &[proto::Payment], applied: Option<usize>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut wrong = Vec::new();
        for (i, p) in payments.iter().enumerate() {
            let record = payment_record(&shop.payments, &p.payment_ref).await;
            let want = if Some(i) == applied {
                (0, 0)
            } else {
                (p.amount_minor, 1)
            };
            if (record.refunded_minor, record.refunds.len()) != want {
                wrong.push((i, record.refunded_minor, record.refunds.len(), want));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "payments not refunded exactly once (index, refunded, refunds, wanted): {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

crate::parallel::parallel_test!(concurrent_confirms_with_different_payments_apply_one_and_refund_the_rest => concurrent_confirms_with_different_payments);

async fn concurrent_confirms_with_different_payments(pool: PgPool) {
    let shop = shop(&pool).await;
    let distant = pool_at_distance(&pool.connect_options(), 32, DATABASE_LATENCY).await;
    let app = spawn_app(
        distant,
        settings(&[("seats", &shop.seats), ("payments", &shop.payments)]),
    )
    .await;
    let r = app
        .client
        .clone()
        .reserve(reserve_request("order-1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let mut payments = Vec::with_capacity(PAYMENTS);
    for i in 0..PAYMENTS {
        payments.push(charge_for(&shop.payments, "card-1", &r.id, 1_000 + i as i64).await);
    }
    let cited: Vec<_> = (0..PAYMENTS * REPEATS)
        .map(|call| payments[call % PAYMENTS].clone())
        .collect();

    let answers = confirm_all_at_once(&app, &r, &cited).await;
    let mut applied = Vec::new();
    let mut wrong = Vec::new();
    for (call, answer) in answers.iter().enumerate() {
        let i = call % PAYMENTS;
        match answer {
            Ok(c) if matches!(state_of(c), State::Confirmed | State::Confirming) => {
                if !applied.contains(&i) {
                    applied.push(i);
                }
            }
            Err(e) if e.code() == Code::FailedPrecondition && reason(e) == "RESERVATION_CLOSED" => {
                let refund = refund_detail(e).expect("the refund in the details");
                assert_eq!(refund.amount_minor, payments[i].amount_minor, "{e:?}");
            }
            Ok(c) => wrong.push(format!("call {call}: {:?}", state_of(c))),
            Err(e) => wrong.push(format!(
                "call {call}: {:?} {} {}",
                e.code(),
                reason(e),
                e.message()
            )),
        }
    }
    assert!(
        wrong.is_empty(),
        "every Confirm is applied or refused with its refund: {wrong:#?}"
    );
    assert_eq!(applied.len(), 1, "exactly one payment applied: {applied:?}");
    refunded_once_but(&shop, &payments, applied.first().copied()).await;
    assert_eq!(resource(&shop.seats, "A1").await.confirmed, 1);

    // The money trail lists each payment once: the applied one first, every other refunded
    // (recorded so once each acknowledgement is).
    use proto::reservation::payment_record::State as Paid;
    let mut want = vec![Paid::Applied];
    want.resize(PAYMENTS, Paid::Refunded);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let trail = loop {
        let trail = read(&mut app.client.clone(), &r.id).await.payments;
        let states: Vec<_> = trail.iter().map(|p| p.state()).collect();
        if states == want {
            break trail;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "payments never showed one applied and the rest refunded: {trail:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(trail[0].payment_ref, payments[applied[0]].payment_ref);
    let mut listed: Vec<_> = trail.iter().map(|p| p.payment_ref.clone()).collect();
    listed.sort();
    listed.dedup();
    assert_eq!(listed.len(), PAYMENTS, "each payment once: {trail:?}");
}

/// The recovery loop's period in the late-payment tests ...
const SWEEP: Duration = Duration::from_millis(100);
/// ... and how late the seats participant answers the first late payment's retake: several
/// sweeps (well within the participant timeout).
const SEATS_LATE: Duration = Duration::from_millis(500);

/// Where the coordinator under test keeps its reservations (the participants use the test's
/// PostgreSQL database either way).
enum Backend {
    Postgres,
    Sqlite,
}

/// A coordinator on a SQLite file of its own, stopped and removed when dropped.
struct SqliteCoordinator {
    path: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for SqliteCoordinator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Starts a coordinator on `backend` with `settings`; its address, and what keeps it running.
async fn coordinator_on(
    backend: Backend,
    pool: PgPool,
    settings: holdfast::app::CoordinatorSettings,
) -> (std::net::SocketAddr, Box<dyn std::any::Any + Send>) {
    match backend {
        Backend::Postgres => {
            let app = spawn_app(pool, settings).await;
            (app.addr, Box::new(app))
        }
        Backend::Sqlite => {
            let path = std::env::temp_dir().join(format!(
                "holdfast-late-payments-{}.db",
                uuid::Uuid::new_v4()
            ));
            let store =
                holdfast::store::SqliteStore::connect(&format!("sqlite://{}", path.display()), 8)
                    .await
                    .unwrap();
            store.migrate().await.unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(holdfast::app::serve_coordinator(
                settings,
                store,
                listener,
                async {
                    let _ = stopped.await;
                },
            ));
            let running = SqliteCoordinator {
                path,
                stop: Some(stop),
            };
            (addr, Box::new(running))
        }
    }
}

/// Reserves seat A1 for one second and waits until the reaper released it (`EXPIRED`, every
/// branch cancelled): a late payment then re-takes the seat.
async fn reserve_and_let_lapse(
    client: &mut proto::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
) -> proto::Reservation {
    let mut request = reserve_request("late-order", vec![hold("seats", "A1")]);
    request.ttl = Some(proto_duration(Duration::from_secs(1)));
    let r = client.reserve(request).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = read(client, &r.id).await;
        let released = now
            .branches
            .iter()
            .all(|b| b.state() == proto::branch::State::Cancelled);
        if state_of(&now) == State::Expired && released {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never released: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read(
    client: &mut proto::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
    id: &str,
) -> proto::Reservation {
    client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Two different late payments at once: the one whose retake began is applied; the other is
/// answered `LATE_PAYMENT_IN_PROGRESS`, yet recorded with its refund before that answer and
/// refunded exactly once without its client calling again; `Reservation.payments` shows both.
/// The seats participant's answers are held while the two race, so the first payment's
/// retake is still running when the second is judged, whichever wins.
async fn two_different_late_payments(pool: PgPool, backend: Backend) {
    let shop = shop(&pool).await;
    let seats = Relay::start(&shop.seats).await;
    let mut s = settings(&[("seats", &seats.url), ("payments", &shop.payments)]);
    s.policy.sweep_interval = SWEEP;
    let (addr, _running) = coordinator_on(backend, pool, s).await;
    let url = format!("http://{addr}");
    let mut client = proto::coordinator_client::CoordinatorClient::connect(url.clone())
        .await
        .unwrap();
    let r = reserve_and_let_lapse(&mut client).await;
    let payments = [
        charge_for(&shop.payments, "card-1", &r.id, 4_200).await,
        charge_for(&shop.payments, "card-1", &r.id, 4_300).await,
    ];

    seats.hold_replies(true);
    let start = Arc::new(tokio::sync::Barrier::new(payments.len()));
    let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for (i, payment) in payments.iter().enumerate() {
        let (url, decide, payment) = (url.clone(), Decide::on(&r), payment.clone());
        let (start, answered) = (start.clone(), answered.clone());
        tokio::spawn(async move {
            let mut client = proto::coordinator_client::CoordinatorClient::connect(url)
                .await
                .unwrap();
            start.wait().await;
            let answer = client.confirm(decide.confirm_with(&payment)).await;
            let _ = answered.send((i, answer.map(tonic::Response::into_inner)));
        });
    }
    // The second payment is answered while the first one's retake waits for the seat, which
    // answers a few sweeps later: recovery must leave the retake to its driver meanwhile.
    let (loser, lost) = answers.recv().await.expect("an answer");
    tokio::time::sleep(SEATS_LATE).await;
    seats.hold_replies(false);
    let (winner, won) = answers.recv().await.expect("the other answer");
    let e = lost.expect_err("the second late payment is not applied");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert_eq!(reason(&e), "LATE_PAYMENT_IN_PROGRESS", "{e:?}");
    let confirmed = won.expect("the first late payment is honoured");
    assert_eq!(state_of(&confirmed), State::Confirmed, "{confirmed:?}");
    assert!(confirmed.late_payment_honored);

    // Refunded once, by the coordinator, with no Confirm repeated; the answer said so.
    refunded_once_but(&shop, &payments, Some(winner)).await;
    let refund = refund_detail(&e).expect("its refund in the details");
    assert_eq!(refund.amount_minor, payments[loser].amount_minor);
    let at_payments = payment_record(&shop.payments, &payments[loser].payment_ref).await;
    assert_eq!(at_payments.refunds[0].refund_id, refund.refund_id);

    // The money trail: the applied payment, then the refunded one.
    use proto::reservation::payment_record::State as Paid;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let trail = loop {
        let now = read(&mut client, &r.id).await;
        if now.payments.len() == 2 && now.payments[1].state() == Paid::Refunded {
            break now.payments;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "payments never showed both: {:?}",
            now.payments
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let shown: Vec<_> = trail
        .iter()
        .map(|p| {
            (
                p.payment_ref.as_str(),
                p.amount_minor,
                p.state(),
                p.refund_id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (
                payments[winner].payment_ref.as_str(),
                payments[winner].amount_minor,
                Paid::Applied,
                ""
            ),
            (
                payments[loser].payment_ref.as_str(),
                payments[loser].amount_minor,
                Paid::Refunded,
                refund.refund_id.as_str()
            ),
        ]
    );
    assert!(
        trail
            .iter()
            .all(|p| p.participant == "payments" && p.currency == "EUR")
    );
    assert_eq!(resource(&shop.seats, "A1").await.confirmed, 1);
}

#[sqlx::test(migrations = false)]
async fn two_different_late_payments_refund_the_loser_once_on_postgres(pool: PgPool) {
    two_different_late_payments(pool, Backend::Postgres).await;
}

#[sqlx::test(migrations = false)]
async fn two_different_late_payments_refund_the_loser_once_on_sqlite(pool: PgPool) {
    two_different_late_payments(pool, Backend::Sqlite).await;
}
