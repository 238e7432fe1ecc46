//! The sold-out fast path: a Reserve that would be refused is refused before anything is
//! recorded, so a flash sale's losers cost no durable write (SPEC 3.2: `INSUFFICIENT_CAPACITY`,
//! ErrorInfo metadata `recorded` = `false`).
//!
//! Why a refusal here is never wrong in the way that matters: a participant refused a Try of
//! one hold (`resource`, `during`, quantity `q`) of a fresh branch; until a unit of that
//! resource comes back, a Try of the same resource and slot for `q` or more is refused again.
//! Units come back by releases, and this coordinator is the only one placing (and so
//! releasing) its holds: every release it sends (Cancel, expiry, rejection cleanup, a
//! confirm answered hold-lost, a refund) drops the hints of what it touches, at its start and
//! at its end, and a refusal is only remembered when no release at that participant began
//! between the Try's sending and its answer (an epoch per participant). Units that come back
//! by other paths (`ResourceAdmin/PutResources`, another replica's releases, a participant's
//! own reclaim) are missed for at most the hint's lifetime (`--sold-out-hint`, default 1 s),
//! after which the next Reserve asks the participant again. So the fast path can refuse a
//! request that a Try would have granted only within that bound after units came back by
//! another path; it never places a hold, so it can neither oversell nor leave one behind.
//! It assumes a participant refuses a hold for the resource's state, not for who asks:
//! a participant whose refusals depend on the holder needs `--sold-out-hint 0s`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::domain::{Hold, Interval};

/// At most this many hints are kept (refusals of unknown resource names must not grow memory
/// without bound); when full, expired ones are dropped and, if none are, a refusal is not
/// remembered.
const MAX_HINTS: usize = 4096;

/// The longest refusal reason a hint keeps (a participant's reason is free text).
const MAX_REASON: usize = 256;

/// A hold the fast path refuses: what a participant refused, why, and how long ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoldOutHit {
    pub participant: String,
    pub resource: String,
    /// The smallest quantity refused.
    pub quantity: i64,
    /// The participant's own reason, as it gave it the last time ("item sku-9 does not
    /// exist" stays that: a typo never reads as sold out).
    pub reason: String,
    pub age: Duration,
}

#[derive(Debug)]
struct Hint {
    quantity: i64,
    reason: String,
    seen: Instant,
}

#[derive(Debug, Default)]
struct AtParticipant {
    /// Bumped at the start and end of every release at this participant.
    epoch: u64,
    hints: HashMap<(String, Option<Interval>), Hint>,
}

/// The sold-out hints of one coordinator process.
#[derive(Debug)]
pub struct SoldOutHints {
    lifetime: Duration,
    inner: Mutex<HashMap<String, AtParticipant>>,
}

