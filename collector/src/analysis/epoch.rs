//! Epochs: the iterations a leak is measured in (docs/detection.md).
//!
//! One clock per process, fed in stream order, deterministic, so a live collector and a
//! replay of its trace agree on every boundary. Sources, best first:
//! 1. **Markers** (`oomtrace_mark`): each marker ends an epoch. Once one is seen, markers rule.
//! 2. **Auto**: an *anchor* call site that allocates once per iteration. Per site, the last
//!    8 gaps between its allocations (counted in allocation events) are kept (a warm-up
//!    outlier ages out, which an all-time variance would never forget); a site with ≥ 5 gaps
//!    and a coefficient of variation < 0.1 over them locks, and each
//!    of its allocations then starts an epoch. A site allocating inside an inner loop
//!    (layers) shows a large CV as soon as one iteration boundary falls between its gaps, so
//!    it never qualifies after the first iteration. An anchor is re-validated at each of its
//!    allocations with an exponentially weighted CV of its recent gaps; above 0.3, or when it
//!    stops allocating (a burst that looked regular), it is dropped for good and windows take
//!    over until another anchor locks. Epochs before the clock became stable count as warm-up
//!    (`stable_since`), so the false epochs of a wrong first lock never make a leak.
//! 3. **Windows**: without either, a boundary every `WINDOW_ALLOCS` allocations.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::SiteId;

/// Allocation events before windows are used while no anchor has locked.
const PATIENCE_ALLOCS: u64 = 4096;
/// Allocations per fixed window.
const WINDOW_ALLOCS: u64 = 1024;
const ANCHOR_MIN_GAPS: u64 = 5;
const ANCHOR_MAX_CV: f64 = 0.1;
/// A site allocating in a tight loop (period 1) says nothing about iterations.
const ANCHOR_MIN_PERIOD: f64 = 2.0;
/// Weight of the newest gap in the anchor's running mean and variance.
const ANCHOR_EWMA: f64 = 0.2;
/// Recent-gap CV above which the anchor is dropped.
const ANCHOR_DROP_CV: f64 = 0.3;
/// An anchor silent for this many periods is dropped.
const ANCHOR_SILENT_PERIODS: f64 = 8.0;
/// Epoch start times kept (for onset times).
const STARTS_KEPT: usize = 4096;
/// Epoch durations kept for the median.
const DURATIONS_KEPT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochSource {
    /// No boundary yet.
    None,
    Markers,
    Auto,
    Windows,
}

impl EpochSource {
    pub fn name(self) -> &'static str {
        match self {
            EpochSource::None => "none",
            EpochSource::Markers => "markers",
            EpochSource::Auto => "auto",
            EpochSource::Windows => "windows",
        }
    }
}

const GAPS_KEPT: usize = 8;

#[derive(Clone, Debug, Default)]
struct Gaps {
    last: u64,
    /// The last gaps, a ring.
    ring: [u32; GAPS_KEPT],
    n: u64,
    /// Σ device live bytes at this site's allocations: the candidate nearest the trough wins.
    live_sum: f64,
    seen: u64,
}

impl Gaps {
    fn push(&mut self, gap: u64) {
        self.ring[(self.n % GAPS_KEPT as u64) as usize] = gap.min(u64::from(u32::MAX)) as u32;
        self.n += 1;
    }

    fn recent(&self) -> &[u32] {
        &self.ring[..(self.n as usize).min(GAPS_KEPT)]
    }

    fn mean(&self) -> f64 {
        let r = self.recent();
        if r.is_empty() {
            return 0.0;
        }
        r.iter().map(|&g| f64::from(g)).sum::<f64>() / r.len() as f64
    }

    fn cv(&self) -> f64 {
        let r = self.recent();
        let m = self.mean();
        if r.len() < 2 || m <= 0.0 {
            return f64::INFINITY;
        }
        let var = r.iter().map(|&g| (f64::from(g) - m).powi(2)).sum::<f64>() / (r.len() - 1) as f64;
        var.sqrt() / m
    }

    fn qualifies(&self) -> bool {
        self.n >= ANCHOR_MIN_GAPS && self.mean() >= ANCHOR_MIN_PERIOD && self.cv() < ANCHOR_MAX_CV
    }
}

