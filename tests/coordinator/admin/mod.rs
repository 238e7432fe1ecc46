//! `tcc.v1.Admin` (SPEC 8.1) against a real coordinator with authentication on and in-test
//! participants on loopback: each method, the audit log it writes, who may call it, and the
//! refusals of bad input (which change nothing).

mod actions;
mod input;
mod retry;

use std::time::Duration;

use holdfast::domain::policy::Backoff;
use holdfast::proto;
use holdfast::proto::admin_client::AdminClient;
use sqlx::PgPool;
use tonic::transport::Channel;

use crate::auth::{Cast, keyed, secured_settings};
use crate::common::{Decide, Fakes, TestApp, hold, reserve_request, spawn_app, spawn_fakes};

/// A coordinator with authentication on (the ownership tests' cast: `shop` a client, `ops` an
/// admin), fakes `seats` and `stock`, and an Admin client.
pub struct Ops {
    pub app: TestApp,
    pub fakes: Fakes,
    pub cast: Cast,
    pub admin: AdminClient<Channel>,
}

/// Recovery never sweeps on its own during a test (an hour between sweeps, and nothing wakes
/// it but a participant coming back), and a failed drive backs off for an hour: whatever
/// moves a reservation on is the test's own call.
pub async fn ops(pool: PgPool) -> Ops {
    ops_with(pool, Duration::from_secs(2)).await
}

/// [`ops`] with participant calls timing out after `participant_timeout`.
pub async fn ops_with(pool: PgPool, participant_timeout: Duration) -> Ops {
    let fakes = spawn_fakes(&["seats", "stock"]).await;
    let cast = Cast::new();
    let seats = fakes.get("seats").url.clone();
    let stock = fakes.get("stock").url.clone();
    let mut s = secured_settings(&cast, &[("seats", &seats), ("stock", &stock)]);
    for p in &mut s.participants {
        p.timeout = participant_timeout;
    }
    s.policy.lease = s.policy.lease.max(participant_timeout * 4);
    s.policy.sweep_interval = Duration::from_secs(3600);
    s.policy.backoff = Backoff {
        base: Duration::from_secs(3600),
        cap: Duration::from_secs(3600),
    };
    let app = spawn_app(pool, s).await;
    let admin = AdminClient::connect(format!("http://{}", app.addr))
        .await
        .unwrap();
    Ops {
        app,
        fakes,
        cast,
        admin,
    }
}

impl Ops {
    /// `msg` with the admin's key.
    pub fn as_admin<T>(&self, msg: T) -> tonic::Request<T> {
        keyed(msg, &self.cast.admin.key)
    }

    /// `msg` with the client `shop`'s key.
    pub fn as_shop<T>(&self, msg: T) -> tonic::Request<T> {
        keyed(msg, &self.cast.shop.key)
    }

    /// A HELD reservation of `shop` on seats and stock.
    pub async fn held(&mut self, request_id: &str) -> proto::Reservation {
        let req = self.as_shop(reserve_request(
            request_id,
            vec![hold("seats", "A1"), hold("stock", "sku-1")],
        ));
        self.app.client.reserve(req).await.unwrap().into_inner()
    }

    /// A FAILED reservation: both participants lose their holds before the Confirm.
    pub async fn failed(&mut self, request_id: &str) -> proto::Reservation {
        let r = self.held(request_id).await;
        for name in ["seats", "stock"] {
            self.fakes.get(name).state.lock().unwrap().branches.clear();
        }
        let req = self.as_shop(Decide::on(&r).confirm());
        let c = self.app.client.confirm(req).await.unwrap().into_inner();
        assert_eq!(state(&c), proto::reservation::State::Failed);
        c
    }

    /// The reservation as GetReservation answers it to the admin.
    pub async fn get(&mut self, id: &str) -> proto::Reservation {
        let req = self.as_admin(proto::GetReservationRequest {
            reservation_id: id.to_owned(),
        });
        self.app
            .client
            .get_reservation(req)
            .await
            .unwrap()
            .into_inner()
    }

    /// How many audit entries the log holds in all.
    pub async fn audit_len(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM admin_audit")
            .fetch_one(&self.app.pool)
            .await
            .unwrap()
    }
}

pub fn state(r: &proto::Reservation) -> proto::reservation::State {
    crate::common::state_of(r)
}
