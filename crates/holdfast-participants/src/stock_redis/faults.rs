//! Named failpoints of `stock-redis` between its Redis decision and its durable Postgres
//! record (the `failpoints` cargo feature; RELIABILITY.md lists them): the two places where
//! the two stores can disagree for a while. Without the feature the check is an empty inline
//! function. `return` fails the call as an internal error would (the script already ran:
//! Redis says confirmed, the answer is lost), `panic` panics the handler.

use super::StockRedisError;

#[cfg(feature = "failpoints")]
pub(super) fn check(name: &str) -> Result<(), StockRedisError> {
    match fail::eval(name, |_| ()) {
        Some(()) => Err(StockRedisError::Internal(format!("failpoint {name}"))),
        None => Ok(()),
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(super) fn check(_name: &str) -> Result<(), StockRedisError> {
    Ok(())
}
