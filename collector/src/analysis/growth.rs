//! Leaks: call sites whose memory keeps surviving, one new generation per epoch
//! (docs/detection.md; the thresholds are checked on the labeled corpus, tests/src/corpus.rs).
//!
//! Per (site, device), O(1) per event: live bytes and count, live allocations by birth epoch
//! ("generations"), live sizes. Once per epoch, for sites that are live or had events: one
//! sample (live bytes at the boundary, which is the trough when markers sit after the
//! optimizer step), then the rules:
//!
//! - **suspected**: ≥ 3 new surviving generations in the last 4 epochs and live bytes rose in
//!   ≥ 3 of the last 4 transitions.
//! - **likely**: over a window of 8, 16 or 32 epochs (at least 6 samples), Mann-Kendall
//!   p·3 < 0.01 (Bonferroni over the three scales), a positive Theil-Sen slope, ≥ 1 MiB of
//!   growth, ≥ 3 new surviving generations inside the window and ≥ 3 more live allocations at
//!   its end than at its start (a cache that evicts holds new generations too, never more
//!   allocations).
//! - **confirmed**: likely over ≥ 10 samples with p·3 < 0.001, and the high-water mark still
//!   being raised at the site's own cadence.
//! - **small but steady** (`likely` at most, `evidence.small`): a leak whose growth stays
//!   under the 1 MiB floor over every window (`losses.append(loss)`: 512 B a step) is found
//!   when each of the last [`STEADY_STEPS`] steps left allocations that survive, the live bytes
//!   rose at each of them, and none of the site's allocations born since warm-up was ever
//!   freed: the same trend test without the floor then decides. It never reaches `confirmed`
//!   (what `--fail-on-leak` gates on) on this rule alone, and its words say how small it is: the
//!   allocations kept a step, the bytes a step, and what that reaches after 10^6 steps.
//! - **kept, never freed** (`likely` at least, `evidence.kept`): allocations that keep
//!   arriving however irregularly and however the rate thins, none ever freed, are a leak
//!   judged on what the site holds, not on a slope: since warm-up, none of its allocations
//!   was freed, at least [`KEPT_STEPS`] steps left survivors there, spread over at least
//!   [`KEPT_SPAN`] steps, adding up to the 1 MiB floor, and the last one came no longer ago
//!   than the site's quiet limit: max(8, twice its longest gap between two such steps, half
//!   the steps over which they came). A memo cache of tensors keyed by input shape
//!   (`functools.lru_cache` over sequence lengths from a widening range) is this; its words
//!   say so when every live size is distinct.
//! - **downgrades**: growth that slows down (second-half slope < ¼ of the first half over 16
//!   epochs: a bounded cache filling up), or growth made of sizes never live twice (a cache
//!   keyed by shape) is capped at suspected, unless the site is kept and never freed (above);
//!   a site whose high-water mark has not moved for max(8, 3 × its usual gap) epochs (and, for
//!   a site that never freed anything, its quiet limit) is resolved, and so is one that a step
//!   boundary finds holding nothing (it drained: the program gave its memory back while it
//!   still ran).
//!   Memory kept through the last step and freed only after it (a cleanup before exit, an
//!   interpreter's teardown) leaves a leak a leak ([`super::evidence::Fate`]).
//!
//! Warm-up: trends use only samples taken since the epoch clock became stable, and the first
//! `WARMUP` epochs after that never count as generations, so lazily created optimizer state, autotuning and the first eval are
//! one-offs, never leaks. Levels only rise on evidence and only fall through a downgrade or
//! resolution, so a finding does not flap with noise.

use rustc_hash::FxHashMap;

use super::advice::{trace_tensors, DRAINED_HINT};
use super::births::{Births, ByStep};
use super::evidence::{
    drained_at, drained_clause, end_clause, held_in, AtDetection, AtEnd, Class, KeptLeak,
    LeakEvidence, LevelChange, SmallLeak, SMALL_PROJECTION_STEPS,
};
use super::growth_finding::GrowthFinding;
use super::leaks::{GrewAt, Leaks};
use super::trend::{
    per_second, seconds, to_full, warmup_end, Trend, ALPHA_CONFIRMED, HISTORY, LAG, MIN_GROWTH,
    WARMUP,
};
use super::window::{self, HighWater, Sample, Series};
use super::{
    Alert, Alerts, AllocObs, Cause, Change, Confidence, Context, Detector, Evidence, Finding, Kind,
    Level,
};
use crate::model::SiteId;
use crate::units::{fmt_bytes, fmt_duration, fmt_rate};
use oomtrace_proto::{Api, MemoryClass};

