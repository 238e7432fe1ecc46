//! The inventory (Admin `GetInventory`, the console's view of a sale as it sells): each named
//! resource's stock levels read from its participant, all in parallel, each within the
//! participant's call deadline; a line that cannot be read says why, the others still answer.

use super::{Coordinator, Error};
use crate::domain::admin::{InventoryLine, inventory_items};

impl Coordinator {
    /// The stock levels of each (participant, resource), in the order asked.
    pub async fn inventory(
        &self,
        items: Vec<(String, String)>,
    ) -> Result<Vec<InventoryLine>, Error> {
        inventory_items(&items)?;
        let reads = items.into_iter().map(|(participant, resource)| async move {
            let levels = match self.registry.require(&participant) {
                Ok(handle) => handle.stock_levels(&resource).await.map_err(|e| e.message),
                Err(e) => Err(e.message),
            };
            InventoryLine {
                participant,
                resource,
                levels,
            }
        });
        Ok(futures_util::future::join_all(reads).await)
    }
}
