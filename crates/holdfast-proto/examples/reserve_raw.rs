//! Reserve and confirm with the generated `tcc.v1` client, nothing else: what `holdfast-client`
//! adds (typed values, `Reason`s, Reserve retried safely) is yours to do here. Against the
//! all-in-one (`holdfast`, its `noop` participant holds anything):
//! `cargo run -p holdfast-proto --example reserve_raw` (`HOLDFAST_URL` names another).

use holdfast_proto::coordinator_client::CoordinatorClient;
use holdfast_proto::reservation::State;
use holdfast_proto::{ConfirmRequest, Hold, ReserveRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("HOLDFAST_URL").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut coordinator = CoordinatorClient::connect(url).await?;
    let held = coordinator
        .reserve(ReserveRequest {
            request_id: format!("order-{}", std::process::id()),
            holder: "alice".into(),
            ttl: Some(prost_types::Duration {
                seconds: 600,
                nanos: 0,
            }),
            holds: vec![Hold {
                participant: "noop".into(),
                resource: "seat-A1".into(),
                quantity: 1,
                during: None,
            }],
            labels: Default::default(),
            queue: None,
        })
        .await?
        .into_inner();
    assert_eq!(held.state(), State::Held);
    let confirmed = coordinator
        .confirm(ConfirmRequest {
            reservation_id: held.id.clone(),
            hold_token: held.hold_token, // only Reserve's answer carries it
            payment: None,
        })
        .await?
        .into_inner();
    println!("{} is {:?}", confirmed.id, confirmed.state());
    // Every message type holdfast speaks, for reflection or a dynamic client:
    println!(
        "descriptor set: {} bytes",
        holdfast_proto::FILE_DESCRIPTOR_SET.len()
    );
    Ok(())
}