impl SoldOutHints {
    /// Hints live `lifetime`; zero turns the fast path off.
    pub fn new(lifetime: Duration) -> SoldOutHints {
        SoldOutHints {
            lifetime,
            inner: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AtParticipant>> {
        // A panic while holding this lock leaves only hints behind: still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The participant's release epoch, taken before a Try is sent.
    pub fn epoch(&self, participant: &str) -> u64 {
        if self.lifetime.is_zero() {
            return 0;
        }
        self.lock().get(participant).map_or(0, |p| p.epoch)
    }

    /// A participant refused a Try whose only hold is `hold`, saying `reason`; remembered
    /// unless a release at that participant began since `epoch` was taken (its units may be
    /// the ones refused).
    pub fn refused(&self, hold: &Hold, reason: &str, epoch: u64) {
        if self.lifetime.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut all = self.lock();
        if all.get(&hold.participant).map_or(0, |p| p.epoch) != epoch {
            return;
        }
        let count: usize = all.values().map(|p| p.hints.len()).sum();
        if count >= MAX_HINTS {
            let lifetime = self.lifetime;
            for p in all.values_mut() {
                p.hints.retain(|_, h| now.duration_since(h.seen) < lifetime);
            }
            if all.values().map(|p| p.hints.len()).sum::<usize>() >= MAX_HINTS {
                return;
            }
        }
        let at = all.entry(hold.participant.clone()).or_default();
        let key = (hold.resource.clone(), hold.during);
        let reason = bounded(reason);
        match at.hints.get_mut(&key) {
            // A smaller refused quantity covers more requests; a fresher one lasts longer.
            Some(h) if now.duration_since(h.seen) < self.lifetime => {
                h.quantity = h.quantity.min(hold.quantity);
                h.reason = reason;
                h.seen = now;
            }
            _ => {
                at.hints.insert(
                    key,
                    Hint {
                        quantity: hold.quantity,
                        reason,
                        seen: now,
                    },
                );
            }
        }
    }

    /// A release at `participant` of `resources` begins or ended: their hints go, and
    /// refusals answered across it are not remembered.
    pub fn released<'a>(&self, participant: &str, resources: impl IntoIterator<Item = &'a str>) {
        if self.lifetime.is_zero() {
            return;
        }
        let mut all = self.lock();
        let at = all.entry(participant.to_owned()).or_default();
        at.epoch = at.epoch.wrapping_add(1);
        for resource in resources {
            at.hints.retain(|(r, _), _| r != resource);
        }
    }

    /// Units of any resource of `participant` may have come back (a refund): every hint of
    /// it goes.
    pub fn released_all(&self, participant: &str) {
        if self.lifetime.is_zero() {
            return;
        }
        let mut all = self.lock();
        let at = all.entry(participant.to_owned()).or_default();
        at.epoch = at.epoch.wrapping_add(1);
        at.hints.clear();
    }

    /// The first of `holds` a live hint refuses, if any.
    pub fn check(&self, holds: &[Hold]) -> Option<SoldOutHit> {
        if self.lifetime.is_zero() {
            return None;
        }
        let now = Instant::now();
        let mut all = self.lock();
        for hold in holds {
            let Some(at) = all.get_mut(&hold.participant) else {
                continue;
            };
            let key = (hold.resource.clone(), hold.during);
            let Some(hint) = at.hints.get(&key) else {
                continue;
            };
            let age = now.duration_since(hint.seen);
            if age >= self.lifetime {
                at.hints.remove(&key);
                continue;
            }
            if hold.quantity >= hint.quantity {
                return Some(SoldOutHit {
                    participant: hold.participant.clone(),
                    resource: hold.resource.clone(),
                    quantity: hint.quantity,
                    reason: hint.reason.clone(),
                    age,
                });
            }
        }
        None
    }
}

/// `reason` cut to at most [`MAX_REASON`] bytes, on a character boundary.
fn bounded(reason: &str) -> String {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(resource: &str, quantity: i64) -> Hold {
        Hold {
            participant: "stock".into(),
            resource: resource.into(),
            quantity,
            during: None,
        }
    }

    #[test]
    fn a_refusal_covers_larger_quantities_until_a_release() {
        let hints = SoldOutHints::new(Duration::from_secs(60));
        let e = hints.epoch("stock");
        hints.refused(&hold("sku", 2), "sold out", e);
        assert_eq!(hints.check(&[hold("sku", 1)]), None);
        assert_eq!(hints.check(&[hold("other", 5)]), None);
        let hit = hints.check(&[hold("other", 1), hold("sku", 3)]).unwrap();
        assert_eq!((hit.resource.as_str(), hit.quantity), ("sku", 2));
        hints.released("stock", ["sku"]);
        assert_eq!(hints.check(&[hold("sku", 3)]), None);
    }

    #[test]
    fn a_refusal_answered_across_a_release_is_not_remembered() {
        let hints = SoldOutHints::new(Duration::from_secs(60));
        let e = hints.epoch("stock");
        hints.released("stock", ["elsewhere"]);
        hints.refused(&hold("sku", 1), "sold out", e);
        assert_eq!(hints.check(&[hold("sku", 1)]), None);
        let e = hints.epoch("stock");
        hints.refused(&hold("sku", 1), "sold out", e);
        assert!(hints.check(&[hold("sku", 1)]).is_some());
        hints.released_all("stock");
        assert_eq!(hints.check(&[hold("sku", 1)]), None);
    }

    #[test]
    fn hints_lapse_and_a_zero_lifetime_turns_them_off() {
        let hints = SoldOutHints::new(Duration::from_millis(1));
        hints.refused(&hold("sku", 1), "sold out", hints.epoch("stock"));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(hints.check(&[hold("sku", 1)]), None);
        let off = SoldOutHints::new(Duration::ZERO);
        off.refused(&hold("sku", 1), "sold out", off.epoch("stock"));
        assert_eq!(off.check(&[hold("sku", 1)]), None);
    }

    #[test]
    fn memory_is_bounded() {
        let hints = SoldOutHints::new(Duration::from_secs(60));
        for i in 0..MAX_HINTS + 10 {
            hints.refused(&hold(&format!("r{i}"), 1), "sold out", 0);
        }
        assert!(hints.check(&[hold("r0", 1)]).is_some());
        assert_eq!(
            hints.check(&[hold(&format!("r{}", MAX_HINTS + 5), 1)]),
            None
        );
    }
}
