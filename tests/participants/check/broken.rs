//! A participant written without the SDK, in the test: an in-memory `tcc.v1.Participant`
//! (+ `ResourceAdmin` unless told otherwise) that keeps the SPEC 3.3 rules - unless one
//! [`Broken`] rule is switched on, each a mistake an author in another language could make.
//! The checker must pass the correct one and report each broken rule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use holdfast::proto::participant_server::{Participant, ParticipantServer};
use holdfast::proto::resource_admin_server::{ResourceAdmin, ResourceAdminServer};
use holdfast::proto::{
    BranchRequest, BranchResponse, ExtendBranchRequest, GetResourceRequest, PutResourcesRequest,
    PutResourcesResponse, ResourceStatus, TryRequest, TryResponse, branch::State,
    try_response::Outcome,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

/// One rule the participant breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// A repeated Try holds again; a repeated Confirm confirms again.
    ForgetsIdempotence,
    /// A Cancel before the Try records nothing, so the late Try holds.
    HoldsLateTry,
    /// Confirm of a cancelled branch confirms it.
    ConfirmsAfterCancel,
    /// Checks stock, then takes it later without a lock: concurrent Trys oversell.
    Oversells,
    /// Drops a hold at its `expires_at`, with no orphan grace: a hold granted with a
    /// deadline already past is gone by the Confirm.
    NoOrphanGrace,
    /// Panics on a Try without items and on a Confirm of a branch it never saw.
    Panics,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stock {
    capacity: i64,
    available: i64,
    held: i64,
    confirmed: i64,
}

#[derive(Clone, Debug)]
struct BranchRecord {
    state: State,
    /// `None` for a Try that was rejected or never came.
    hold: Option<(String, i64)>,
    expires_at: SystemTime,
}

#[derive(Default)]
struct Books {
    stock: HashMap<String, Stock>,
    branches: HashMap<(String, String), BranchRecord>,
}

/// The in-test participant.
#[derive(Clone)]
pub struct InTest {
    broken: Option<Broken>,
    books: Arc<Mutex<Books>>,
}

fn key(reservation_id: &str, branch_id: &str) -> (String, String) {
    (reservation_id.to_owned(), branch_id.to_owned())
}

fn invalid(field: &str) -> Status {
    Status::invalid_argument(format!("{field} is required"))
}

fn answer(state: State) -> Result<Response<BranchResponse>, Status> {
    Ok(Response::new(BranchResponse {
        state: state as i32,
    }))
}

impl InTest {
    fn is(&self, b: Broken) -> bool {
        self.broken == Some(b)
    }

    /// Checks a Try's shape; a correct participant names the field.
    fn check(&self, r: &TryRequest) -> Result<(String, i64, SystemTime), Status> {
        if r.reservation_id.is_empty() {
            return Err(invalid("reservation_id"));
        }
        if r.branch_id.is_empty() {
            return Err(invalid("branch_id"));
        }
        let item = if self.is(Broken::Panics) {
            &r.items[0]
        } else {
            r.items.first().ok_or_else(|| invalid("items"))?
        };
        if item.resource.is_empty() {
            return Err(invalid("items[0].resource"));
        }
        if item.quantity < 1 {
            return Err(Status::invalid_argument("items[0].quantity must be >= 1"));
        }
        let expires_at: SystemTime = r
            .expires_at
            .ok_or_else(|| invalid("expires_at"))?
            .try_into()
            .map_err(|_| Status::invalid_argument("expires_at is not a time"))?;
        if expires_at > SystemTime::now() + Duration::from_secs(24 * 3600) {
            return Err(Status::invalid_argument(
                "expires_at lies beyond the max hold",
            ));
        }
        Ok((item.resource.clone(), item.quantity, expires_at))
    }

    /// Takes `q` of `resource` if there are that many.
    async fn take(&self, resource: &str, q: i64) -> bool {
        if self.is(Broken::Oversells) {
            let enough = self
                .books
                .lock()
                .unwrap()
                .stock
                .get(resource)
                .is_some_and(|s| s.available >= q);
            // The bug: the decision and the write are apart, another Try decides between.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if enough && let Some(s) = self.books.lock().unwrap().stock.get_mut(resource) {
                s.available -= q;
                s.held += q;
            }
            return enough;
        }
        let mut books = self.books.lock().unwrap();
        match books.stock.get_mut(resource) {
            Some(s) if s.available >= q => {
                s.available -= q;
                s.held += q;
                true
            }
            _ => false,
        }
    }

    /// A lapsed hold's units go back (the `NoOrphanGrace` mistake: at `expires_at`).
    fn lapse(&self, books: &mut Books, k: &(String, String)) {
        let Some(b) = books.branches.get(k).cloned() else {
            return;
        };
        if self.is(Broken::NoOrphanGrace)
            && b.state == State::Held
            && b.expires_at <= SystemTime::now()
            && let Some((resource, q)) = &b.hold
        {
            if let Some(s) = books.stock.get_mut(resource) {
                s.available += q;
                s.held -= q;
            }
            if let Some(b) = books.branches.get_mut(k) {
                b.state = State::HoldLost;
            }
        }
    }

    /// Serves it on a loopback port; the URL and a sender that stops it.
    pub async fn start(broken: Option<Broken>, with_admin: bool) -> (String, oneshot::Sender<()>) {
        Self::start_with(broken, with_admin, &[]).await
    }

    /// Serves it with `resources` already there (for a run without ResourceAdmin).
    pub async fn start_with(
        broken: Option<Broken>,
        with_admin: bool,
        resources: &[(&str, i64)],
    ) -> (String, oneshot::Sender<()>) {
        let participant = InTest {
            broken,
            books: Arc::default(),
        };
        for (name, capacity) in resources {
            participant.books.lock().unwrap().stock.insert(
                (*name).to_owned(),
                Stock {
                    capacity: *capacity,
                    available: *capacity,
                    ..Stock::default()
                },
            );
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let admin = with_admin.then(|| ResourceAdminServer::new(participant.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ParticipantServer::new(participant))
                .add_optional_service(admin)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = rx.await;
                    },
                ),
        );
        (url, tx)
    }
}

