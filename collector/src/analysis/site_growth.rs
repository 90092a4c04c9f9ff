//! Growth of one logical buffer: a call site whose live bytes grow step after step while its
//! allocations are replaced (reallocate-and-copy, `torch.cat` onto a growing tensor, a cache
//! resized to fit more). No single allocation survives three steps, so the leak detector
//! ([`super::growth`]), which counts surviving generations, never sees it; the memory that
//! one line holds still grows without bound (docs/detection.md, "Growth of one buffer").
//!
//! Per (site, device), O(1) per event and O(window) memory whatever the number of live
//! allocations: live bytes and count, frees, the largest allocation of the current epoch.
//! Once per epoch, for sites that are live or had events: one sample, the site's live bytes
//! at the boundary (the trough when markers sit after the step; an auto-detected boundary comes
//! before the anchor's allocation), so the moment a copy holds both the old and the new buffer
//! does not count unless a boundary falls inside it. Then the rules, on samples taken from the
//! end of warm-up on (growth during warm-up is warm-up):
//!
//! - **likely**: the shared trend test ([`super::window`]) over a window of at least
//!   [`MIN_SAMPLES`] samples, with ≥ 3 allocations freed at the site inside the window (they
//!   are replaced) and < 3 surviving generations among its live allocations born in the window
//!   (otherwise it is the leak detector's), and the site's high-water mark raised within its
//!   usual gap between raises (the last epoch for a buffer growing every step): it is still
//!   growing; and its buffers are replaced: in at least [`LARGER_SHARE`] of the window's
//!   steps that both allocated and freed there, the largest allocation was larger than the
//!   largest freed, and the window made at least one allocation per [`STEPS_PER_BUFFER`]
//!   steps for each allocation the site holds (a KV cache of 24 layers replaces its 24
//!   tensors every step). A cache that evicts (an LRU of 8 tables over a widening range of
//!   lengths) also allocates and frees in the same steps, and its bytes drift up with the
//!   sizes, but it makes one table now and then while it holds eight.
//! - **confirmed**: likely over ≥ 10 samples with p·3 < 0.001.
//! - **bounded** (reported as `growth` at `info`): second-half slope < ¼ of the first half over
//!   16 epochs. **resolved** (`growth`, `info`): the high-water mark has not moved for
//!   max(8, 3 × its usual gap) epochs, or a step boundary found the site holding nothing (it
//!   drained: a buffer reset between sequences). A buffer kept through the last step and freed
//!   only after it stays a leak ([`super::evidence::Fate`]).
//!
//! What keeps bounded buffers silent: one that grows for a few steps and stops is either still
//! in warm-up or flat before [`MIN_SAMPLES`] samples exist, and no longer rising when they do;
//! one that oscillates has no trend. A site the leak detector reports is never reported here
//! (one finding per site): [`super::Analysis`] hands that detector over at each boundary (read
//! only, as [`super::leaks::Leaks`]) and leaves this one's findings out for the sites it
//! reports.

use rustc_hash::FxHashMap;

use super::evidence::{
    drained_at, drained_clause, AtDetection, AtEnd, Class, LeakEvidence, LevelChange, Replaced,
};
use super::growth_finding::GrowthFinding;
use super::leaks::Leaks;
use super::stats;
use super::trend::{
    per_second, seconds, to_full, warmup_end, Trend, ALPHA_CONFIRMED, HISTORY, LAG,
};
use super::window::{self, HighWater, Sample, Series};
use super::{
    Alert, Alerts, AllocObs, Cause, Change, Confidence, Context, Detector, Evidence, Finding, Kind,
    Level, Severity,
};
use crate::model::SiteId;
use crate::units::{fmt_bytes, fmt_duration, fmt_rate};
use oomtrace_proto::{Api, MemoryClass};

