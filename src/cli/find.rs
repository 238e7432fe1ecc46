//! A reservation named by the first characters of its id (`holdfast get 01a23eb5`): a full id
//! (or anything but hex digits and dashes) is used as it is; a prefix is looked up (`ListReservations` `id_prefix`, one indexed read)
//! and names its one match, or fails listing the candidates (exit code 4) or finding none
//! (exit code 1, `RESERVATION_NOT_FOUND`).

use super::{CliError, Target, print_page};
use crate::proto;

/// How many candidates an ambiguous prefix shows.
const CANDIDATES: i32 = 10;

/// The full id `id` names: itself when it is one, else its prefix's one match.
pub(super) async fn full_id(target: &Target, id: String) -> Result<String, CliError> {
    let hexish = id.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    if uuid::Uuid::try_parse(&id).is_ok() || !hexish {
        // A whole id, or no id at all: GetReservation says which.
        return Ok(id);
    }
    let mut client = target.coordinator()?;
    let page = client
        .list_reservations(proto::ListReservationsRequest {
            id_prefix: id.clone(),
            page_size: CANDIDATES,
            ..Default::default()
        })
        .await
        .map_err(|s| CliError::from_status(&s, &target.coordinator))?
        .into_inner();
    match page.reservations.as_slice() {
        [] => Err(CliError::NoMatch(id)),
        [one] => Ok(one.id.clone()),
        several => {
            print_page(target, several, "");
            Err(CliError::Ambiguous {
                prefix: id,
                shown: several.len(),
                more: !page.next_page_token.is_empty(),
            })
        }
    }
}