const MAX_SIZES: usize = 4096;
/// Steps in a row, after warm-up, that must each leave allocations that survive (and none
/// freed) for a leak under the trend's floor of growth to be one: twice the shortest trend
/// window, as the bytes alone say little.
pub const STEADY_STEPS: usize = 16;
/// Steps (after warm-up) that must have left survivors at a site that never freed anything
/// for the kept rule to call it a leak (module comment).
pub const KEPT_STEPS: u32 = 6;
/// The fewest steps those must be spread over: a warm-up that allocates in a few steps in a
/// row, then never again, is not a leak.
pub const KEPT_SPAN: u32 = 12;
/// Steps whose survivors a leaking site keeps at each boundary ([`ByStep`]): what tells the
/// analysis which leaks are kept by one object.
const BY_STEP: u32 = 16;

#[derive(Debug)]
pub(crate) struct Site {
    live: u64,
    count: u64,
    births: Births,
    sizes: LiveSizes,
    series: Series<Sample>,
    /// Its live bytes' high-water mark.
    high: HighWater,
    first_epoch: u32,
    first_ts: u64,
    api: Api,
    dirty: bool,
    level: Option<Confidence>,
    max_level: Option<Confidence>,
    class: Class,
    resolved: bool,
    /// The step boundary that found none of its memory left (it drained, and is resolved);
    /// cleared once it grows past its high-water mark again.
    drained: Option<u32>,
    detected: Option<(u32, u64)>,
    at_detection: Option<AtDetection>,
    trend: Option<Trend>,
    history: Vec<LevelChange>,
    /// The latest birth epoch among the allocations freed here (none yet: None).
    freed_birth: Option<u32>,
    /// Set while the level rests on the rule for small steady leaks alone.
    small: Option<SmallLeak>,
    /// Its live allocations by birth step at the last boundary, once it was reported.
    by_step: ByStep,
    /// The step boundaries that found a new surviving generation here (after warm-up).
    arrivals: Arrivals,
    /// Set while the kept rule holds (module comment).
    kept: Option<KeptLeak>,
    /// The kept rule alone makes it a leak now (no trend passes): its words say how it holds.
    kept_only: bool,
}

/// The step boundaries at which a site's count of surviving generations rose: when its kept
/// allocations arrived, however irregularly.
#[derive(Clone, Copy, Debug, Default)]
struct Arrivals {
    first: Option<u32>,
    last: u32,
    count: u32,
    longest_gap: u32,
}

impl Arrivals {
    fn arrived(&mut self, e: u32) {
        match self.first {
            None => self.first = Some(e),
            Some(_) => self.longest_gap = self.longest_gap.max(e.saturating_sub(self.last)),
        }
        self.last = e;
        self.count = self.count.saturating_add(1);
    }

    /// The steps they came over.
    fn span(&self) -> u32 {
        self.first.map_or(0, |f| self.last.saturating_sub(f))
    }

    /// How long none may arrive before the growth counts as stopped: relative to how they
    /// came (module comment).
    fn quiet_limit(&self) -> u32 {
        self.longest_gap
            .saturating_mul(2)
            .max(self.span() / 2)
            .max(8)
    }
}

impl Site {
    fn new(a: &AllocObs) -> Site {
        Site {
            live: 0,
            count: 0,
            births: Births::default(),
            sizes: LiveSizes::default(),
            series: Series::default(),
            high: HighWater::new(a.epoch),
            first_epoch: a.epoch,
            first_ts: a.ts_ns,
            api: a.api,
            dirty: true,
            level: None,
            max_level: None,
            class: Class::Leak,
            resolved: false,
            drained: None,
            detected: None,
            at_detection: None,
            trend: None,
            history: Vec::new(),
            freed_birth: None,
            small: None,
            by_step: ByStep::default(),
            arrivals: Arrivals::default(),
            kept: None,
            kept_only: false,
        }
    }

    fn generations(&self, from: u32, upto: u32) -> u32 {
        self.births.generations(from, upto)
    }

    /// Share of live allocations whose size no other live allocation here has.
    fn distinct_size_share(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sizes.unique() as f64 / self.count as f64
    }

    fn usual_gap(&self) -> f64 {
        self.high.usual_gap()
    }
}