/// Fewest samples (after warm-up) a trend is tested on: with no surviving generations to go
/// by, the live bytes alone must rise for longer than a warm-up or a bounded buffer does.
pub const MIN_SAMPLES: usize = 8;
/// Allocations freed at the site inside the window: its allocations are replaced.
const MIN_REPLACED: u64 = 3;
/// Surviving generations from which a site is the leak detector's.
const MAX_GENERATIONS: u32 = 3;
/// The share of a window's replacing steps whose new allocation was the larger one.
pub const LARGER_SHARE: f64 = 0.8;
/// Each allocation a growing buffer's site holds is replaced at least once per this many
/// steps, on average over the window.
pub const STEPS_PER_BUFFER: u64 = 4;

#[derive(Clone, Copy, Debug)]
struct Point {
    sample: Sample,
    /// Cumulative allocations and frees at the site at this boundary.
    allocs: u64,
    frees: u64,
    /// The largest allocation made at the site during the epoch that ended here.
    largest: u64,
    /// The least the site held during the epoch that ended here (its boundaries included).
    trough: u64,
    /// Cumulative steps that both allocated and freed at the site, and those of them whose
    /// largest allocation was larger than their largest free.
    replacing: u64,
    larger: u64,
}

#[derive(Debug)]
struct Site {
    live: u64,
    /// The least `live` since the last boundary.
    trough: u64,
    count: u64,
    allocs: u64,
    frees: u64,
    largest: u64,
    /// The largest allocation freed at the site during the current epoch.
    largest_freed: u64,
    replacing: u64,
    larger: u64,
    series: Series<Point>,
    /// Its live bytes' high-water mark.
    high: HighWater,
    first_epoch: u32,
    first_ts: u64,
    api: Api,
    dirty: bool,
    level: Option<Confidence>,
    max_level: Option<Confidence>,
    bounded: bool,
    resolved: bool,
    /// The step boundary that found none of its memory left (it drained, and is resolved);
    /// cleared once it grows past its high-water mark again.
    drained: Option<u32>,
    trend: Option<Trend>,
    replaced: Option<Replaced>,
    onset: Option<u32>,
    detected: Option<(u32, u64)>,
    at_detection: Option<AtDetection>,
    history: Vec<LevelChange>,
    /// The growth is the working set's: the site's bytes grow at the boundaries, but every
    /// step it frees all it held before (its troughs do not grow): not a leak.
    working_set: bool,
    /// It is the working set's because another line on its device is: it grows with the
    /// step's inputs (see [`SiteGrowthDetector::on_epoch_end_after_leaks`]).
    with_working_set: bool,
}

impl Site {
    fn new(a: &AllocObs) -> Site {
        Site {
            live: 0,
            trough: 0,
            count: 0,
            allocs: 0,
            frees: 0,
            largest: 0,
            largest_freed: 0,
            replacing: 0,
            larger: 0,
            series: Series::default(),
            high: HighWater::new(a.epoch),
            first_epoch: a.epoch,
            first_ts: a.ts_ns,
            api: a.api,
            dirty: true,
            level: None,
            max_level: None,
            bounded: false,
            resolved: false,
            drained: None,
            trend: None,
            replaced: None,
            onset: None,
            detected: None,
            at_detection: None,
            history: Vec::new(),
            working_set: false,
            with_working_set: false,
        }
    }

    fn usual_gap(&self) -> f64 {
        self.high.usual_gap()
    }

    fn reported(&self) -> bool {
        self.max_level >= Some(Confidence::Likely)
    }

    /// Found growing and still growing.
    fn growing(&self) -> bool {
        !self.resolved && !self.bounded && self.level >= Some(Confidence::Likely)
    }

    fn is_leak(&self) -> bool {
        !self.resolved
            && !self.bounded
            && !self.working_set
            && self.level >= Some(Confidence::Likely)
    }
}

#[derive(Debug, Default)]
pub struct SiteGrowthDetector {
    sites: FxHashMap<(SiteId, i16), Site>,
}

impl SiteGrowthDetector {
    /// Whether the site is reported as a leak now.
    pub fn is_leak(&self, site: SiteId, device: i16) -> bool {
        self.sites.get(&(site, device)).is_some_and(Site::is_leak)
    }

