//! Named failpoints in the participant SDK between a business change and its barrier row, and
//! after the commit before the answer (the `failpoints` cargo feature; RELIABILITY.md lists
//! them). Without the feature the check is an empty inline function. `return` fails the call
//! with an internal error (the transaction, if open, rolls back), `panic` panics the handler.

use super::ResourceError;

#[cfg(feature = "failpoints")]
pub(super) fn check(name: &str) -> Result<(), ResourceError> {
    match fail::eval(name, |_| ()) {
        Some(()) => Err(ResourceError::Internal(format!("failpoint {name}"))),
        None => Ok(()),
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(super) fn check(_name: &str) -> Result<(), ResourceError> {
    Ok(())
}