/// Live allocations by size, for at most `MAX_SIZES` sizes at once. A size whose last live
/// allocation is freed keeps its entry, at 0, until the table holds twice `MAX_SIZES` entries:
/// a loop that allocates and frees one size costs no insertion and removal per event.
#[derive(Debug, Default)]
struct LiveSizes {
    counts: FxHashMap<u64, u32>,
    /// Entries above 0.
    live: usize,
}

impl LiveSizes {
    /// An allocation of `size`: counted if the size is live already or fewer than
    /// `MAX_SIZES` sizes are.
    fn add(&mut self, size: u64) {
        match self.counts.get_mut(&size) {
            Some(c) if *c > 0 => *c += 1,
            Some(c) => {
                if self.live < MAX_SIZES {
                    *c = 1;
                    self.live += 1;
                }
            }
            None => {
                if self.live < MAX_SIZES {
                    if self.counts.len() >= 2 * MAX_SIZES {
                        self.counts.retain(|_, c| *c > 0);
                    }
                    self.counts.insert(size, 1);
                    self.live += 1;
                }
            }
        }
    }

    /// A free of an allocation of `size` (not counted if its size was not).
    fn remove(&mut self, size: u64) {
        if let Some(c) = self.counts.get_mut(&size).filter(|c| **c > 0) {
            *c -= 1;
            if *c == 0 {
                self.live -= 1;
            }
        }
    }

    /// Sizes with exactly one live allocation.
    fn unique(&self) -> usize {
        self.counts.values().filter(|&&c| c == 1).count()
    }
}

#[derive(Debug, Default)]
pub struct GrowthDetector {
    pub(crate) sites: FxHashMap<(SiteId, i16), Site>,
}

/// What the other growth detectors may read of this one ([`Leaks`]'s docs say what each is).
impl Leaks for GrowthDetector {
    fn born_between(&self, device: i16, from: u32, upto: u32) -> Vec<GrewAt> {
        if upto < from {
            return Vec::new();
        }
        let mut v: Vec<GrewAt> = self
            .sites
            .iter()
            .filter(|((_, d), s)| *d == device && s.count > 0)
            .filter_map(|(&(site, _), s)| {
                let (bytes, count) = s.births.born_between(from, upto);
                (count > 0).then_some(GrewAt { site, bytes, count })
            })
            .collect();
        v.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
        v
    }

    fn leaks_on(&self, device: i16) -> (u32, f64) {
        self.sites
            .iter()
            .filter(|(&(site, d), _)| d == device && self.is_leak(site, d))
            .fold((0, 0.0), |(n, slope), (_, s)| {
                (
                    n + 1,
                    slope + s.trend.map_or(0.0, |t| t.slope_bytes_per_step),
                )
            })
    }

    fn reported(&self, site: SiteId, device: i16) -> bool {
        self.sites
            .get(&(site, device))
            .is_some_and(|s| s.max_level >= Some(Confidence::Likely))
    }

    fn generations(&self, site: SiteId, device: i16, from: u32, upto: u32) -> u32 {
        self.sites
            .get(&(site, device))
            .map_or(0, |s| s.generations(from, upto))
    }
}

impl GrowthDetector {
    /// Whether the site is reported as a leak now.
    pub fn is_leak(&self, site: SiteId, device: i16) -> bool {
        self.sites.get(&(site, device)).is_some_and(|s| {
            !s.resolved && s.class == Class::Leak && s.level >= Some(Confidence::Likely)
        })
    }

    /// The sites reported as leaks now, each with its device and its live allocations by
    /// birth step at the last step boundary: what the analysis reads to tell leaks kept by one
    /// object. By device, then site.
    pub fn leaks_by_step(&self) -> Vec<(SiteId, i16, &ByStep)> {
        let mut v: Vec<(SiteId, i16, &ByStep)> = self
            .sites
            .iter()
            .filter(|(_, s)| {
                !s.resolved && s.class == Class::Leak && s.level >= Some(Confidence::Likely)
            })
            .map(|(&(site, d), s)| (site, d, &s.by_step))
            .collect();
        v.sort_unstable_by_key(|&(site, d, _)| (d, site));
        v
    }

    /// The finding of one site now, if it has one.
    pub fn finding_of(&self, site: SiteId, device: i16, ctx: &Context<'_>) -> Option<Finding> {
        self.sites
            .get(&(site, device))
            .filter(|s| s.max_level >= Some(Confidence::Likely))
            .map(|s| finding(site, device, s, ctx))
    }
}

impl Detector for GrowthDetector {
    fn on_alloc(&mut self, a: &AllocObs, _out: &mut Alerts) {
        let s = self
            .sites
            .entry((a.site, a.device))
            .or_insert_with(|| Site::new(a));
        s.live = s.live.saturating_add(a.size);
        s.count += 1;
        s.api = a.api;
        s.dirty = true;
        s.births.add(a.epoch, a.size);
        s.sizes.add(a.size);
    }