    /// The per-epoch rules. Runs after the leak detector's, whose findings it leaves alone and
    /// whose generations say whether a site's allocations survive; hence not
    /// [`Detector::on_epoch_end`], which sees only the context.
    pub fn on_epoch_end_after_leaks(
        &mut self,
        ctx: &Context<'_>,
        leaks: &impl Leaks,
        out: &mut Alerts,
    ) {
        let e = ctx.epoch;
        let warm = warmup_end(ctx);
        // The changes of this boundary, told once every site is judged (below).
        let mut changes: Vec<((SiteId, i16), Change)> = Vec::new();
        // Whether a site may be growing with a level now (below): only one with a level, or
        // one evaluated at this boundary, can be; with an epoch every few events (a tight
        // loop found as the iteration) most boundaries have neither.
        let mut leveled = false;
        for (&(site, device), s) in self.sites.iter_mut() {
            if !(s.dirty || s.count > 0 || s.level.is_some()) {
                continue;
            }
            leveled |= s.level.is_some();
            s.dirty = false;
            let freed = std::mem::take(&mut s.largest_freed);
            if s.largest > 0 && freed > 0 {
                s.replacing += 1;
                s.larger += u64::from(s.largest > freed);
            }
            s.series.push(Point {
                sample: Sample {
                    epoch: e,
                    live: s.live,
                    gens: 0,
                    count: s.count,
                },
                allocs: s.allocs,
                frees: s.frees,
                largest: std::mem::take(&mut s.largest),
                trough: std::mem::replace(&mut s.trough, s.live),
                replacing: s.replacing,
                larger: s.larger,
            });
            if s.high.raise(e, s.live) {
                s.resolved = false;
                s.drained = None;
            }
            // The cheap pre-filter: a site that did not rise, replaced nothing lately and is
            // not flagged has nothing new to test.
            let n = s.series.len();
            let rose = n >= 2 && s.series[n - 1].sample.live > s.series[n - 2].sample.live;
            let replacing = s.frees - s.series[0].frees >= MIN_REPLACED;
            if !(rose && replacing) && s.level.is_none() {
                continue;
            }
            // One finding per site: the leak detector's wins. (After the pre-filter, which
            // costs no lookup.)
            if leaks.reported(site, device) {
                continue;
            }
            leveled = true;
            let before = (s.level, s.bounded, s.resolved);
            let generations =
                |from: u32| leaks.generations(site, device, from.max(warm), e.saturating_sub(LAG));
            evaluate(s, e, warm, generations);
            let after = (s.level, s.bounded, s.resolved);
            if before == after {
                continue;
            }
            let resolved = s.resolved && !before.2;
            let downgraded = s.bounded && !before.1;
            let Some(change) = Change::between(before.0, s.level, resolved, downgraded) else {
                continue;
            };
            if change == Change::New && s.detected.is_none() {
                s.detected = Some((e, ctx.ts_ns));
                let per_step = s.trend.map_or(0.0, |t| t.slope_bytes_per_step);
                s.at_detection = Some(AtDetection {
                    step: e,
                    time_s: seconds(ctx, ctx.ts_ns),
                    level: s.level.map_or("likely", Confidence::name),
                    bytes: s.live,
                    count: s.count,
                    surviving_epochs: leaks.generations(site, device, warm, e.saturating_sub(LAG)),
                    slope_bytes_per_step: per_step,
                    slope_bytes_per_s: per_second(per_step, ctx),
                });
                // Where the growth began: the last time the site held its least.
                let min = s.series.iter().map(|p| p.sample.live).min().unwrap_or(0);
                s.onset = s
                    .series
                    .iter()
                    .rev()
                    .find(|p| p.sample.live == min)
                    .map(|p| p.sample.epoch);
            }
            let name = match change {
                Change::Resolved => "resolved",
                Change::Downgraded => "bounded",
                _ => s.level.map(Confidence::name).unwrap_or("none"),
            };
            if s.history.len() < HISTORY {
                s.history.push(LevelChange {
                    level: name,
                    step: e,
                    time_s: seconds(ctx, ctx.ts_ns),
                });
            }
            changes.push(((site, device), change));
        }
        // A line whose tensors are replaced by larger ones on a device whose working set grows
        // (a line there frees all it made every step: the step's inputs grow) grows with it:
        // the step's output or a tensor derived from the input, held until the next step
        // makes its successor. Not a leak either.
        let growing_sets: Vec<i16> = if leveled {
            self.sites
                .iter()
                .filter(|(_, s)| s.working_set && !s.with_working_set && s.growing())
                .map(|(&(_, device), _)| device)
                .collect()
        } else {
            Vec::new()
        };
        for (&key, s) in self.sites.iter_mut().filter(|_| !growing_sets.is_empty()) {
            if growing_sets.contains(&key.1)
                && !s.working_set
                && s.replaced.is_some()
                && s.growing()
            {
                s.working_set = true;
                s.with_working_set = true;
                if !changes.iter().any(|(k, _)| *k == key) {
                    // Told as a leak before: now it is growth.
                    changes.push((key, Change::Downgraded));
                }
            }
        }
        for ((site, device), change) in changes {
            let s = &self.sites[&(site, device)];
            if s.reported() {
                out.push(Alert {
                    finding: finding(site, device, s, ctx),
                    change,
                    epoch: e,
                    ts_ns: ctx.ts_ns,
                });
            }
        }
    }
}

