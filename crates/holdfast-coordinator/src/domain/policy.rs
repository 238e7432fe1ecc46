//! Policy values the coordinator decides by and the store applies: hold limits and the retry
//! schedule of unfinished work. Plain values, configured in `config`.

/// Which hold limit was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitScope {
    Holder,
    Total,
}

/// Caps on live (TRYING, or HELD and unexpired) reservations.
#[derive(Clone, Copy, Debug)]
pub struct HoldLimits {
    pub per_holder: u32,
    /// 0: no global cap.
    pub total: u32,
}

/// Retry schedule of unfinished work: `min(cap, base * 2^attempts)`, with jitter.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: std::time::Duration,
    pub cap: std::time::Duration,
}