    fn on_free(&mut self, a: &AllocObs, birth: u32) {
        let Some(s) = self.sites.get_mut(&(a.site, a.device)) else {
            return;
        };
        s.live = s.live.saturating_sub(a.size);
        s.count = s.count.saturating_sub(1);
        s.dirty = true;
        s.births.remove(birth, a.size);
        s.sizes.remove(a.size);
        s.freed_birth = s.freed_birth.max(Some(birth));
    }

    fn on_epoch_end(&mut self, ctx: &Context<'_>, out: &mut Alerts) {
        let e = ctx.epoch;
        let warm = warmup_end(ctx);
        for (&(site, device), s) in self.sites.iter_mut() {
            if !(s.dirty || s.count > 0 || s.level.is_some()) {
                continue;
            }
            s.dirty = false;
            let gens = s.generations(warm, e.saturating_sub(LAG));
            if s.series.last().is_some_and(|x| gens > x.gens) {
                s.arrivals.arrived(e);
            }
            s.series.push(Sample {
                epoch: e,
                live: s.live,
                gens,
                count: s.count,
            });
            if s.high.raise(e, s.live) {
                s.resolved = false;
                s.drained = None;
            }
            // The cheap pre-filter (research §5.3): a site that did not rise, gained no
            // surviving generation and is not flagged has nothing new to test.
            let n = s.series.len();
            let rose = n >= 2
                && (s.series[n - 1].live > s.series[n - 2].live
                    || s.series[n - 1].gens > s.series[n - 2].gens);
            if !rose && s.level.is_none() {
                continue;
            }
            let before = (s.level, s.class, s.resolved);
            evaluate(s, e, ctx.clock.stable_since);
            if s.max_level >= Some(Confidence::Likely) {
                let upto = e.saturating_sub(LAG);
                s.by_step = s
                    .births
                    .by_step(e, warm.max(upto.saturating_sub(BY_STEP - 1)), upto);
            }
            let after = (s.level, s.class, s.resolved);
            if before == after {
                continue;
            }
            let resolved = s.resolved && !before.2;
            let downgraded = s.class != Class::Leak && before.1 == Class::Leak;
            let Some(change) = Change::between(before.0, s.level, resolved, downgraded) else {
                continue;
            };
            if change == Change::New && s.detected.is_none() {
                s.detected = Some((e, ctx.ts_ns));
                let per_step = per_step_of(s).unwrap_or(0.0);
                s.at_detection = Some(AtDetection {
                    step: e,
                    time_s: seconds(ctx, ctx.ts_ns),
                    level: s.level.map_or("likely", Confidence::name),
                    bytes: s.live,
                    count: s.count,
                    surviving_epochs: s.generations(warm, e.saturating_sub(LAG)),
                    slope_bytes_per_step: per_step,
                    slope_bytes_per_s: per_second(per_step, ctx),
                });
            }
            let name = match change {
                Change::Resolved => "resolved",
                _ => s.level.map(Confidence::name).unwrap_or("none"),
            };
            if s.history.len() < HISTORY {
                s.history.push(LevelChange {
                    level: name,
                    step: e,
                    time_s: seconds(ctx, ctx.ts_ns),
                });
            }
            if s.max_level >= Some(Confidence::Likely) {
                out.push(Alert {
                    finding: finding(site, device, s, ctx),
                    change,
                    epoch: e,
                    ts_ns: ctx.ts_ns,
                });
            }
        }
    }

    fn findings(&self, ctx: &Context<'_>) -> Vec<Finding> {
        let mut v: Vec<Finding> = self
            .sites
            .iter()
            .filter(|(_, s)| s.max_level >= Some(Confidence::Likely))
            .map(|(&(site, device), s)| finding(site, device, s, ctx))
            .collect();
        // Leaks by confidence, then growth that is not one (`info`).
        let confidence = |f: &Finding| match f.level {
            Level::Confidence(c) => Some(c),
            Level::Severity(_) => None,
        };
        v.sort_by(|a, b| {
            confidence(b)
                .cmp(&confidence(a))
                .then(b.bytes.cmp(&a.bytes))
                .then(a.site.cmp(&b.site))
        });
        v
    }
}