impl Detector for SiteGrowthDetector {
    fn on_alloc(&mut self, a: &AllocObs, _out: &mut Alerts) {
        let s = self
            .sites
            .entry((a.site, a.device))
            .or_insert_with(|| Site::new(a));
        s.live = s.live.saturating_add(a.size);
        s.count += 1;
        s.allocs += 1;
        s.largest = s.largest.max(a.size);
        s.api = a.api;
        s.dirty = true;
    }

    fn on_free(&mut self, a: &AllocObs, _birth: u32) {
        let Some(s) = self.sites.get_mut(&(a.site, a.device)) else {
            return;
        };
        s.live = s.live.saturating_sub(a.size);
        s.trough = s.trough.min(s.live);
        s.count = s.count.saturating_sub(1);
        s.frees += 1;
        s.largest_freed = s.largest_freed.max(a.size);
        s.dirty = true;
    }

    /// Every site this detector reported; [`super::Analysis::findings`] leaves out those the
    /// leak detector reports.
    fn findings(&self, ctx: &Context<'_>) -> Vec<Finding> {
        let mut v: Vec<Finding> = self
            .sites
            .iter()
            .filter(|(_, s)| s.reported())
            .map(|(&(site, device), s)| finding(site, device, s, ctx))
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
        v
    }
}

