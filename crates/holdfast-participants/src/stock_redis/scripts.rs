//! The Lua scripts by which Redis decides for `stock-redis`, one `.lua` file each under
//! `lua/` (loaded with `include_str!`; each file's header says its KEYS, ARGV and answer).
//! Each runs atomically in Redis, so the counters, the branch record and the expiry index it
//! touches change together or not at all.
//!
//! # Scripts
//! Try checks every item and, only if all fit, decrements the counters, writes the record and
//! the expiry entry: all in one script, so they change together or not at all. Confirm and
//! Cancel move units only through the record's state transition (`held` -> `confirmed` /
//! `cancelled`), so repeats and races never move units twice. A Cancel or Confirm before its
//! Try writes a tombstone (`cancelled` / `hold_lost`); the late Try answers `REJECTED`.
//! Confirm after Cancel answers `CANCELLED`, Cancel after Confirm `CONFIRMED`, unchanged.
//! Extend moves a held record's deadline (`u` and its expiry entry) later, never earlier, and
//! answers the state of any other record unchanged. Like a hold itself, an extension lives in
//! Redis only: a Redis that loses it has lost the hold as well, or reclaims at the old deadline.
//! Try, Confirm, Cancel and PutResources first compare the data set's `seq` with the lowest
//! this process knows it may have (the durable changes it has seen): a data set behind it
//! loses its ready marker there and then, and the call answers `rebuilding`.
//!
//! # Retention of finished records
//! A record that becomes final (`confirmed`, `cancelled`, `rejected`, `hold_lost`) gets a
//! Redis expiry in the same script, so the data set does not grow without bound:
//! - a hold confirmed, cancelled or reclaimed, and a refused Try: at its deadline
//!   (`expires_at + orphan_grace`, the `u` of the record or of the Try) + `retention`;
//! - a tombstone (Cancel or Confirm before any Try, so no deadline is known):
//!   `orphan_grace + retention` from now;
//! - a `confirmed` record restored from the durable record: `retention` from now.
//!
//! A `held` record never expires (the reconciler finishes it). `retention` (default 7 days,
//! [`DEFAULT_RETENTION`](super::DEFAULT_RETENTION)) is meant to be far longer than any retry
//! of the coordinator, so while a record is there every late Try, Confirm or Cancel answers
//! exactly as above. After it expired the branch is unknown to Redis again, and:
//! - a confirmed branch still answers CONFIRMED to Confirm and to Cancel: the durable row in
//!   `stock_redis_confirmed` answers, and the record is restored (for another retention);
//! - any other branch: Confirm answers `HOLD_LOST`, Cancel `CANCELLED` (tombstones, no unit
//!   moves); a Try would be decided anew, and a hold it took carries its old deadline, so the
//!   reconciler returns its units as soon as `expires_at + orphan_grace` has passed.

use std::sync::LazyLock;

use redis::Script;

/// Try: holds every item or none (`lua/try.lua`).
pub(super) static TRY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/try.lua")));
/// Confirm: held -> confirmed, answering the items to make durable (`lua/confirm.lua`).
pub(super) static CONFIRM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/confirm.lua")));
/// Cancel: held -> cancelled, units back; a tombstone before Try (`lua/cancel.lua`).
pub(super) static CANCEL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/cancel.lua")));
/// Extend: a held record's deadline moves later, never earlier (`lua/extend.lua`).
pub(super) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/extend.lua")));
/// Returns the units of holds past their deadline, a batch at a time (`lua/reclaim.lua`).
pub(super) static RECLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/reclaim.lua")));
/// Demotes a confirm made under a lost epoch to `hold_lost` (`lua/demote.lua`).
pub(super) static DEMOTE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/demote.lua")));
/// Restores a durably confirmed branch's record (`lua/restore.lua`).
pub(super) static RESTORE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/restore.lua")));
/// Finishes a rebuild: every item's counters, then the ready marker (`lua/finish_rebuild.lua`).
pub(super) static FINISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/finish_rebuild.lua")));
/// Takes the ready marker from a data set behind the durable record (`lua/behind.lua`).
pub(super) static BEHIND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/behind.lua")));
/// Creates or resizes items, all or nothing (`lua/put.lua`).
pub(super) static PUT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/put.lua")));