/// The rules of the module comment, at the end of epoch `e`.
fn evaluate(s: &mut Site, e: u32, stable_since: u32) {
    // Nothing left at a step boundary: the program gave the memory back while it still ran
    // its steps (a backlog that drained), whatever the trend that raised it. No leak; and it
    // stays resolved until it grows past its old peak (which clears `drained`), however the
    // old trend still reads.
    if s.drained.is_some() {
        return;
    }
    if s.max_level >= Some(Confidence::Likely) && s.count == 0 && !s.resolved {
        s.resolved = true;
        s.drained = Some(e);
        s.level = None;
        return;
    }
    let post = window::since(&s.series, stable_since);
    let k = post.len();
    if k < 5 {
        return;
    }
    let last = post[k - 1];
    let rises = post[k - 5..]
        .windows(2)
        .filter(|w| w[1].live > w[0].live)
        .count();
    let suspected = last.gens.saturating_sub(post[k - 5].gens) >= 3 && rises >= 3;
    // Survivors accumulate in a leak: its live allocations rise with its generations. A
    // bounded cache that evicts (an LRU of 8 tables over a widening range of lengths) keeps
    // new generations too, and its bytes drift up with the sizes, but it holds as many
    // allocations as it always did.
    let best = window::best_trend(post, |start, t| {
        t.new_generations >= 3 && post[k - 1].count >= post[start].count.saturating_add(3)
    })
    .map(|(t, _)| t);
    // Under the trend's floor of growth, a steady survivor every step is evidence enough
    // that it is a leak, however small (the module comment, "small but steady").
    let warm = stable_since + WARMUP;
    let small = match best {
        None if steady(s, post, warm) => {
            window::best_trend_above(post, 1.0, |_, t| t.new_generations >= 3).map(|(t, _)| t)
        }
        _ => None,
    };
    let kept = kept(s, e, warm);
    let kept_trend = match (best, small, kept) {
        (None, None, Some(_)) => {
            window::best_trend_above(post, 1.0, |_, t| t.new_generations >= 1).map(|(t, _)| t)
        }
        _ => None,
    };
    let usual = s.usual_gap();
    let since_raise = e.saturating_sub(s.high.epoch);
    let mut level = match best {
        Some(t)
            if t.window >= 10
                && t.p_value < ALPHA_CONFIRMED
                && f64::from(since_raise) <= (2.0 * usual).max(2.0) =>
        {
            Some(Confidence::Confirmed)
        }
        Some(_) => Some(Confidence::Likely),
        None if small.is_some() || kept.is_some() => Some(Confidence::Likely),
        None if suspected => Some(Confidence::Suspected),
        None => None,
    };
    if let Some(t) = best.or(small).or(kept_trend) {
        s.trend = Some(t);
    }
    s.kept = kept;
    s.kept_only = kept.is_some() && best.is_none() && small.is_none();
    if best.is_some() {
        s.small = None;
    } else if let Some(t) = small {
        let upto = e.saturating_sub(LAG);
        let (_, count) = s.births.born_between(warm, upto);
        let steps = s.generations(warm, upto).max(1);
        s.small = Some(SmallLeak {
            allocations_per_step: count as f64 / f64::from(steps),
            bytes_per_step: t.slope_bytes_per_step,
            after_million_steps_bytes: t.slope_bytes_per_step * SMALL_PROJECTION_STEPS,
        });
    }
    // Levels rise on evidence and fall only through the rules below.
    level = level.max(s.level);
    // Stopped: quiet for longer than its usual gap between raises, and, where nothing was
    // ever freed, longer than its own arrivals allow (how they grew, however they thinned).
    let mut quiet_limit = (3.0 * usual).max(8.0);
    if never_freed(s, warm) {
        quiet_limit = quiet_limit.max(f64::from(s.arrivals.quiet_limit()));
    }
    if s.max_level >= Some(Confidence::Likely) && f64::from(since_raise) > quiet_limit {
        s.resolved = true;
        s.level = None;
        s.kept = None;
        return;
    }
    if kept.is_some() {
        // Kept and never freed, still arriving: slowing down or new sizes only are how such a
        // leak looks (a cache keyed by shape that is never evicted), not a bound.
        s.class = Class::Leak;
    } else {
        if let Some((b1, b2)) = window::halves(post) {
            if b1 > 0.0 && b2 < 0.25 * b1 {
                s.class = Class::Bounded;
            } else if s.class == Class::Bounded && b2 >= 0.25 * b1 && b2 > 0.0 {
                s.class = Class::Leak;
            }
        }
        if s.count >= 4 && s.distinct_size_share() >= 0.8 {
            s.class = Class::ShapeKeyed;
        }
    }
    if s.class != Class::Leak {
        level = level.min(Some(Confidence::Suspected));
    }
    s.level = level;
    s.max_level = s.max_level.max(level);
}