/// The rules of the module comment at the end of epoch `e`; `generations(from)` counts the
/// site's surviving generations born from epoch `from` on.
fn evaluate(s: &mut Site, e: u32, warm: u32, generations: impl Fn(u32) -> u32) {
    // Nothing left at a step boundary: the buffer was given back while the program still ran
    // its steps (reset between sequences). No leak, whatever the trend that raised it. (A
    // working set frees what it made every step: that is its own finding's story.) It stays
    // resolved until it grows past its old peak (which clears `drained`).
    if s.drained.is_some() {
        return;
    }
    if s.reported() && !s.working_set && s.count == 0 && !s.resolved {
        s.resolved = true;
        s.drained = Some(e);
        s.level = None;
        return;
    }
    let points: Vec<Point> = s
        .series
        .iter()
        .copied()
        .filter(|p| p.sample.epoch >= warm)
        .collect();
    let post: Vec<Sample> = points.iter().map(|p| p.sample).collect();
    let k = post.len();
    if k < MIN_SAMPLES {
        return;
    }
    let last = points[k - 1];
    let mut gens_at_best = 0;
    let best = window::best_trend(&post, |start, t| {
        let first = points[start];
        let gens = generations(first.sample.epoch);
        let replacing = last.replacing - first.replacing;
        let larger = last.larger - first.larger;
        let steps = u64::from(last.sample.epoch.saturating_sub(first.sample.epoch)).max(1);
        let made = last.allocs - first.allocs;
        let pass = t.window >= MIN_SAMPLES
            && last.frees - first.frees >= MIN_REPLACED
            && gens < MAX_GENERATIONS
            && larger as f64 >= LARGER_SHARE * replacing as f64
            && made.saturating_mul(STEPS_PER_BUFFER) >= steps.saturating_mul(last.sample.count);
        if pass {
            gens_at_best = gens;
        }
        pass
    });
    let usual = s.usual_gap();
    let since_raise = e.saturating_sub(s.high.epoch);
    // Still growing at its own cadence: raised at the last boundary for a buffer that grows
    // every step. Looser than the leak detector's, which has surviving generations to go by.
    let rising = f64::from(since_raise) <= usual.max(1.0);
    let mut level = match best {
        Some((t, _)) if rising && t.window >= 10 && t.p_value < ALPHA_CONFIRMED => {
            Some(Confidence::Confirmed)
        }
        Some(_) if rising => Some(Confidence::Likely),
        _ => None,
    };
    if let Some((mut t, w)) = best.filter(|_| rising) {
        let start = k - t.window;
        s.working_set = s.with_working_set || working_set(&points[start..], t.slope_bytes_per_step);
        t.new_generations = gens_at_best;
        s.trend = Some(t);
        s.replaced = Some(Replaced {
            allocations_in_window: last.allocs - points[start].allocs,
            frees_in_window: last.frees - points[start].frees,
            largest_allocation_bytes: points[start + 1..]
                .iter()
                .map(|p| p.largest)
                .max()
                .unwrap_or(0),
            window: w,
        });
    }
    // Levels rise on evidence and fall only through the rules below.
    level = level.max(s.level);
    if s.reported() && f64::from(since_raise) > (3.0 * usual).max(8.0) {
        s.resolved = true;
        s.level = None;
        return;
    }
    if let Some((b1, b2)) = window::halves(&post) {
        if b1 > 0.0 && b2 < 0.25 * b1 {
            s.bounded = true;
        } else if s.bounded && b2 >= 0.25 * b1 && b2 > 0.0 {
            s.bounded = false;
        }
    }
    if s.bounded {
        level = None;
    }
    s.level = level;
    s.max_level = s.max_level.max(level);
}

/// Whether the growth over `window` (its boundaries' trend `slope` per step) is the working
/// set's: the least the site held within each step (after the window's first) grows by less
/// than a quarter of that, or not at all (Mann-Kendall p ≥ 0.05). A buffer replaced by a larger
/// one holds the old one until the new one exists, so its troughs grow with it (a KV cache);
/// a step's tensors freed before the next step's are made drop to the same floor every step.
fn working_set(window: &[Point], slope: f64) -> bool {
    let troughs: Vec<f64> = window.iter().skip(1).map(|p| p.trough as f64).collect();
    if troughs.len() < 3 || slope <= 0.0 {
        return false;
    }
    let mk = stats::mann_kendall(&troughs);
    let trough_slope = stats::theil_sen(&troughs, mk.var, 0.95).map_or(0.0, |t| t.slope);
    mk.p >= 0.05 || trough_slope < 0.25 * slope
}

