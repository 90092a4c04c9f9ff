//! The trend windows shared by the three growth detectors ([`super::growth`]: a call site's
//! surviving allocations; [`super::device_growth`]: a device's total; [`super::site_growth`]: a
//! call site whose allocations are replaced by larger ones), so that they never disagree about
//! what a trend is.
//!
//! One sample per epoch. Over the last 8, 16 and 32 samples (as many as there are, at least
//! [`MIN_WINDOW`]): Mann-Kendall p·3 < 0.01 (Bonferroni over the three scales), a positive
//! Theil-Sen slope and ≥ 1 MiB of growth; each detector adds its own condition on the window
//! (new surviving generations, or replaced allocations). The passing window with the smallest
//! p-value is the trend.

use std::collections::VecDeque;

use serde::Serialize;

use super::stats::{mann_kendall, median, theil_sen};
use super::trend::{Trend, ALPHA_LIKELY, MIN_GROWTH, SERIES, WINDOWS};

/// Fewest samples a trend is tested on.
pub const MIN_WINDOW: usize = 6;
/// Samples over which growth is checked for slowing down (two halves).
pub const HALVES: usize = 16;
/// Gaps between raises of a high-water mark each detector keeps.
pub const RAISE_GAPS: usize = 8;

/// A series' high-water mark and how it was raised: the one record the three growth
/// detectors keep of it (a site's live bytes, a buffer's, a device's level).
#[derive(Clone, Debug, Default)]
pub struct HighWater {
    /// The highest value seen (0: none yet).
    pub bytes: u64,
    /// The step it was reached at (or the series began, or restarted).
    pub epoch: u32,
    /// Steps between its last raises, at most [`RAISE_GAPS`].
    raise_gaps: VecDeque<u32>,
}

impl HighWater {
    /// A series that begins at step `epoch`, with nothing seen.
    pub fn new(epoch: u32) -> HighWater {
        HighWater {
            bytes: 0,
            epoch,
            raise_gaps: VecDeque::new(),
        }
    }

    /// `value` at step `e`: true when it raised the mark (the gap since the last raise is
    /// kept, after the first).
    pub fn raise(&mut self, e: u32, value: u64) -> bool {
        if value <= self.bytes {
            return false;
        }
        if self.bytes > 0 {
            if self.raise_gaps.len() == RAISE_GAPS {
                self.raise_gaps.pop_front();
            }
            self.raise_gaps.push_back(e.saturating_sub(self.epoch));
        }
        self.bytes = value;
        self.epoch = e;
        true
    }

    /// Starts again at step `e`, as if nothing had been seen.
    pub fn restart(&mut self, e: u32) {
        *self = HighWater::new(e);
    }

    /// The raise gaps kept (at most [`RAISE_GAPS`]).
    pub fn gaps_kept(&self) -> usize {
        self.raise_gaps.len()
    }

    /// The usual gap between raises ([`usual_gap`]).
    pub fn usual_gap(&self) -> f64 {
        usual_gap(&self.raise_gaps)
    }
}

/// One epoch boundary's sample.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub epoch: u32,
    pub live: u64,
    /// Distinct surviving generations (birth epochs after warm-up, at least `LAG` old).
    pub gens: u32,
    /// Live allocations at the boundary (the leak detector's; 0 where a detector does not
    /// count them).
    pub count: u64,
}

/// The first and last sample of the window a trend was measured on.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Window {
    pub from_step: u32,
    pub from_bytes: u64,
    pub to_step: u32,
    pub to_bytes: u64,
}

/// The last `SERIES` samples of a series, oldest first, always one slice (it derefs to
/// it). Pushed into a buffer of twice that whose older half is dropped when it fills: one
/// copy every `SERIES` pushes, instead of a ring's index arithmetic at every push and read
/// (each series takes a sample at every epoch boundary, and a tight loop found as the
/// iteration has one every few events).
#[derive(Clone, Debug)]
pub struct Series<T> {
    buf: Vec<T>,
}

impl<T> Default for Series<T> {
    fn default() -> Series<T> {
        Series {
            buf: Vec::with_capacity(2 * SERIES),
        }
    }
}

impl<T> Series<T> {
    /// Adds the newest sample; the oldest beyond `SERIES` is gone.
    pub fn push(&mut self, x: T) {
        if self.buf.len() == 2 * SERIES {
            self.buf.drain(..SERIES);
        }
        self.buf.push(x);
    }
}

impl<T> std::ops::Deref for Series<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.buf.len().saturating_sub(SERIES)..]
    }
}

/// The samples taken at or after epoch `since`, oldest first (a series is in epoch order:
/// found by bisection, as this runs for every series at every step).
pub fn since(series: &[Sample], since: u32) -> &[Sample] {
    &series[series.partition_point(|x| x.epoch < since)..]
}

/// The median of a detector's recent gaps between raises of its high-water mark (at most
/// [`RAISE_GAPS`] kept), without a heap allocation: it runs for every series at every step.
pub fn usual_gap(raise_gaps: &VecDeque<u32>) -> f64 {
    let mut g = [0.0f64; RAISE_GAPS];
    let n = raise_gaps.len().min(RAISE_GAPS);
    for (d, &x) in g
        .iter_mut()
        .zip(raise_gaps.iter().skip(raise_gaps.len() - n))
    {
        *d = f64::from(x);
    }
    median(&mut g[..n])
}

