//! A gRPC service of your own on holdfast's serving layer: an in-memory `tcc.v1.ResourceAdmin`
//! served with health, reflection, the overload layers and, given a principals file, API keys
//! and roles - refused on a non-loopback address without them. Run:
//! `cargo run -p holdfast-serve --example inventory`, then
//! `grpcurl -plaintext -d '{"resources":[{"resource":"A1","capacity":2}]}' 127.0.0.1:50080 tcc.v1.ResourceAdmin/PutResources`
//! (`INVENTORY_LISTEN`, `INVENTORY_AUTH_KEYS`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use holdfast_proto::resource_admin_server::{ResourceAdmin, ResourceAdminServer};
use holdfast_proto::{
    GetResourceRequest, PutResourcesRequest, PutResourcesResponse, ResourceStatus,
};
use holdfast_serve::{auth, server};
use tonic::{Request, Response, Status};

#[derive(Default)]
struct Inventory(Mutex<BTreeMap<String, i64>>);

impl Inventory {
    fn status(resource: &str, capacity: i64) -> ResourceStatus {
        ResourceStatus {
            resource: resource.to_owned(),
            capacity,
            available: capacity,
            held: 0,
            confirmed: 0,
        }
    }
}

#[tonic::async_trait]
impl ResourceAdmin for Inventory {
    async fn put_resources(
        &self,
        request: Request<PutResourcesRequest>,
    ) -> Result<Response<PutResourcesResponse>, Status> {
        let mut stock = self.0.lock().map_err(|_| Status::internal("poisoned"))?;
        let mut resources = Vec::new();
        for (i, spec) in request.into_inner().resources.into_iter().enumerate() {
            if spec.capacity < 0 {
                return Err(Status::invalid_argument(format!(
                    "resources[{i}].capacity must be >= 0"
                )));
            }
            stock.insert(spec.resource.clone(), spec.capacity);
            resources.push(Inventory::status(&spec.resource, spec.capacity));
        }
        Ok(Response::new(PutResourcesResponse { resources }))
    }

    async fn get_resource(
        &self,
        request: Request<GetResourceRequest>,
    ) -> Result<Response<ResourceStatus>, Status> {
        let resource = request.into_inner().resource;
        let stock = self.0.lock().map_err(|_| Status::internal("poisoned"))?;
        match stock.get(&resource) {
            Some(&capacity) => Ok(Response::new(Inventory::status(&resource, capacity))),
            None => Err(Status::not_found(format!("no resource {resource:?}"))),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Without a principals file: authentication off, so loopback only (`serve` refuses more).
    let auth = match std::env::var_os("INVENTORY_AUTH_KEYS") {
        Some(path) => auth::Authenticator::from_file("INVENTORY_AUTH_KEYS", path.as_ref())?,
        None => auth::Authenticator::Off,
    };
    let listen = std::env::var("INVENTORY_LISTEN").unwrap_or_else(|_| "127.0.0.1:50080".into());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("inventory serving on {}", listener.local_addr()?);
    let routes = tonic::service::Routes::new(ResourceAdminServer::new(Inventory::default()));
    server::serve(
        listener,
        &auth,
        routes,
        &["tcc.v1.ResourceAdmin"],
        server::shutdown_signal(),
    )
    .await?;
    Ok(())
}
