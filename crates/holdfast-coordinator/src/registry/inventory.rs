//! A resource's stock levels as its participant counts them (`tcc.v1.ResourceAdmin/
//! GetResource`), for the console's inventory view: read-only, on the participant's channel,
//! never counted as a failure of the participant (a participant may serve no ResourceAdmin).

use super::{CallError, ParticipantHandle};
use crate::domain::admin::StockLevels;
use crate::proto;

impl ParticipantHandle {
    /// The stock levels of `resource` at this participant now.
    pub(crate) async fn stock_levels(&self, resource: &str) -> Result<StockLevels, CallError> {
        let req = self.request(proto::GetResourceRequest {
            resource: resource.to_owned(),
        });
        match self.resources.clone().get_resource(req).await {
            Ok(answer) => {
                let r = answer.into_inner();
                Ok(StockLevels {
                    capacity: r.capacity,
                    available: r.available,
                    held: r.held,
                    confirmed: r.confirmed,
                })
            }
            Err(status) => Err(CallError::from_status(&status)),
        }
    }
}