/// The cause, by what the site allocates: tensors (`--torch`) or plain CUDA memory.
fn hint(s: &Site, kind: Kind) -> (Cause, String) {
    if s.with_working_set {
        return (
            Cause::WorkingSetGrowing,
            "Not a leak: this line's tensors are replaced by larger ones every step while the \
             step's inputs grow (another line's tensors grow and are all freed every step): a \
             tensor derived from the input, or the step's output held until the next step \
             makes its successor. It grows with the working set; cap or bucket the input \
             sizes."
                .into(),
        );
    }
    if s.working_set {
        return (
            Cause::WorkingSetGrowing,
            "Not a leak: every step frees what this line allocated, but each step needs more \
             than the last (a longer sequence, a larger batch, a growing input): the working \
             set grows, and with it the peak. It ends where the inputs stop growing, or in an \
             out-of-memory error: cap or bucket the input sizes (pad to a few lengths), or \
             split the step (gradient accumulation)."
                .into(),
        );
    }
    if kind == Kind::Growth {
        return (
            Cause::CacheFilling,
            "One buffer here was re-allocated larger step after step, then stopped growing: \
             a buffer sized to the largest input so far or a cache filling up to its \
             capacity, not a leak."
                .into(),
        );
    }
    // Tensors: through the pluggable allocator (`--torch=swap`) or PyTorch's trace tracker.
    let what = if s.api == Api::oomtrace_malloc || s.api.memory_class() == MemoryClass::Tensor {
        "a tensor rebuilt larger every step: torch.cat onto a growing tensor (a KV cache, a \
         history or a running buffer extended by concatenation), so each step allocates the \
         whole, slightly larger tensor and frees the previous one. Preallocate it at its \
         maximum size and write into a slice, keep a fixed window (cat, then slice back), or \
         reset it between sequences."
    } else {
        "a buffer re-allocated larger every step (a realloc-and-copy, a buffer resized to fit \
         more, a pool growing by larger chunks) that nothing ever shrinks. Cap its size, or \
         reset it when the work it holds is done."
    };
    (
        Cause::ReplacedButGrowing,
        format!(
            "The allocations made here are freed and replaced step after step, yet the bytes \
             this call site holds keep growing: {what}"
        ),
    )
}

