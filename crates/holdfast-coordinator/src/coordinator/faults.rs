//! Named failpoints between the coordinator's remote calls and its durable writes (the
//! `failpoints` cargo feature, `fail` crate; RELIABILITY.md lists them). Without the feature
//! every check is an empty inline function: nothing to evaluate, no names in the binary's code
//! path. With it, a failpoint configured `return` makes the step fail the way it already can
//! (a transient store error, an unreachable participant), `panic` panics the task.

use crate::registry::CallError;
use crate::store::StoreError;

/// Before or after a store write: `Err` is a transient `StoreError` (as a lost connection).
#[cfg(feature = "failpoints")]
pub(super) fn store(name: &str) -> Result<(), StoreError> {
    match fail::eval(name, |_| ()) {
        Some(()) => Err(StoreError::Contended(format!("failpoint {name}"))),
        None => Ok(()),
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(super) fn store(_name: &str) -> Result<(), StoreError> {
    Ok(())
}

/// Before or after a participant call: `Some` is the call's unknown outcome (as a timeout).
#[cfg(feature = "failpoints")]
pub(super) fn call(name: &str) -> Option<CallError> {
    fail::eval(name, |_| CallError {
        refused: false,
        message: format!("failpoint {name}"),
    })
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(super) fn call(_name: &str) -> Option<CallError> {
    None
}
