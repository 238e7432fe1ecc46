//! Latency samples and outcome counts of one benchmark scenario, and the percentile math
//! (nearest rank) the summary prints.

use std::collections::BTreeMap;
use std::time::Duration;

/// How one operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed as intended (reserved and confirmed).
    Ok,
    /// Refused for lack of capacity (`INSUFFICIENT_CAPACITY`): a normal answer in a flash sale.
    Rejected,
    /// Anything else: counted and reported, never hidden. The string groups like errors.
    Error(String),
}

/// What the workers of one scenario observed. Each worker keeps its own; they are merged.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    /// Latencies of successful operations, in microseconds.
    pub ok_micros: Vec<u64>,
    /// Latencies of rejected operations, in microseconds.
    pub rejected_micros: Vec<u64>,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
}

impl Recorder {
    /// Records one operation.
    pub fn record(&mut self, outcome: Outcome, took: Duration) {
        let micros = micros(took);
        match outcome {
            Outcome::Ok => self.ok_micros.push(micros),
            Outcome::Rejected => self.rejected_micros.push(micros),
            Outcome::Error(kind) => *self.errors.entry(kind).or_default() += 1,
        }
    }

    /// Adds another worker's observations.
    pub(crate) fn merge(&mut self, other: Recorder) {
        self.ok_micros.extend(other.ok_micros);
        self.rejected_micros.extend(other.rejected_micros);
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
    }

    /// Successful operations.
    pub fn ok(&self) -> u64 {
        self.ok_micros.len() as u64
    }

    /// Rejected operations.
    pub fn rejected(&self) -> u64 {
        self.rejected_micros.len() as u64
    }

    /// Failed operations.
    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// A latency as recorded: microseconds, saturating.
pub fn micros(took: Duration) -> u64 {
    u64::try_from(took.as_micros()).unwrap_or(u64::MAX)
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentile `p` (0..=100) of sorted samples; 0 when there are none.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50/p90/p99/max of microsecond samples, in milliseconds.
pub(crate) fn percentiles(samples: &[u64]) -> Percentiles {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    Percentiles {
        p50: ms(percentile(&sorted, 50.0)),
        p90: ms(percentile(&sorted, 90.0)),
        p99: ms(percentile(&sorted, 99.0)),
        max: ms(sorted.last().copied().unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&samples, 50.0), 50);
        assert_eq!(percentile(&samples, 90.0), 90);
        assert_eq!(percentile(&samples, 99.0), 99);
        assert_eq!(percentile(&samples, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(percentile(&[1, 2], 0.0), 1);
        let p = percentiles(&[3000, 1000, 2000]);
        assert_eq!((p.p50, p.max), (2.0, 3.0));
    }

    #[test]
    fn merge_keeps_every_outcome() {
        let mut a = Recorder::default();
        a.record(Outcome::Ok, Duration::from_millis(1));
        a.record(Outcome::Error("UNAVAILABLE".into()), Duration::ZERO);
        let mut b = Recorder::default();
        b.record(Outcome::Rejected, Duration::from_millis(2));
        b.record(Outcome::Error("UNAVAILABLE".into()), Duration::ZERO);
        a.merge(b);
        assert_eq!((a.ok(), a.rejected(), a.error_count()), (1, 1, 2));
        assert_eq!(a.errors["UNAVAILABLE"], 2);
    }
}