fn finding(site: SiteId, device: i16, s: &Site, ctx: &Context<'_>) -> Finding {
    let per_step = s.trend.map(|t| t.slope_bytes_per_step);
    let per_s = per_step.and_then(|b| per_second(b, ctx));
    let end = AtEnd::new(
        s.live,
        s.count,
        s.series.last().map(|p| (p.sample.epoch, p.sample.live)),
        ctx.ended,
    );
    // Where it drained, when a boundary found nothing left (see [`evaluate`]; a working set
    // frees what it made every step and is worded as one).
    let drained = drained_at(
        s.drained,
        end.fate,
        s.high.epoch,
        s.series.iter().map(|p| (p.sample.epoch, p.sample.live)),
    )
    .filter(|_| !s.working_set);
    let kind = if s.resolved
        || drained.is_some()
        || s.bounded
        || s.working_set
        || s.level < Some(Confidence::Likely)
    {
        Kind::Growth
    } else {
        Kind::Leak
    };
    let level = if s.working_set && !(s.resolved || s.bounded) {
        // Still growing: it ends in an out-of-memory error unless the inputs stop growing.
        Level::Severity(Severity::Warning)
    } else if kind == Kind::Growth {
        Level::INFO
    } else {
        s.level.unwrap_or(Confidence::Likely).into()
    };
    let (steps_to_oom, time_to_oom_s) = match (per_step, ctx.devices.get(&device)) {
        (Some(b), Some(d)) if b > 0.0 && kind == Kind::Leak && s.count > 0 => {
            to_full(b, d.live_bytes, d.capacity, ctx)
        }
        _ => (None, None),
    };
    let onset = s.onset.unwrap_or(s.first_epoch);
    let (last_step, last_step_bytes) = s
        .series
        .last()
        .map_or((0, 0), |p| (p.sample.epoch, p.sample.live));
    let rate = per_step
        .map(|b| fmt_rate(b, per_s))
        .unwrap_or_else(|| "growing".into());
    let replaced = s.replaced.map_or(String::new(), |r| {
        format!(
            "; over steps {}-{} its {} allocation{} each freed and replaced by another (the \
             largest {})",
            r.window.from_step + 1,
            r.window.to_step,
            r.allocations_in_window,
            if r.allocations_in_window == 1 {
                " was"
            } else {
                "s were"
            },
            fmt_bytes(r.largest_allocation_bytes)
        )
    });
    let end_text = if let Some(kept) = end.freed_after_last_step().filter(|_| kind == Kind::Leak) {
        // A leak: never "all of it was freed" beside its level (docs/findings.md).
        kept
    } else if s.count > 0 {
        format!(
            "by the end {} held in {} allocation{}",
            fmt_bytes(s.live),
            s.count,
            if s.count == 1 { "" } else { "s" }
        )
    } else {
        format!(
            "by the end all of it was freed{} ({} held at step {})",
            if ctx.ended { " (at exit)" } else { "" },
            fmt_bytes(last_step_bytes),
            last_step
        )
    };
    let message = match (kind, &s.at_detection) {
        (Kind::Leak, Some(d)) => format!(
            "one buffer's bytes grow {} when detected at step {} ({} into the run): {} held \
             then{}; {end_text}",
            fmt_rate(d.slope_bytes_per_step, d.slope_bytes_per_s),
            d.step,
            fmt_duration(d.time_s),
            fmt_bytes(d.bytes),
            replaced
        ),
        (Kind::Leak, None) => format!("one buffer's bytes grow {rate}{replaced}; {end_text}"),
        _ if s.with_working_set && !(s.resolved || s.bounded) => format!(
            "grows with the working set {rate}: its tensors are replaced by larger ones every \
             step (the largest {} in the last step); {end_text}",
            fmt_bytes(s.series.last().map_or(0, |p| p.largest))
        ),
        _ if s.working_set && !(s.resolved || s.bounded) => format!(
            "the working set grows {rate}: every step frees what it allocated here, but each \
             step needs more (the largest {} in the last step); {end_text}",
            fmt_bytes(s.series.last().map_or(0, |p| p.largest))
        ),
        _ if drained.is_some() => format!(
            "one buffer grew ({rate}) {}",
            drained_clause(
                s.high.bytes,
                s.high.epoch,
                drained.unwrap_or_default(),
                s.live
            )
        ),
        _ if s.resolved => format!(
            "one buffer grew ({rate}) and then stopped for {} steps; {} held now",
            ctx.epoch.saturating_sub(s.high.epoch),
            fmt_bytes(s.live)
        ),
        _ => format!(
            "one buffer grew ({rate}) but the growth is slowing down; {} held now",
            fmt_bytes(s.live)
        ),
    };
    let (cause, hint) = if drained.is_some() {
        (Cause::Drained, super::advice::DRAINED_HINT.to_string())
    } else {
        hint(s, kind)
    };
    let (peak_step, peak_bytes) = (s.high.epoch, s.high.bytes);
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
        steps: Some(u64::from(ctx.epoch.saturating_sub(onset))),
        message,
        cause,
        hint,
        evidence: Evidence::Leak(Box::new(LeakEvidence {
            class: if kind == Kind::Leak {
                Class::Leak
            } else {
                Class::Bounded
            },
            trend: s.trend,
            slope_bytes_per_s: per_s,
            surviving_epochs: s.trend.map_or(0, |t| t.new_generations),
            live_count: s.count,
            first_seen_step: s.first_epoch,
            first_seen_s: seconds(ctx, s.first_ts),
            onset_step: onset,
            onset_s: ctx.clock.start_of(onset).map(|t| seconds(ctx, t)),
            detected_step: s.detected.map(|d| d.0),
            detected_s: s.detected.map(|d| seconds(ctx, d.1)),
            steps_to_oom,
            time_to_oom_s,
            samples: s.series.iter().map(|p| p.sample.live).collect(),
            history: s.history.clone(),
            at_detection: s.at_detection,
            peak_bytes,
            peak_step,
            at_end: end,
            python_lines: Vec::new(),
            cache_grew_at: Vec::new(),
            replaced: s.replaced,
            small: None,
            kept: None,
        })),
    }
    .finding()
}

#[cfg(test)]
mod tests;
