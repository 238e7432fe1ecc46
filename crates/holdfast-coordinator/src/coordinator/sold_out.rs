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
//!
//! When a hint lapses, one Reserve asks the participant again (the probe) and the others
//! asking for that hold wait for its answer, at most the hint's lifetime or 2 s: refused, they are
//! refused by the fresh refusal; anything else (held, an error, a release meanwhile) and the
//! hint is gone and they go on. So a lapse costs a sale one recorded refusal, not one per
//! Reserve in flight, and no Reserve is refused on a refusal older than the lifetime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::domain::{Hold, Interval};

/// At most this many hints are kept (refusals of unknown resource names must not grow memory
/// without bound); when full, expired ones are dropped and, if none are, a refusal is not
/// remembered.
const MAX_HINTS: usize = 4096;

/// The longest a Reserve waits for another's probe of a lapsed hint (or the hints' lifetime,
/// if shorter), and the age at which a probe that has not answered is taken over. A probe
/// answers within one Reserve's time, tens of milliseconds; this bounds a stuck one.
const PROBE_PATIENCE: Duration = Duration::from_secs(2);

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
    /// The Reserve asking again since the hint lapsed, if any.
    probe: Option<Probing>,
}

/// A lapsed hint's probe in flight. Its waiters are woken when it is dropped: when the probe
/// is refused (the hint is fresh again), ends otherwise (the hint goes), or the hint goes.
#[derive(Debug)]
struct Probing {
    id: u64,
    since: Instant,
    waiters: watch::Sender<()>,
}

type HintKey = (String, Option<Interval>);

/// What [`SoldOutHints::check`] finds for a Reserve's holds.
#[derive(Debug)]
enum Check {
    /// No hint refuses them. `Some` when this Reserve is the probe of lapsed hints: it holds
    /// the [`Probe`] until its placement has ended.
    Clear(Option<Probe>),
    /// A live hint refuses one of them.
    Refused(SoldOutHit),
    /// Another Reserve is asking about a lapsed hint of one of them: changed (closed) when
    /// its answer is known.
    Wait(watch::Receiver<()>),
}

/// A Reserve asking the participant again about lapsed hints. Dropped without a refusal
/// having been remembered (the hold was placed, the Try failed otherwise, the Reserve ended
/// before its Try), the hints go and the Reserves waiting on them go on.
#[derive(Debug)]
pub(crate) struct Probe {
    hints: Arc<SoldOutHints>,
    id: u64,
    keys: Vec<(String, HintKey)>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let mut all = self.hints.lock();
        for k in &self.keys {
            let mine = probe_of(&mut all, k)
                .and_then(|p| p.as_ref())
                .is_some_and(|p| p.id == self.id);
            if let (true, Some(at)) = (mine, all.get_mut(&k.0)) {
                at.hints.remove(&k.1);
            }
        }
    }
}

#[derive(Debug, Default)]
struct AtParticipant {
    /// Bumped at the start and end of every release at this participant.
    epoch: u64,
    hints: HashMap<HintKey, Hint>,
}

/// The sold-out hints of one coordinator process.
#[derive(Debug)]
pub struct SoldOutHints {
    lifetime: Duration,
    inner: Mutex<HashMap<String, AtParticipant>>,
    probes: AtomicU64,
}