#[derive(Debug)]
pub struct EpochClock {
    pub source: EpochSource,
    /// The current epoch; allocations now are born in it.
    pub epoch: u32,
    allocs: u64,
    gaps: FxHashMap<SiteId, Gaps>,
    anchor: Option<(SiteId, f64)>,
    /// The anchor's recent gaps: EWMA mean, variance, count, and its last allocation.
    recent: (f64, f64, u32, u64),
    /// The epoch since which the current source has been stable: earlier epochs are warm-up.
    pub stable_since: u32,
    disqualified: FxHashSet<SiteId>,
    window_start: u64,
    /// (epoch, start timestamp) of recent epochs.
    starts: VecDeque<(u32, u64)>,
    durations: VecDeque<u64>,
    first_ts: u64,
}

impl Default for EpochClock {
    fn default() -> Self {
        EpochClock {
            source: EpochSource::None,
            epoch: 0,
            allocs: 0,
            gaps: FxHashMap::default(),
            anchor: None,
            recent: (0.0, 0.0, 0, 0),
            stable_since: 0,
            disqualified: FxHashSet::default(),
            window_start: 0,
            starts: VecDeque::new(),
            durations: VecDeque::new(),
            first_ts: 0,
        }
    }
}

impl EpochClock {
    /// A step marker: returns true (a boundary) always; markers take over from then on.
    pub fn on_marker(&mut self, ts: u64) -> bool {
        if self.source != EpochSource::Markers {
            self.stable_since = self.epoch + 1;
        }
        self.source = EpochSource::Markers;
        self.anchor = None;
        self.gaps = FxHashMap::default();
        self.advance(ts);
        true
    }

    /// An allocation at `site`. Returns true if an epoch boundary falls just before it (the
    /// allocation is then born in the new epoch).
    pub fn on_alloc(&mut self, site: SiteId, ts: u64, device_live: u64) -> bool {
        if self.first_ts == 0 {
            self.first_ts = ts;
        }
        self.allocs += 1;
        if self.source == EpochSource::Markers {
            return false;
        }
        let idx = self.allocs;
        let mut boundary = false;
        if site.0 != 0 && !self.disqualified.contains(&site) {
            let g = self.gaps.entry(site).or_default();
            g.seen += 1;
            g.live_sum += device_live as f64;
            if g.seen > 1 {
                let gap = (idx - g.last) as f64;
                g.push(idx - g.last);
                if let Some((anchor, _)) = self.anchor {
                    if anchor == site {
                        let (m, v, n, _) = self.recent;
                        let d = gap - m;
                        let m = m + ANCHOR_EWMA * d;
                        let v = (1.0 - ANCHOR_EWMA) * (v + ANCHOR_EWMA * d * d);
                        self.recent = (m, v, n + 1, idx);
                        if n + 1 >= 2 && v.sqrt() / m > ANCHOR_DROP_CV {
                            self.drop_anchor(idx);
                        } else {
                            boundary = true;
                        }
                    }
                } else if g.qualifies() {
                    self.lock(site);
                    boundary = self.anchor.is_some_and(|(a, _)| a == site);
                }
            }
            if let Some(g) = self.gaps.get_mut(&site) {
                g.last = idx;
            }
        }
        if let Some((_, period)) = self.anchor {
            let silent = idx - self.recent.3;
            if silent as f64 > ANCHOR_SILENT_PERIODS * period {
                self.drop_anchor(idx);
            }
        }
        if self.anchor.is_none() {
            if self.source == EpochSource::None && self.allocs >= PATIENCE_ALLOCS {
                self.source = EpochSource::Windows;
                self.window_start = idx;
            }
            if self.source == EpochSource::Windows && idx - self.window_start >= WINDOW_ALLOCS {
                self.window_start = idx;
                boundary = true;
            }
        }
        if boundary {
            self.advance(ts);
        }
        boundary
    }

    /// Locks the best qualifying anchor, `trigger` being one that just qualified: among all
    /// qualified sites with about the longest period, the one seen at the lowest live bytes.
    fn lock(&mut self, trigger: SiteId) {
        let longest = self
            .gaps
            .iter()
            .filter(|(s, g)| g.qualifies() && !self.disqualified.contains(s))
            .map(|(_, g)| g.mean())
            .fold(0.0, f64::max);
        let best = self
            .gaps
            .iter()
            .filter(|(s, g)| {
                g.qualifies() && !self.disqualified.contains(s) && g.mean() >= 0.9 * longest
            })
            .min_by(|(sa, a), (sb, b)| {
                (a.live_sum / a.seen as f64)
                    .total_cmp(&(b.live_sum / b.seen as f64))
                    .then(sa.cmp(sb))
            })
            .map(|(s, g)| (*s, g.mean()))
            .unwrap_or((trigger, self.gaps[&trigger].mean()));
        self.anchor = Some(best);
        let last = self.gaps.get(&best.0).map_or(self.allocs, |g| g.last);
        self.recent = (best.1, 0.0, 0, last);
        self.source = EpochSource::Auto;
        self.stable_since = self.epoch + 1;
    }