#[tonic::async_trait]
impl Participant for InTest {
    async fn r#try(&self, request: Request<TryRequest>) -> Result<Response<TryResponse>, Status> {
        let r = request.into_inner();
        let (resource, q, expires_at) = self.check(&r)?;
        let k = key(&r.reservation_id, &r.branch_id);
        let seen = self.books.lock().unwrap().branches.get(&k).cloned();
        let first_answer = |held| {
            Ok(Response::new(TryResponse {
                outcome: if held {
                    Outcome::Held
                } else {
                    Outcome::Rejected
                } as i32,
                reason: if held { String::new() } else { "no".to_owned() },
            }))
        };
        match seen {
            Some(b) if b.state == State::Cancelled => return first_answer(b.hold.is_some()),
            Some(b) if !self.is(Broken::ForgetsIdempotence) => {
                return first_answer(b.hold.is_some());
            }
            _ => {}
        }
        let held = self.take(&resource, q).await;
        let mut books = self.books.lock().unwrap();
        let record = books.branches.entry(k).or_insert(BranchRecord {
            state: State::Rejected,
            hold: None,
            expires_at,
        });
        if held {
            record.state = State::Held;
            let units = record.hold.as_ref().map_or(0, |(_, u)| *u);
            record.hold = Some((resource, units + q));
        }
        first_answer(held)
    }

    async fn confirm(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let r = request.into_inner();
        let k = key(&r.reservation_id, &r.branch_id);
        let seen = self.books.lock().unwrap().branches.contains_key(&k);
        if !seen && self.is(Broken::Panics) {
            // Outside the lock, so only this call dies (the mutex is not poisoned).
            panic!("no such branch");
        }
        let mut books = self.books.lock().unwrap();
        self.lapse(&mut books, &k);
        let known = books.branches.get(&k).cloned();
        let b = match known {
            Some(b) => b,
            None => {
                books.branches.insert(
                    k,
                    BranchRecord {
                        state: State::HoldLost,
                        hold: None,
                        expires_at: SystemTime::now(),
                    },
                );
                return answer(State::HoldLost);
            }
        };
        let confirm = b.state == State::Held
            || (b.state == State::Cancelled && self.is(Broken::ConfirmsAfterCancel))
            || (b.state == State::Confirmed && self.is(Broken::ForgetsIdempotence));
        if !confirm {
            return answer(match b.state {
                State::Rejected => State::HoldLost,
                s => s,
            });
        }
        if let Some((resource, q)) = &b.hold
            && let Some(s) = books.stock.get_mut(resource)
        {
            if b.state == State::Held {
                s.held -= q;
            }
            s.confirmed += q;
        }
        if let Some(b) = books.branches.get_mut(&k) {
            b.state = State::Confirmed;
        }
        answer(State::Confirmed)
    }

    async fn cancel(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let r = request.into_inner();
        let k = key(&r.reservation_id, &r.branch_id);
        let mut books = self.books.lock().unwrap();
        self.lapse(&mut books, &k);
        let Some(b) = books.branches.get(&k).cloned() else {
            if !self.is(Broken::HoldsLateTry) {
                books.branches.insert(
                    k,
                    BranchRecord {
                        state: State::Cancelled,
                        hold: None,
                        expires_at: SystemTime::now(),
                    },
                );
            }
            return answer(State::Cancelled);
        };
        match b.state {
            State::Confirmed => answer(State::Confirmed),
            State::Held => {
                if let Some((resource, q)) = &b.hold
                    && let Some(s) = books.stock.get_mut(resource)
                {
                    s.held -= q;
                    s.available += q;
                }
                if let Some(b) = books.branches.get_mut(&k) {
                    b.state = State::Cancelled;
                }
                answer(State::Cancelled)
            }
            _ => {
                if let Some(b) = books.branches.get_mut(&k) {
                    b.state = State::Cancelled;
                }
                answer(State::Cancelled)
            }
        }
    }

    async fn extend(
        &self,
        request: Request<ExtendBranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let r = request.into_inner();
        let k = key(&r.reservation_id, &r.branch_id);
        let books = self.books.lock().unwrap();
        answer(match books.branches.get(&k).map(|b| b.state) {
            Some(State::Held) => State::Held,
            Some(State::Confirmed) => State::Confirmed,
            Some(State::Cancelled) => State::Cancelled,
            _ => State::HoldLost,
        })
    }
}

