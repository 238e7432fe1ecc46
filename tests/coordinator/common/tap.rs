//! A `tcc.v1.Participant` in front of a real participant: forwards every call unchanged and
//! logs it (method, branch) in a [`CallLog`], so a test can count what each branch got from the
//! coordinators - across a crash, where neither coordinator knows what the other sent.

use holdfast::proto;
use holdfast::proto::participant_client::ParticipantClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{Call, CallLog};

struct Tap {
    name: String,
    target: ParticipantClient<Channel>,
    log: CallLog,
}

impl Tap {
    fn note(&self, method: &'static str, branch_id: &str) {
        self.log.push(Call {
            participant: self.name.clone(),
            method,
            branch_id: branch_id.to_owned(),
            resources: vec![],
            // Forwarded, not answered here.
            answer: None,
        });
    }
}

#[tonic::async_trait]
impl proto::participant_server::Participant for Tap {
    async fn r#try(
        &self,
        request: Request<proto::TryRequest>,
    ) -> Result<Response<proto::TryResponse>, Status> {
        self.note("Try", &request.get_ref().branch_id);
        self.target.clone().r#try(request.into_inner()).await
    }

    async fn confirm(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.note("Confirm", &request.get_ref().branch_id);
        self.target.clone().confirm(request.into_inner()).await
    }

    async fn cancel(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.note("Cancel", &request.get_ref().branch_id);
        self.target.clone().cancel(request.into_inner()).await
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendBranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        self.note("Extend", &request.get_ref().branch_id);
        self.target.clone().extend(request.into_inner()).await
    }
}

/// Starts a tap named `name` on 127.0.0.1:0 in front of the participant at `target`; its URL.
pub async fn spawn_tap(name: &str, target: &str, log: CallLog) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let tap = Tap {
        name: name.to_owned(),
        target: ParticipantClient::connect(target.to_owned()).await.unwrap(),
        log,
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(proto::participant_server::ParticipantServer::new(tap))
            .add_service(tonic_health::server::health_reporter().1)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    url
}