/// None of the site's allocations born since warm-up (`warm`) was ever freed.
fn never_freed(s: &Site, warm: u32) -> bool {
    s.freed_birth.is_none_or(|b| b < warm)
}

/// The kept rule (module comment), at the end of epoch `e`: what the site holds, if it is a
/// leak by it.
fn kept(s: &Site, e: u32, warm: u32) -> Option<KeptLeak> {
    let a = &s.arrivals;
    if !never_freed(s, warm) || a.count < KEPT_STEPS || a.span() < KEPT_SPAN {
        return None;
    }
    let since_last = e.saturating_sub(a.last);
    if since_last > a.quiet_limit() {
        return None;
    }
    let (bytes, allocations) = s.births.born_between(warm, e.saturating_sub(LAG));
    if (bytes as f64) < MIN_GROWTH {
        return None;
    }
    Some(KeptLeak {
        allocations,
        bytes,
        steps_with_survivors: a.count,
        over_steps: a.span(),
        longest_gap_steps: a.longest_gap,
        steps_since_last: since_last,
        quiet_limit_steps: a.quiet_limit(),
        one_per_distinct_size: s.count >= 4 && s.distinct_size_share() >= 0.8,
    })
}

/// Whether each of the last [`STEADY_STEPS`] steps left allocations here that survive, the
/// live bytes rose at each of them, and none of the site's allocations born since warm-up
/// (`warm`) was ever freed: the rule for small steady leaks.
fn steady(s: &Site, post: &[Sample], warm: u32) -> bool {
    let k = post.len();
    k > STEADY_STEPS
        && s.freed_birth.is_none_or(|b| b < warm)
        && post[k - 1 - STEADY_STEPS..]
            .windows(2)
            .all(|w| w[1].live > w[0].live && w[1].gens > w[0].gens)
}

/// What became of the site's memory, from its last step-boundary sample and its live bytes now.
fn at_end(s: &Site, ctx: &Context<'_>) -> AtEnd {
    let last = s.series.last().map(|x| (x.epoch, x.live));
    AtEnd::new(s.live, s.count, last, ctx.ended)
}

/// Its rate: the trend's, else what the kept rule measured.
fn per_step_of(s: &Site) -> Option<f64> {
    s.trend
        .map(|t| t.slope_bytes_per_step)
        .or_else(|| s.kept.map(|k| k.bytes_per_step()))
}