    fn drop_anchor(&mut self, idx: u64) {
        if let Some((site, _)) = self.anchor.take() {
            self.disqualified.insert(site);
            self.gaps.remove(&site);
        }
        self.source = EpochSource::Windows;
        self.window_start = idx;
        self.stable_since = self.epoch + 1;
    }

    fn advance(&mut self, ts: u64) {
        let start = self.starts.back().map(|&(_, t)| t).unwrap_or(self.first_ts);
        if start != 0 && ts >= start {
            self.durations.push_back(ts - start);
            if self.durations.len() > DURATIONS_KEPT {
                self.durations.pop_front();
            }
        }
        self.epoch += 1;
        self.starts.push_back((self.epoch, ts));
        if self.starts.len() > STARTS_KEPT {
            self.starts.pop_front();
        }
    }

    /// When `epoch` began (ns), if still remembered; epoch 0 began with the first event.
    pub fn start_of(&self, epoch: u32) -> Option<u64> {
        if epoch == 0 {
            return (self.first_ts != 0).then_some(self.first_ts);
        }
        let front = self.starts.front()?.0;
        let i = epoch.checked_sub(front)? as usize;
        self.starts.get(i).map(|&(_, t)| t)
    }

    /// Median epoch duration in seconds over recent epochs.
    pub fn median_duration_s(&self) -> Option<f64> {
        if self.durations.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.durations.iter().map(|&d| d as f64 / 1e9).collect();
        Some(super::stats::median(&mut v))
    }

    /// The anchor's period in allocation events, when auto-detected.
    pub fn period_allocs(&self) -> Option<f64> {
        self.anchor.map(|(_, p)| p)
    }

    pub fn anchor(&self) -> Option<SiteId> {
        self.anchor.map(|(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One iteration: a layer loop of 12 allocations at one site, then 5 distinct sites.
    fn iteration(clock: &mut EpochClock, ts: &mut u64) -> u32 {
        let mut boundaries = 0;
        for _ in 0..12 {
            *ts += 10;
            boundaries += u32::from(clock.on_alloc(SiteId(1), *ts, 0));
        }
        for s in 2..7 {
            *ts += 10;
            boundaries += u32::from(clock.on_alloc(SiteId(s), *ts, 0));
        }
        boundaries
    }

    #[test]
    fn locks_on_the_iteration_not_the_layer_loop() {
        let mut c = EpochClock::default();
        let mut ts = 1;
        let mut per_iter = Vec::new();
        for _ in 0..30 {
            per_iter.push(iteration(&mut c, &mut ts));
        }
        assert_eq!(c.source, EpochSource::Auto);
        assert_eq!(c.period_allocs(), Some(17.0));
        assert_ne!(c.anchor(), Some(SiteId(1)));
        assert!(per_iter[10..].iter().all(|&b| b == 1), "{per_iter:?}");
    }

    #[test]
    fn markers_take_over() {
        let mut c = EpochClock::default();
        let mut ts = 1;
        for _ in 0..10 {
            iteration(&mut c, &mut ts);
        }
        let before = c.epoch;
        assert!(c.on_marker(ts));
        for _ in 0..5 {
            assert_eq!(iteration(&mut c, &mut ts), 0);
        }
        assert_eq!((c.source, c.epoch), (EpochSource::Markers, before + 1));
    }

    #[test]
    fn aperiodic_streams_fall_back_to_windows() {
        let mut c = EpochClock::default();
        let mut x: u64 = 88172645463325252;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.on_alloc(SiteId((x % 500) as u32 + 1), i + 1, 0);
        }
        assert_eq!(c.source, EpochSource::Windows);
        assert!(c.epoch >= 14, "{}", c.epoch);
    }

    #[test]
    fn a_changed_phase_drops_the_anchor() {
        let mut c = EpochClock::default();
        let mut ts = 1;
        for _ in 0..10 {
            iteration(&mut c, &mut ts);
        }
        let anchor = c.anchor().unwrap();
        // The anchor now allocates every 3 iterations' worth of events.
        for _ in 0..4 {
            for _ in 0..50 {
                ts += 1;
                c.on_alloc(SiteId(99), ts, 0);
            }
            ts += 1;
            c.on_alloc(anchor, ts, 0);
        }
        assert_ne!(c.anchor(), Some(anchor));
    }
}