impl SoldOutHints {
    /// Hints live `lifetime`; zero turns the fast path off.
    pub fn new(lifetime: Duration) -> SoldOutHints {
        SoldOutHints {
            lifetime,
            inner: Mutex::new(HashMap::new()),
            probes: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AtParticipant>> {
        // A panic while holding this lock leaves only hints behind: still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a probe of a lapsed hint is waited for ([`PROBE_PATIENCE`]).
    fn patience(&self) -> Duration {
        self.lifetime.min(PROBE_PATIENCE)
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
            // A lapsed hint asked again and refused again (its probe's waiters wake with the
            // fresh refusal), or a new one.
            _ => {
                at.hints.insert(
                    key,
                    Hint {
                        quantity: hold.quantity,
                        reason,
                        seen: now,
                        probe: None,
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

    /// What the hints say of `holds`: the first a live hint refuses; else, when some of
    /// their hints lapsed, whether another Reserve is asking about them (wait for it) or
    /// this one does (it is their probe).
    fn check(self: &Arc<Self>, holds: &[Hold]) -> Check {
        if self.lifetime.is_zero() {
            return Check::Clear(None);
        }
        let now = Instant::now();
        let mut all = self.lock();
        let mut lapsed = Vec::new();
        for hold in holds {
            // No key is built for a participant without hints: the common case, every Reserve.
            let Some(at) = all.get(&hold.participant).filter(|at| !at.hints.is_empty()) else {
                continue;
            };
            let key = (hold.resource.clone(), hold.during);
            let Some(hint) = at.hints.get(&key) else {
                continue;
            };
            if hold.quantity < hint.quantity {
                continue;
            }
            let age = now.duration_since(hint.seen);
            if age < self.lifetime {
                return Check::Refused(SoldOutHit {
                    participant: hold.participant.clone(),
                    resource: hold.resource.clone(),
                    quantity: hint.quantity,
                    reason: hint.reason.clone(),
                    age,
                });
            }
            lapsed.push((hold.participant.clone(), key));
        }
        if lapsed.is_empty() {
            return Check::Clear(None);
        }
        for k in &lapsed {
            // A probe unanswered for longer than the patience is taken over: it may never answer.
            if let Some(Some(p)) = probe_of(&mut all, k)
                && now.duration_since(p.since) < self.patience()
            {
                return Check::Wait(p.waiters.subscribe());
            }
        }
        let id = self.probes.fetch_add(1, Ordering::Relaxed);
        for k in &lapsed {
            if let Some(probe) = probe_of(&mut all, k) {
                *probe = Some(Probing {
                    id,
                    since: now,
                    waiters: watch::channel(()).0,
                });
            }
        }
        drop(all);
        Check::Clear(Some(Probe {
            hints: self.clone(),
            id,
            keys: lapsed,
        }))
    }

    /// [`check`](Self::check), waiting while another Reserve asks about a lapsed hint (at
    /// most [`PROBE_PATIENCE`] or the hints' lifetime in all, then it goes on): the refusal,
    /// or this Reserve's probe if it is one.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        holds: &[Hold],
    ) -> Result<Option<Probe>, SoldOutHit> {
        let until = tokio::time::Instant::now() + self.patience();
        loop {
            match self.check(holds) {
                Check::Clear(probe) => return Ok(probe),
                Check::Refused(hit) => return Err(hit),
                Check::Wait(mut answered) => {
                    // Closed (an error) when the probe ends, whichever way.
                    if tokio::time::timeout_at(until, answered.changed())
                        .await
                        .is_err()
                    {
                        return Ok(None);
                    }
                }
            }
        }
    }
}

/// The probe slot of the hint at `participant`, `key`, if there is one.
fn probe_of<'a>(
    all: &'a mut HashMap<String, AtParticipant>,
    (participant, key): &(String, HintKey),
) -> Option<&'a mut Option<Probing>> {
    let hint = all.get_mut(participant)?.hints.get_mut(key)?;
    Some(&mut hint.probe)
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

    /// The refusal `check` answers, if it refuses.
    fn refusal(hints: &Arc<SoldOutHints>, holds: &[Hold]) -> Option<SoldOutHit> {
        match hints.check(holds) {
            Check::Refused(hit) => Some(hit),
            Check::Clear(_) | Check::Wait(_) => None,
        }
    }

    /// A hint of `sku` refused at quantity 1, lapsed.
    fn lapsed(lifetime: Duration) -> Arc<SoldOutHints> {
        let hints = Arc::new(SoldOutHints::new(lifetime));
        hints.refused(&hold("sku", 1), "sold out", hints.epoch("stock"));
        std::thread::sleep(lifetime + Duration::from_millis(5));
        hints
    }

    #[tokio::test]
    async fn a_lapsed_hint_is_asked_again_by_one_reserve_while_the_others_wait() {
        let hints = lapsed(Duration::from_millis(200));
        let Check::Clear(Some(probe)) = hints.check(&[hold("sku", 1)]) else {
            panic!("the first Reserve after the lapse asks the participant again");
        };
        // A smaller quantity than the refused one was never refused: it goes on.
        let Check::Clear(None) = hints.check(&[hold("sku", 0)]) else {
            panic!("a quantity the hint never covered");
        };
        let Check::Wait(mut answered) = hints.check(&[hold("sku", 2)]) else {
            panic!("the others wait for the probe's answer");
        };
        let waiting = tokio::spawn(async move { answered.changed().await.is_err() });
        // The probe is refused again: the waiters wake to a fresh refusal.
        hints.refused(&hold("sku", 1), "sold out", hints.epoch("stock"));
        assert!(waiting.await.unwrap(), "woken by the probe's end");
        let hit = refusal(&hints, &[hold("sku", 2)]).expect("refused by the fresh refusal");
        assert!(hit.age < Duration::from_millis(200), "{hit:?}");
        drop(probe);
        assert!(
            refusal(&hints, &[hold("sku", 1)]).is_some(),
            "a probe that was refused leaves the fresh hint"
        );
    }

    #[tokio::test]
    async fn a_probe_that_ends_unrefused_takes_its_hint_away() {
        let hints = lapsed(Duration::from_millis(50));
        let Check::Clear(Some(probe)) = hints.check(&[hold("sku", 1)]) else {
            panic!("a probe");
        };
        let waiter = {
            let hints = hints.clone();
            tokio::spawn(async move { hints.admit(&[hold("sku", 1)]).await })
        };
        // Held (or failed otherwise): the hint goes, and so does the waiter, not a probe.
        drop(probe);
        assert!(matches!(waiter.await.unwrap(), Ok(None)));
        assert!(matches!(hints.check(&[hold("sku", 1)]), Check::Clear(None)));
        // A release while a probe is out wakes its waiters alike.
        hints.refused(&hold("sku", 1), "sold out", hints.epoch("stock"));
        std::thread::sleep(Duration::from_millis(55));
        let Check::Clear(Some(_probe)) = hints.check(&[hold("sku", 1)]) else {
            panic!("a probe");
        };
        let Check::Wait(mut answered) = hints.check(&[hold("sku", 1)]) else {
            panic!("a waiter");
        };
        hints.released("stock", ["sku"]);
        assert!(answered.changed().await.is_err());
        assert!(matches!(hints.check(&[hold("sku", 1)]), Check::Clear(None)));
    }

    #[tokio::test]
    async fn a_probe_that_never_answers_is_waited_for_at_most_the_lifetime() {
        let hints = lapsed(Duration::from_millis(100));
        let Check::Clear(Some(_stuck)) = hints.check(&[hold("sku", 1)]) else {
            panic!("a probe");
        };
        // However long hints live, a probe is waited for at most PROBE_PATIENCE.
        assert_eq!(
            SoldOutHints::new(Duration::from_secs(3600)).patience(),
            PROBE_PATIENCE
        );
        assert_eq!(hints.patience(), Duration::from_millis(100));
        let asked = Instant::now();
        assert!(matches!(hints.admit(&[hold("sku", 1)]).await, Ok(None)));
        assert!(
            asked.elapsed() >= Duration::from_millis(90),
            "{:?}",
            asked.elapsed()
        );
        // Past its lifetime the stuck probe is taken over by the next Reserve.
        assert!(matches!(
            hints.check(&[hold("sku", 1)]),
            Check::Clear(Some(_))
        ));
    }

    #[test]
    fn a_refusal_covers_larger_quantities_until_a_release() {
        let hints = Arc::new(SoldOutHints::new(Duration::from_secs(60)));
        let e = hints.epoch("stock");
        hints.refused(&hold("sku", 2), "sold out", e);
        assert_eq!(refusal(&hints, &[hold("sku", 1)]), None);
        assert_eq!(refusal(&hints, &[hold("other", 5)]), None);
        let hit = refusal(&hints, &[hold("other", 1), hold("sku", 3)]).unwrap();
        assert_eq!((hit.resource.as_str(), hit.quantity), ("sku", 2));
        hints.released("stock", ["sku"]);
        assert_eq!(refusal(&hints, &[hold("sku", 3)]), None);
    }

    #[test]
    fn a_refusal_answered_across_a_release_is_not_remembered() {
        let hints = Arc::new(SoldOutHints::new(Duration::from_secs(60)));
        let e = hints.epoch("stock");
        hints.released("stock", ["elsewhere"]);
        hints.refused(&hold("sku", 1), "sold out", e);
        assert_eq!(refusal(&hints, &[hold("sku", 1)]), None);
        let e = hints.epoch("stock");
        hints.refused(&hold("sku", 1), "sold out", e);
        assert!(refusal(&hints, &[hold("sku", 1)]).is_some());
        hints.released_all("stock");
        assert_eq!(refusal(&hints, &[hold("sku", 1)]), None);
    }

    #[test]
    fn hints_lapse_and_a_zero_lifetime_turns_them_off() {
        let hints = Arc::new(SoldOutHints::new(Duration::from_millis(1)));
        hints.refused(&hold("sku", 1), "sold out", hints.epoch("stock"));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(refusal(&hints, &[hold("sku", 1)]), None);
        let off = Arc::new(SoldOutHints::new(Duration::ZERO));
        off.refused(&hold("sku", 1), "sold out", off.epoch("stock"));
        assert_eq!(refusal(&off, &[hold("sku", 1)]), None);
    }

    #[test]
    fn memory_is_bounded() {
        let hints = Arc::new(SoldOutHints::new(Duration::from_secs(60)));
        for i in 0..MAX_HINTS + 10 {
            hints.refused(&hold(&format!("r{i}"), 1), "sold out", 0);
        }
        assert!(refusal(&hints, &[hold("r0", 1)]).is_some());
        assert_eq!(
            refusal(&hints, &[hold(&format!("r{}", MAX_HINTS + 5), 1)]),
            None
        );
    }
}