fn finding(site: SiteId, device: i16, s: &Site, ctx: &Context<'_>) -> Finding {
    let per_step = per_step_of(s);
    let per_s = per_step.and_then(|b| per_second(b, ctx));
    let onset = s.births.oldest().unwrap_or(s.first_epoch);
    let end = at_end(s, ctx);
    // A projection to a full device only while the site still holds memory: one whose memory
    // is all gone will not fill anything.
    let (steps_to_oom, time_to_oom_s) = match (per_step, ctx.devices.get(&device)) {
        (Some(b), Some(d)) if b > 0.0 && !s.resolved && s.count > 0 => {
            to_full(b, d.live_bytes, d.capacity, ctx)
        }
        _ => (None, None),
    };
    let drained = drained_at(
        s.drained,
        end.fate,
        s.high.epoch,
        s.series.iter().map(|x| (x.epoch, x.live)),
    );
    let kind = if s.resolved
        || drained.is_some()
        || s.class != Class::Leak
        || s.level < Some(Confidence::Likely)
    {
        Kind::Growth
    } else {
        Kind::Leak
    };
    let level = if kind == Kind::Growth {
        Level::INFO
    } else {
        s.level.unwrap_or(Confidence::Suspected).into()
    };
    let steps = u64::from(ctx.epoch.saturating_sub(onset));
    let rate = per_step
        .map(|b| fmt_rate(b, per_s))
        .unwrap_or_else(|| "growing".into());
    let message = match (kind, s.resolved, s.class, &s.at_detection) {
        // All of it freed while the steps went on: what it grew to, and when it was gone.
        (Kind::Growth, _, _, _) if drained.is_some() => format!(
            "grew ({rate}) {}",
            drained_clause(
                s.high.bytes,
                s.high.epoch,
                drained.unwrap_or_default(),
                s.live
            )
        ),
        // A small leak says how small first: what a step keeps, what it reaches in a long job.
        (Kind::Leak, _, _, Some(d)) if s.small.is_some() => format!(
            "{}; when detected at step {} ({} into the run): {}; {}",
            s.small.map(|m| m.words(unit(s.api))).unwrap_or_default(),
            d.step,
            fmt_duration(d.time_s),
            held_in(d.bytes, d.count, d.surviving_epochs),
            end_clause(&end)
        ),
        // Found on what it holds: what it kept first (a cache keyed by shape says so).
        (Kind::Leak, _, _, Some(d))
            if s.kept_only || s.kept.is_some_and(|k| k.one_per_distinct_size) =>
        {
            format!(
                "{}; {} when detected at step {} ({} into the run): {}; {}",
                s.kept.map(|k| k.words(unit(s.api))).unwrap_or_default(),
                fmt_rate(d.slope_bytes_per_step, d.slope_bytes_per_s),
                d.step,
                fmt_duration(d.time_s),
                held_in(d.bytes, d.count, d.surviving_epochs),
                end_clause(&end)
            )
        }
        // What was seen when it was detected, then what became of it: memory freed at exit
        // after the last step must not turn the evidence into "0 B held".
        (Kind::Leak, _, _, Some(d)) => format!(
            "{} when detected at step {} ({} into the run): {}; {}",
            fmt_rate(d.slope_bytes_per_step, d.slope_bytes_per_s),
            d.step,
            fmt_duration(d.time_s),
            held_in(d.bytes, d.count, d.surviving_epochs),
            end_clause(&end)
        ),
        (Kind::Leak, _, _, None) => format!(
            "{rate}, {}",
            held_in(
                s.live,
                s.count,
                s.generations(warmup_end(ctx), ctx.epoch.saturating_sub(LAG))
            )
        ),
        (_, true, _, _) => format!(
            "grew ({rate}) and then stopped for {} steps; {} held now",
            ctx.epoch.saturating_sub(s.high.epoch),
            fmt_bytes(s.live)
        ),
        (_, _, Class::ShapeKeyed, _) => format!(
            "grew ({rate}) with allocations of sizes never live twice; {} held in {} allocations",
            fmt_bytes(s.live),
            s.count
        ),
        _ => format!(
            "grew ({rate}) but the growth is slowing down; {} held now",
            fmt_bytes(s.live)
        ),
    };
    let (cause, hint) = hint(s, kind, drained.is_some());
    GrowthFinding {
        kind,
        level,
        device,
        site,
        bytes: s.live,
        count: s.count,
        api: Some(s.api),
        per_step,
        per_s,
        steps: Some(steps),
        message,
        cause,
        hint,
        evidence: Evidence::Leak(Box::new(LeakEvidence {
            class: s.class,
            trend: s.trend,
            slope_bytes_per_s: per_s,
            surviving_epochs: s.generations(warmup_end(ctx), ctx.epoch.saturating_sub(LAG)),
            live_count: s.count,
            first_seen_step: s.first_epoch,
            first_seen_s: seconds(ctx, s.first_ts),
            onset_step: onset,
            onset_s: ctx.clock.start_of(onset).map(|t| seconds(ctx, t)),
            detected_step: s.detected.map(|d| d.0),
            detected_s: s.detected.map(|d| seconds(ctx, d.1)),
            steps_to_oom,
            time_to_oom_s,
            samples: s.series.iter().map(|x| x.live).collect(),
            history: s.history.clone(),
            at_detection: s.at_detection,
            peak_bytes: s.high.bytes,
            peak_step: s.high.epoch,
            at_end: end,
            python_lines: Vec::new(),
            cache_grew_at: Vec::new(),
            replaced: None,
            small: s.small.filter(|_| kind == Kind::Leak),
            kept: s.kept.filter(|_| kind == Kind::Leak),
        })),
    }
    .finding()
}

/// A leak at a plain CUDA allocation outside PyTorch's allocator. The hints of leaks say what
/// the steps do ("not freed from one step to the next"), never "never freed": a leak that its
/// program frees at exit is one too.
pub const NATIVE_HINT: &str = "Device memory allocated here with the CUDA API is not freed \
    from one step to the next, outside PyTorch's caching allocator: a CUDA extension or library \
    (CuPy, NCCL, a custom kernel's workspace) misses a cudaFree on some path, or keeps a buffer \
    per step.";