/// The passing window with the smallest p-value over `post`, the samples that count (oldest
/// first). `accept(start, trend)` adds the caller's condition; `start` is the window's first
/// index in `post`.
pub fn best_trend(
    post: &[Sample],
    accept: impl FnMut(usize, &Trend) -> bool,
) -> Option<(Trend, Window)> {
    best_trend_above(post, MIN_GROWTH, accept)
}

/// [`best_trend`] with another floor on the growth over the window than `MIN_GROWTH` (a
/// leak detector's rule for small leaks that other evidence makes certain).
pub fn best_trend_above(
    post: &[Sample],
    min_growth: f64,
    mut accept: impl FnMut(usize, &Trend) -> bool,
) -> Option<(Trend, Window)> {
    let k = post.len();
    let mut best: Option<(Trend, Window)> = None;
    let mut seen = 0;
    for w in WINDOWS {
        let n = w.min(k);
        if n < MIN_WINDOW || n == seen {
            continue;
        }
        seen = n;
        let start = k - n;
        let win = &post[start..];
        // A window that did not grow by `min_growth` cannot pass (`growth_bytes` below): the
        // statistics, quadratic in the window, are skipped. Most windows of most series are
        // flat, and a series per device and per site is tested at every step.
        if (win[n - 1].live as f64 - win[0].live as f64) < min_growth {
            continue;
        }
        let x: Vec<f64> = win.iter().map(|s| s.live as f64).collect();
        let mk = mann_kendall(&x);
        let Some(ts) = theil_sen(&x, mk.var, 0.95) else {
            continue;
        };
        let trend = Trend {
            window: n,
            mann_kendall_s: mk.s,
            z: mk.z,
            p_value: (mk.p * WINDOWS.len() as f64).min(1.0),
            slope_bytes_per_step: ts.slope,
            slope_ci: [ts.low, ts.high],
            growth_bytes: x[n - 1] - x[0],
            new_generations: win[n - 1].gens.saturating_sub(win[0].gens),
        };
        let passes = trend.p_value < ALPHA_LIKELY
            && trend.slope_bytes_per_step > 0.0
            && trend.growth_bytes >= min_growth
            && accept(start, &trend);
        if passes && best.is_none_or(|(b, _)| trend.p_value < b.p_value) {
            let window = Window {
                from_step: win[0].epoch,
                from_bytes: win[0].live,
                to_step: win[n - 1].epoch,
                to_bytes: win[n - 1].live,
            };
            best = Some((trend, window));
        }
    }
    best
}

/// Theil-Sen slopes of the two halves of the last [`HALVES`] samples (None with fewer): growth
/// whose second half is much slower than its first is a cache filling up.
pub fn halves(post: &[Sample]) -> Option<(f64, f64)> {
    let k = post.len();
    if k < HALVES {
        return None;
    }
    let mut x = [0.0f64; HALVES];
    for (d, s) in x.iter_mut().zip(&post[k - HALVES..]) {
        *d = s.live as f64;
    }
    let slope = |h: &[f64]| {
        // Flat: every pairwise slope is 0, so the median is (what theil_sen would return,
        // without its quadratic work; most series are flat most of the time).
        if h.iter().all(|&v| v == h[0]) {
            return Some(0.0);
        }
        theil_sen(h, mann_kendall(h).var, 0.95).map(|t| t.slope)
    };
    Some((slope(&x[..HALVES / 2])?, slope(&x[HALVES / 2..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn linear(n: u32, per_step: u64, gens: bool) -> Vec<Sample> {
        (0..n)
            .map(|i| Sample {
                epoch: i,
                live: u64::from(i) * per_step,
                gens: if gens { i } else { 0 },
                count: 0,
            })
            .collect()
    }

    #[test]
    fn the_longest_clean_window_wins_and_the_caller_has_the_last_word() {
        let post = linear(40, MIB, true);
        let (t, w) = best_trend(&post, |_, t| t.new_generations >= 3).unwrap();
        assert_eq!((t.window, w.from_step, w.to_step), (32, 8, 39));
        assert_eq!(t.slope_bytes_per_step, MIB as f64);
        assert!(best_trend(&post, |_, _| false).is_none());
        // Below 1 MiB of growth, or too few samples: nothing.
        assert!(best_trend(&linear(40, 1024, true), |_, _| true).is_none());
        assert!(best_trend(&linear(5, MIB, true), |_, _| true).is_none());
    }

    #[test]
    fn halves_see_growth_that_stops() {
        let mut post = linear(8, 2 * MIB, false);
        post.extend((8..16).map(|i| Sample {
            epoch: i,
            live: 16 * MIB,
            gens: 0,
            count: 0,
        }));
        let (b1, b2) = halves(&post).unwrap();
        assert!(b1 > 0.0 && b2 == 0.0, "{b1} {b2}");
        assert!(halves(&post[1..]).is_none());
    }
}
