//! The growth detectors' shared vocabulary of time and trend: the thresholds, the warm-up and
//! the statistics of the window that decided a level. [`super::growth`] (a call site's
//! surviving allocations), [`super::site_growth`] (one buffer replaced by larger ones) and
//! [`super::device_growth`] (a device's total) all judge a trend on these, so that they never
//! disagree about what one is. This file names no detector.

use serde::Serialize;

use super::Context;

/// Epochs after the clock became stable that never count as generations (docs/detection.md).
pub const WARMUP: u32 = 3;
/// A generation counts as surviving once it is this many epochs old (deferred frees,
/// gradient accumulation, async frees).
pub(crate) const LAG: u32 = 2;
pub(crate) const MIN_GROWTH: f64 = (1u64 << 20) as f64;
pub(crate) const WINDOWS: [usize; 3] = [8, 16, 32];
pub(crate) const ALPHA_LIKELY: f64 = 0.01;
pub(crate) const ALPHA_CONFIRMED: f64 = 0.001;
pub(crate) const SERIES: usize = 32;
pub(crate) const HISTORY: usize = 16;

/// The statistics of the window that decided a level.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Trend {
    pub window: usize,
    pub mann_kendall_s: i64,
    pub z: f64,
    /// One-sided, Bonferroni-corrected over the three window scales.
    pub p_value: f64,
    pub slope_bytes_per_step: f64,
    /// Sen's 95 % confidence interval of the slope.
    pub slope_ci: [f64; 2],
    pub growth_bytes: f64,
    pub new_generations: u32,
}

/// The first epoch that counts: `WARMUP` epochs after the clock became stable.
pub fn warmup_end(ctx: &Context<'_>) -> u32 {
    ctx.clock.stable_since + WARMUP
}

/// Seconds from the process's first event to `ts`.
pub(crate) fn seconds(ctx: &Context<'_>, ts: u64) -> f64 {
    ctx.clock
        .start_of(0)
        .map(|t0| ts.saturating_sub(t0) as f64 / 1e9)
        .unwrap_or(0.0)
}

/// A per-step rate in bytes per second: over the trace's own time, and only when the recent
/// steps span long enough to mean something (`epoch::RATE_MIN_SPAN_NS`); a run of a few
/// hundred milliseconds gets no per-second rate.
pub(crate) fn per_second(per_step: f64, ctx: &Context<'_>) -> Option<f64> {
    ctx.clock
        .step_duration_for_rates_s()
        .filter(|&d| d > 0.0)
        .map(|d| per_step / d)
}

/// When the device would be full at `per_step` bytes a step, from its live bytes and its
/// capacity: (steps, seconds at the median step). None without a capacity.
pub(crate) fn to_full(
    per_step: f64,
    live: u64,
    capacity: Option<u64>,
    ctx: &Context<'_>,
) -> (Option<f64>, Option<f64>) {
    match capacity {
        Some(cap) => {
            let steps = cap.saturating_sub(live) as f64 / per_step;
            (
                Some(steps),
                ctx.clock.median_duration_s().map(|t| steps * t),
            )
        }
        None => (None, None),
    }
}