/// A leak at a segment of PyTorch's caching allocator (its frames are in libc10_cuda).
pub const TORCH_CACHE_HINT: &str = concat!(
    "These are PyTorch's caching-allocator segments, not tensors: the cache keeps reserving \
     new ones here because the tensors it holds keep growing: Python keeps a reference across \
     steps (a list that gets .append(output), `total_loss += loss` keeping each step's graph); \
     store .detach() or .item(). ",
    trace_tensors!()
);

/// What one allocation at a site is called in words: a tensor under PyTorch.
fn unit(api: Api) -> &'static str {
    match api {
        Api::oomtrace_malloc | Api::oomtrace_torch_alloc => "tensor",
        _ => "allocation",
    }
}

/// A small steady leak of tensors: the textbook one.
pub const SMALL_TENSORS_HINT: &str = "A few small tensors from every step are kept and none is \
    ever freed: typically a per-step scalar kept as a tensor (`losses.append(loss)`, a metric \
    accumulated in a list). Keep `loss.item()` (or `loss.detach()`) instead. Small as it is, it \
    grows with every step without end.";

/// A cache keyed by shape that is never evicted, still growing.
pub const SHAPE_CACHE_HINT: &str = "Every allocation here has a size no other live one has, and \
    none was ever freed: a cache keyed by input shape or sequence length (functools.lru_cache \
    with maxsize=None around a function that builds a tensor per length, a dict of per-shape \
    tables) that is never evicted. It grows with the number of distinct shapes, and new ones keep \
    coming: bound it (lru_cache(maxsize=N)), or pad inputs to a few lengths.";

/// The likely cause. What the site's API says is certain; what lies above it is a guess and
/// is worded as one. `drained`: all its memory was freed while the program still ran.
fn hint(s: &Site, kind: Kind, drained: bool) -> (Cause, String) {
    if kind == Kind::Growth && drained {
        return (Cause::Drained, DRAINED_HINT.into());
    }
    if kind == Kind::Leak && s.small.is_some() && unit(s.api) == "tensor" {
        return (Cause::TensorsKept, SMALL_TENSORS_HINT.into());
    }
    if kind == Kind::Leak && s.kept.is_some_and(|k| k.one_per_distinct_size) {
        return (Cause::ShapeKeyedCache, SHAPE_CACHE_HINT.into());
    }
    if kind == Kind::Growth {
        return match (s.resolved, s.class) {
            (_, Class::ShapeKeyed) => (
                Cause::ShapeKeyedCache,
                "Every live allocation here has a size no other has: a cache keyed by shape or \
                 sequence length (rotary tables, per-shape workspaces or CUDA graphs). It grows \
                 with the number of distinct shapes, not with steps."
                    .into(),
            ),
            _ => (
                Cause::CacheFilling,
                "The growth stopped: a cache filling up to its capacity (an LRU, per-shape \
                 graphs, a warm-up pool), not a leak. If it is too large, cap the cache."
                    .into(),
            ),
        };
    }
    match s.api {
        Api::oomtrace_malloc | Api::oomtrace_torch_alloc => (
            Cause::TensorsKept,
            "Tensors allocated here survive every step: Python keeps a reference across \
             iterations (a list that gets .append(output), a running total `total_loss += loss` \
             that keeps each step's graph, outputs kept for logging). Store .detach() or .item() \
             instead, or clear the container."
                .into(),
        ),
        Api::cuMemCreate => (
            Cause::VmmNeverReleased,
            concat!(
                "Physical memory created through the CUDA virtual-memory API is not \
                released from one step to the next (cuMemCreate without \
                cuMemRelease/cuMemUnmap): PyTorch's expandable segments growing with its cache, \
                or NCCL/another library mapping new buffers each step. Under PyTorch these are \
                its cache's segments, not tensors: ",
                trace_tensors!()
            )
            .into(),
        ),
        Api::cuMemAllocAsync | Api::cudaMallocAsync | Api::cuMemAllocFromPoolAsync => (
            Cause::AsyncNeverFreed,
            "Stream-ordered allocations (cudaMallocAsync) made here are not returned with \
             cudaFreeAsync from one step to the next: memory allocated outside PyTorch's \
             tensors (an extension or library), or a PyTorch cache growing under the \
             cudaMallocAsync backend."
                .into(),
        ),
        api if api.memory_class() == MemoryClass::HostPinned => (
            Cause::PinnedNeverFreed,
            "Pinned host memory allocated here is not freed from one step to the next \
             (cudaHostAlloc/cudaMallocHost without cudaFreeHost): data loader or staging \
             buffers kept per step."
                .into(),
        ),
        _ => (Cause::NativeLeak, NATIVE_HINT.into()),
    }
}

#[cfg(test)]
mod tests;