#[tonic::async_trait]
impl ResourceAdmin for InTest {
    async fn put_resources(
        &self,
        request: Request<PutResourcesRequest>,
    ) -> Result<Response<PutResourcesResponse>, Status> {
        let mut books = self.books.lock().unwrap();
        let mut out = Vec::new();
        for spec in request.into_inner().resources {
            let s = books.stock.entry(spec.resource.clone()).or_default();
            s.available += spec.capacity - s.capacity;
            s.capacity = spec.capacity;
            out.push(status(&spec.resource, s));
        }
        Ok(Response::new(PutResourcesResponse { resources: out }))
    }

    async fn get_resource(
        &self,
        request: Request<GetResourceRequest>,
    ) -> Result<Response<ResourceStatus>, Status> {
        let resource = request.into_inner().resource;
        let books = self.books.lock().unwrap();
        let s = books
            .stock
            .get(&resource)
            .ok_or_else(|| Status::not_found(format!("no resource {resource}")))?;
        Ok(Response::new(status(&resource, s)))
    }
}

fn status(resource: &str, s: &Stock) -> ResourceStatus {
    ResourceStatus {
        resource: resource.to_owned(),
        capacity: s.capacity,
        available: s.available,
        held: s.held,
        confirmed: s.confirmed,
    }
}
