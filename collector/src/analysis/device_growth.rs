//! Device growth: a process whose CUDA memory on one device keeps rising step after step,
//! whoever allocates it.
//!
//! Why a second view beside the per-site leaks of [`super::growth`]: without `--torch`, the
//! events are PyTorch's caching-allocator segments, and which call reserves the next segment
//! is whichever finds the cache exhausted (the `torch.empty` on the main thread one step, a
//! cuBLAS workspace on the autograd thread the next). A leak of tensors is then spread over
//! several call sites, none of which may grow steadily enough on its own, while the device's
//! total grows as steadily as the leak. This detector watches that total.
//!
//! Per device (GPU devices only; pinned host memory is not "CUDA memory grows"), O(1) per
//! event: live allocations by birth epoch ("generations"). Once per epoch: one sample (the
//! device's live bytes at the boundary), then the rules of the leak detector, on the same
//! thresholds and the same warm-up, so the two never disagree about what a trend is:
//!
//! - **likely**: over a window of 8, 16 or 32 epochs (at least 6 samples since the epoch
//!   clock became stable), Mann-Kendall p·3 < 0.01, a positive Theil-Sen slope, ≥ 1 MiB of
//!   growth and ≥ 3 new surviving generations (birth epochs ≥ `WARMUP` epochs after the clock
//!   became stable, at least `LAG` epochs old) inside the window.
//! - **confirmed**: likely over ≥ 10 samples with p·3 < 0.001, and the high-water mark still
//!   being raised at the device's own cadence.
//! - **bounded** (reported at `info`, never printed as growth): second-half slope < ¼ of the
//!   first half over 16 epochs: a cache filling up. **resolved** (`info`): the high-water mark
//!   has not moved for max(8, 3 × its usual gap) epochs, or a step boundary found the device
//!   back where its trend window began (it drained: the program gave the memory back while it
//!   still ran). Memory kept through the last step and freed only at exit leaves the finding
//!   as it was, without a forecast: nothing is left to fill the device.
//!
//! What keeps clean loops silent: a warm-up that grows then plateaus has its growth in
//! generations before the warm-up ends (never counted) and no trend after; a periodic eval that
//! rises and comes back leaves no surviving generation and no trend (and the high-water mark is
//! taken on the median of the last three samples, so one spike does not stand in for growth);
//! dynamic shapes that cycle make the caching allocator reserve for each new shape only until
//! it has seen them all: one or two generations, then a plateau.
//!
//! Which lines made it grow: while the finding stands, the allocations on the device born in
//! the trend window (after warm-up) and still live are taken per call site from the leak
//! detector's generations; the report turns them into `python_lines` (innermost user
//! Python frame, or one bucket per kind of thread without Python frames).
//!
//! With leaks: device growth is always reported, as the process-level view. When the leak
//! findings on the same device grow at ≥ 80 % of the device's rate, they explain it: the
//! message says so in a clause and the hint points to them instead of repeating their cause.

use serde::Serialize;

use super::advice::trace_tensors;
use super::births::Births;
use super::evidence::{AtDetection, LevelChange};
use super::growth_finding::GrowthFinding;
use super::leaks::{GrewAt, Leaks};
use super::trend::{
    per_second, seconds, to_full, warmup_end, Trend, ALPHA_CONFIRMED, HISTORY, LAG,
};
pub use super::window::Window;
use super::window::{self, HighWater, Sample, Series};
use super::{
    Alert, Alerts, AllocObs, Cause, Change, Confidence, Context, Detector, Evidence, Finding, Kind,
    Level, PythonLine,
};
use crate::units::{fmt_bytes, fmt_rate};
use oomtrace_proto::{Api, MemoryClass};

/// Leaks on the device growing at this share of the device's rate explain its growth.
const EXPLAINED_SHARE: f64 = 0.8;
/// Call sites kept per device for `python_lines` (largest first; lines aggregate them).
const MAX_GREW_AT: usize = 64;

/// The leak findings on the same device, beside the device's growth.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LeaksOnDevice {
    pub leaks: u32,
    /// The sum of their slopes.
    pub slope_bytes_per_step: f64,
    /// That sum over the device's slope.
    pub share: f64,
    /// They grow at ≥ 80 % of the device's rate: they are this growth.
    pub explained: bool,
}

/// What the events on a device are, which is what its growth is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Events {
    /// PyTorch allocating each tensor through oomtrace_malloc (`--torch`, `oomtrace.install()`).
    Tensors,
    /// PyTorch's caching-allocator segments: no tensor-level events, and the stacks pass
    /// through PyTorch's CUDA library or the program is Python (set by the report).
    Segments,
    /// Plain CUDA allocations.
    Allocations,
}

impl Events {
    /// What one of them is called in text.
    pub fn unit(self) -> &'static str {
        match self {
            Events::Segments => "segment",
            Events::Tensors | Events::Allocations => "allocation",
        }
    }

    /// How the text introduces the lines that made the device grow.
    pub fn grew_at(self) -> &'static str {
        match self {
            Events::Segments => "cache grew at",
            Events::Tensors | Events::Allocations => "grew at",
        }
    }
}

/// The evidence of a device_growth finding in the JSON report.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceGrowthEvidence {
    /// What the events on this device are: `tensors`, `segments` or `allocations`.
    pub events: Events,
    /// PyTorch's tensors were traced one by one beside these events (`--torch`).
    pub tensors_traced: bool,
    pub trend: Option<Trend>,
    pub slope_bytes_per_s: Option<f64>,
    pub window: Option<Window>,
    /// Distinct steps after warm-up whose allocations are still live on the device.
    pub surviving_epochs: u32,
    /// The oldest step after warm-up with a live allocation on the device.
    pub onset_step: u32,
    pub detected_step: Option<u32>,
    pub detected_s: Option<f64>,
    /// When the device would be full at this rate; none once it ran out of memory.
    pub steps_to_oom: Option<f64>,
    pub time_to_oom_s: Option<f64>,
    /// Live bytes on the device at the last step boundaries, oldest first.
    pub samples: Vec<u64>,
    pub history: Vec<LevelChange>,
    /// The evidence when the finding was first raised: the device's live bytes and
    /// allocations then.
    pub at_detection: Option<AtDetection>,
    /// The highest live bytes at a step boundary, and that step.
    pub peak_bytes: u64,
    pub peak_step: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaks_on_device: Option<LeaksOnDevice>,
    /// The lines whose allocations made the device grow over the window (filled in by
    /// the report; empty when the process has no Python frames).
    pub python_lines: Vec<PythonLine>,
    /// The call sites behind `python_lines`, raw.
    #[serde(skip)]
    pub grew_at: Vec<GrewAt>,
}

#[derive(Debug, Default)]
struct DeviceSeries {
    births: Births,
    series: Series<Sample>,
    /// The epoch clock's `stable_since` the high-water mark was measured under.
    stable_since: u32,
    /// High-water mark of the median of the last three samples since the clock became
    /// stable, and when it was raised.
    /// Its level's high-water mark.
    high: HighWater,
    /// The epoch of the first sample of the latest run of equal samples: the series is flat
    /// from there on (the epoch fast path in [`evaluate`]).
    flat_from: u32,
    /// The highest sample, and its step.
    peak: (u64, u32),
    /// oomtrace_malloc allocations were seen: events are tensors, not segments.
    tensors: bool,
    /// PyTorch's trace tracker reported tensors on this device (`--torch`): the series is
    /// made of its segments, and its tensors are traced beside them.
    traced_tensors: bool,
    level: Option<Confidence>,
    max_level: Option<Confidence>,
    bounded: bool,
    /// The step boundary that first found the growth slowing down (`bounded`): from then on
    /// it is judged on the samples since, so that only new growth raises it again (the old
    /// window, re-read once the slow part left the halves, made findings flip every few
    /// steps). Cleared while a leak on the device makes it grow.
    judged_from: Option<u32>,
    resolved: bool,
    /// The step boundary that found the device back where its trend window began, and its
    /// live bytes then (it drained, and is resolved); cleared once it grows past its
    /// high-water mark again.
    drained: Option<(u32, u64)>,
    trend: Option<Trend>,
    window: Option<Window>,
    detected: Option<(u32, u64)>,
    at_detection: Option<AtDetection>,
    history: Vec<LevelChange>,
    /// The highest level printed live, and the last change printed.
    printed_level: Option<Confidence>,
    last_printed: Option<Change>,
    grew_at: Vec<GrewAt>,
    leaks: Option<LeaksOnDevice>,
}

impl DeviceSeries {
    fn generations(&self, from: u32, upto: u32) -> u32 {
        self.births.generations(from, upto)
    }

    fn usual_gap(&self) -> f64 {
        self.high.usual_gap()
    }

    /// The median of the last three samples since `stable_since`: one spike (an eval step) is
    /// not a new level.
    fn smoothed(&self, stable_since: u32) -> u64 {
        let mut last = [0u64; 3];
        let mut n = 0;
        for s in self
            .series
            .iter()
            .rev()
            .take_while(|s| s.epoch >= stable_since)
            .take(3)
        {
            last[n] = s.live;
            n += 1;
        }
        let last = &mut last[..n];
        last.sort_unstable();
        last.get(last.len() / 2).copied().unwrap_or(0)
    }

    fn reported(&self) -> bool {
        self.max_level >= Some(Confidence::Likely)
    }

    /// Whether a change is news for the live output. A total that rises and falls in cycles
    /// (a cache emptied on each out-of-memory retry) would otherwise print a line per cycle:
    /// after a resolution or downgrade only a confirmed rise is printed again, and one "it
    /// stopped" line stands for all until then. The report's history keeps every change.
    fn worth_printing(&self, change: Change) -> bool {
        let quiet = matches!(
            self.last_printed,
            Some(Change::Resolved | Change::Downgraded)
        );
        match change {
            Change::New | Change::Upgraded => {
                self.level > self.printed_level
                    || (quiet && self.level >= Some(Confidence::Confirmed))
            }
            Change::Resolved | Change::Downgraded => !quiet,
        }
    }
}

/// The devices' series in device order: a sorted vector, not a tree, as it is looked up at
/// every allocation and free and holds a handful of devices.
#[derive(Debug, Default)]
pub struct DeviceGrowthDetector {
    devices: Vec<(i16, DeviceSeries)>,
}

impl DeviceGrowthDetector {
    fn series(&self, device: i16) -> Option<&DeviceSeries> {
        let i = self.devices.binary_search_by_key(&device, |d| d.0).ok()?;
        Some(&self.devices[i].1)
    }

    fn series_mut(&mut self, device: i16) -> Option<&mut DeviceSeries> {
        let i = self.devices.binary_search_by_key(&device, |d| d.0).ok()?;
        Some(&mut self.devices[i].1)
    }

    fn series_or_new(&mut self, device: i16) -> &mut DeviceSeries {
        let i = match self.devices.binary_search_by_key(&device, |d| d.0) {
            Ok(i) => i,
            Err(i) => {
                self.devices.insert(i, (device, DeviceSeries::default()));
                i
            }
        };
        &mut self.devices[i].1
    }

    /// The call sites whose allocations made `device` grow over the latest trend window (empty
    /// unless its growth was reported).
    pub fn grew_at(&self, device: i16) -> &[GrewAt] {
        self.series(device)
            .filter(|d| d.reported())
            .map_or(&[], |d| &d.grew_at)
    }

    /// The per-epoch rules. Runs after the leak detector's, whose per-site generations say
    /// which call sites made the device grow and whose leaks may explain it; hence not
    /// [`Detector::on_epoch_end`], which sees only the context.
    pub fn on_epoch_end_after_leaks(
        &mut self,
        ctx: &Context<'_>,
        leaks: &impl Leaks,
        out: &mut Alerts,
    ) {
        let e = ctx.epoch;
        let warm = warmup_end(ctx);
        for (device, d) in self.devices.iter_mut() {
            let device = *device;
            let live = ctx.devices.get(&device).map_or(0, |s| s.live_bytes);
            if d.series.last().is_none_or(|s| s.live != live) {
                d.flat_from = e;
            }
            d.series.push(Sample {
                epoch: e,
                live,
                gens: d.generations(warm, e.saturating_sub(LAG)),
                count: 0,
            });
            if live > d.peak.0 {
                d.peak = (live, e);
            }
            // Samples cut another way (before the clock became stable: mid-iteration windows)
            // do not say where the memory stands: the high-water mark starts again.
            if d.stable_since != ctx.clock.stable_since {
                d.stable_since = ctx.clock.stable_since;
                d.high.restart(e);
            }
            // A series flat over its last three samples (one a boundary: the epochs follow
            // each other) is its own median.
            let level_live =
                if d.series.len() >= 3 && d.flat_from.max(d.stable_since).saturating_add(2) <= e {
                    live
                } else {
                    d.smoothed(d.stable_since)
                };
            if d.high.raise(e, level_live) {
                d.resolved = false;
                d.drained = None;
            }
            let before = (d.level, d.bounded, d.resolved);
            // Leaks found on the device now: growth they make is theirs, however it slows.
            let leaking = leaks.leaks_on(device).0 > 0;
            let trended = evaluate(d, e, ctx.clock.stable_since, leaking);
            if trended && d.level >= Some(Confidence::Likely) {
                // Born in the window after warm-up, still live: what raised the total.
                let from = d.window.map_or(e, |w| w.from_step + 1).max(warm);
                d.grew_at = leaks.born_between(device, from, e);
                d.grew_at.truncate(MAX_GREW_AT);
            }
            if d.reported() {
                let (n, slope) = leaks.leaks_on(device);
                let own = d.trend.map_or(0.0, |t| t.slope_bytes_per_step);
                d.leaks = (n > 0).then(|| {
                    let share = if own > 0.0 { slope / own } else { 0.0 };
                    LeaksOnDevice {
                        leaks: n,
                        slope_bytes_per_step: slope,
                        share,
                        explained: share >= EXPLAINED_SHARE,
                    }
                });
            }
            let after = (d.level, d.bounded, d.resolved);
            if before == after {
                continue;
            }
            let resolved = d.resolved && !before.2;
            let downgraded = d.bounded && !before.1;
            let Some(change) = Change::between(before.0, d.level, resolved, downgraded) else {
                continue;
            };
            if change == Change::New && d.detected.is_none() {
                d.detected = Some((e, ctx.ts_ns));
                let per_step = d.trend.map_or(0.0, |t| t.slope_bytes_per_step);
                d.at_detection = Some(AtDetection {
                    step: e,
                    time_s: seconds(ctx, ctx.ts_ns),
                    level: d.level.map_or("likely", Confidence::name),
                    bytes: live,
                    count: ctx.devices.get(&device).map_or(0, |s| s.live_count),
                    surviving_epochs: d.generations(warm, e.saturating_sub(LAG)),
                    slope_bytes_per_step: per_step,
                    slope_bytes_per_s: per_second(per_step, ctx),
                });
            }
            let name = match change {
                Change::Resolved => "resolved",
                Change::Downgraded => "bounded",
                _ => d.level.map(Confidence::name).unwrap_or("none"),
            };
            if d.history.len() < HISTORY {
                d.history.push(LevelChange {
                    level: name,
                    step: e,
                    time_s: seconds(ctx, ctx.ts_ns),
                });
            }
            if d.reported() && d.worth_printing(change) {
                d.printed_level = d.printed_level.max(d.level);
                d.last_printed = Some(change);
                out.push(Alert {
                    finding: finding(device, d, ctx),
                    change,
                    epoch: e,
                    ts_ns: ctx.ts_ns,
                });
            }
        }
    }
}

impl Detector for DeviceGrowthDetector {
    fn on_alloc(&mut self, a: &AllocObs, _out: &mut Alerts) {
        if a.device < 0 {
            return;
        }
        let d = self.series_or_new(a.device);
        if a.api.memory_class() == MemoryClass::Tensor {
            // The trace tracker's tensors sit inside the segments this series counts.
            d.traced_tensors = true;
            return;
        }
        d.tensors |= a.api == Api::oomtrace_malloc;
        d.births.add(a.epoch, a.size);
    }

    fn on_free(&mut self, a: &AllocObs, birth: u32) {
        if a.api.memory_class() == MemoryClass::Tensor {
            return;
        }
        let Some(d) = self.series_mut(a.device) else {
            return;
        };
        d.births.remove(birth, a.size);
    }

    fn findings(&self, ctx: &Context<'_>) -> Vec<Finding> {
        self.devices
            .iter()
            .filter(|(_, d)| d.reported())
            .map(|(device, d)| finding(*device, d, ctx))
            .collect()
    }
}

/// The rules of the module comment at the end of epoch `e`. Returns whether a window passed
/// (the trend and its window are then fresh).
fn evaluate(d: &mut DeviceSeries, e: u32, stable_since: u32, leaking: bool) -> bool {
    // Back where the growth's window began, at a step boundary: the program gave the memory
    // back while it still ran its steps (a backlog that drained). No growth to report,
    // whatever the trend that raised it. It stays resolved until it grows past its old
    // high-water mark (which clears `drained`), however the old window still reads.
    if d.drained.is_some() {
        return false;
    }
    if d.reported() && !d.resolved {
        if let (Some(w), Some(last)) = (d.window, d.series.last()) {
            if last.live <= w.from_bytes {
                d.resolved = true;
                d.drained = Some((e, last.live));
                d.level = None;
                return false;
            }
        }
    }
    // The epoch fast path: an epoch ends every few events in a tight loop, and most devices
    // are flat then. Every sample since `stable_since` equal: no window grows (no trend) and
    // both halves' slopes are 0 (`bounded` stays); unreported, the level is and stays None
    // and nothing else below changes.
    if !d.reported() && d.flat_from <= stable_since {
        return false;
    }
    // Found slowing down once: judged on what came since (new evidence only), unless a leak
    // on the device keeps it growing.
    if leaking {
        d.judged_from = None;
    }
    let from = d.judged_from.map_or(stable_since, |b| b.max(stable_since));
    let post = window::since(&d.series, from);
    let k = post.len();
    if k < 6 {
        return false;
    }
    let best = window::best_trend(post, |_, t| t.new_generations >= 3);
    let usual = d.usual_gap();
    let since_raise = e.saturating_sub(d.high.epoch);
    let mut level = match best {
        Some((t, _))
            if t.window >= 10
                && t.p_value < ALPHA_CONFIRMED
                && f64::from(since_raise) <= (2.0 * usual).max(2.0) =>
        {
            Some(Confidence::Confirmed)
        }
        Some(_) => Some(Confidence::Likely),
        None => None,
    };
    // Levels rise on evidence and fall only through the rules below.
    level = level.max(d.level);
    if d.reported() && f64::from(since_raise) > (3.0 * usual).max(8.0) {
        d.resolved = true;
        d.level = None;
        return false;
    }
    if leaking || (d.bounded && d.judged_from.is_some() && best.is_some()) {
        // A leak's growth, or growth that passed the trend test again on samples taken since
        // it was found slowing: not bounded.
        d.bounded = false;
    } else if let Some((b1, b2)) = window::halves(post) {
        if b1 > 0.0 && b2 < 0.25 * b1 {
            d.judged_from.get_or_insert(e);
            d.bounded = true;
        } else if d.bounded && b2 >= 0.25 * b1 && b2 > 0.0 {
            d.bounded = false;
        }
    }
    if d.bounded {
        level = None;
    }
    d.level = level;
    d.max_level = d.max_level.max(level);
    // A finding keeps the trend it grew on: the weaker ones of a cache filling up do not
    // replace it (a resolved one returned above).
    match best {
        Some((t, w)) if !d.bounded => {
            d.trend = Some(t);
            d.window = Some(w);
            true
        }
        _ => false,
    }
}

/// The cause when the device grows with tensor-level events (`--torch`): tensors kept.
pub const TENSORS_HINT: &str = "Tensors that survive every step make the device grow: Python \
    keeps a reference across iterations (a list that gets .append(output), a running total \
    `total_loss += loss` that keeps each step's graph). The lines listed made it grow; a leak \
    finding names the call site when one grows on its own. Store .detach() or .item().";

/// The cause with plain CUDA allocations outside PyTorch.
pub const NATIVE_HINT: &str = "Something allocates device memory every step and never frees \
    it: a CUDA extension or library (CuPy, NCCL, a custom kernel's workspace) keeping a buffer \
    per step. A leak finding names the call site when one grows on its own.";

/// The cause with PyTorch's caching allocator's segments (no tensor-level events). `certain`:
/// the allocations come from PyTorch's CUDA library; otherwise the program is Python and its
/// framework is assumed to be PyTorch, and the hint says so.
pub fn segments_hint(certain: bool) -> String {
    let what = if certain {
        "These are PyTorch's caching-allocator segments, not tensors: "
    } else {
        "If this is PyTorch, these are its caching-allocator segments, not tensors: "
    };
    format!(
        "{what}the cache keeps reserving memory because tensors it holds survive each step (a \
         list that gets .append(output), `total_loss += loss` keeping each step's graph), and \
         the lines listed are only where the cache ran out. {}",
        trace_tensors!()
    )
}

/// PyTorch's segments grow while its tensors are traced one by one (`--torch`): the lines
/// that keep tensors have findings of their own; what is left is how the cache grows.
pub const TRACED_SEGMENTS_HINT: &str = "These are PyTorch's caching-allocator segments (its \
    reserve); its tensors are traced one by one, and a line that keeps tensors has a leak \
    finding of its own. The reserve grows faster than the tensors when the blocks the cache \
    keeps cannot serve new requests (a tensor rebuilt larger every step, a changing mix of \
    sizes): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow in place, and \
    torch.cuda.memory_reserved() beside memory_allocated() shows the gap.";

/// A device whose growth was given back while the program still ran.
pub const DRAINED_HINT: &str = "The memory that made the device grow was freed while the \
    program still ran its steps: it piled up for a while (a queue or backlog, results kept for \
    a phase) and was given back, not a leak. If the peak it reached is too high, free it \
    sooner.";

/// When the leak findings on the device are the growth: point to them.
pub const EXPLAINED_HINT: &str = "The leak findings on this device grow as fast as the device: \
    they are this growth; their call sites and causes are in them.";

fn finding(device: i16, d: &DeviceSeries, ctx: &Context<'_>) -> Finding {
    let per_step = d.trend.map(|t| t.slope_bytes_per_step);
    let per_s = per_step.and_then(|b| per_second(b, ctx));
    let (live, count, capacity) = ctx
        .devices
        .get(&device)
        .map_or((0, 0, None), |s| (s.live_bytes, s.live_count, s.capacity));
    let active = !d.resolved && !d.bounded;
    // A forecast only while the device holds what it grew by: memory freed at exit (kept
    // through the last step, the finding stands) fills nothing.
    let grown = d.window.is_none_or(|w| live > w.from_bytes);
    let (steps_to_oom, time_to_oom_s) = match (per_step, capacity) {
        (Some(b), Some(cap)) if b > 0.0 && active && grown => to_full(b, live, Some(cap), ctx),
        _ => (None, None),
    };
    let rate = per_step
        .map(|b| fmt_rate(b, per_s))
        .unwrap_or_else(|| "growing".into());
    let over = match d.window {
        Some(w) => format!(
            "over {} steps: {} → {}",
            w.to_step.saturating_sub(w.from_step) + 1,
            fmt_bytes(w.from_bytes),
            fmt_bytes(w.to_bytes)
        ),
        None => "step after step".into(),
    };
    let explained = d.leaks.filter(|l| l.explained);
    let message = if let Some((step, bytes)) = d.drained.filter(|_| d.resolved) {
        format!(
            "device {device}: CUDA memory grew {rate} {over}, then fell back to {} at step \
             {step}; {} live now",
            fmt_bytes(bytes),
            fmt_bytes(live)
        )
    } else if d.resolved {
        format!(
            "device {device}: CUDA memory grew {rate} {over}, then stopped for {} steps; {} live now",
            ctx.epoch.saturating_sub(d.high.epoch),
            fmt_bytes(live)
        )
    } else if d.bounded {
        format!(
            "device {device}: CUDA memory grew {rate} {over}, but the growth is slowing down \
             (a cache filling up); {} live now",
            fmt_bytes(live)
        )
    } else {
        let mut m = format!("device {device}: CUDA memory grows {rate} {over}");
        if let Some(l) = explained {
            m.push_str(&format!(
                "; the {} leak finding{} on this device account{} for it",
                l.leaks,
                if l.leaks == 1 { "" } else { "s" },
                if l.leaks == 1 { "s" } else { "" }
            ));
        }
        m
    };
    let (cause, hint) = if d.drained.is_some() && d.resolved {
        (Cause::Drained, DRAINED_HINT.to_string())
    } else if !active {
        (
            Cause::CacheFilling,
            "The growth stopped or is slowing down: a cache filling up to its capacity (the \
             caching allocator reserving for new shapes, an LRU, a warm-up pool), not a leak."
                .to_string(),
        )
    } else if explained.is_some() {
        (Cause::LeaksExplainGrowth, EXPLAINED_HINT.to_string())
    } else if d.tensors {
        (Cause::DeviceTensorsKept, TENSORS_HINT.to_string())
    } else {
        // The report names PyTorch's segments when the stacks or the program say so.
        (Cause::DeviceNative, NATIVE_HINT.to_string())
    };
    GrowthFinding {
        kind: Kind::DeviceGrowth,
        level: if active {
            d.level.or(d.max_level).unwrap_or(Confidence::Likely).into()
        } else {
            Level::INFO
        },
        device,
        site: Default::default(),
        bytes: live,
        count,
        api: None,
        per_step,
        per_s,
        steps: d.trend.map(|t| t.window as u64),
        message,
        cause,
        hint,
        evidence: Evidence::DeviceGrowth(Box::new(DeviceGrowthEvidence {
            events: if d.tensors {
                Events::Tensors
            } else {
                Events::Allocations
            },
            tensors_traced: d.traced_tensors,
            trend: d.trend,
            slope_bytes_per_s: per_s,
            window: d.window,
            surviving_epochs: d.generations(warmup_end(ctx), ctx.epoch.saturating_sub(LAG)),
            onset_step: d
                .births
                .oldest_from(warmup_end(ctx))
                .unwrap_or(warmup_end(ctx)),
            detected_step: d.detected.map(|x| x.0),
            detected_s: d.detected.map(|x| seconds(ctx, x.1)),
            steps_to_oom,
            time_to_oom_s,
            samples: d.series.iter().map(|x| x.live).collect(),
            history: d.history.clone(),
            at_detection: d.at_detection,
            peak_bytes: d.peak.0,
            peak_step: d.peak.1,
            leaks_on_device: d.leaks,
            python_lines: Vec::new(),
            grew_at: d.grew_at.clone(),
        })),
    }
    .finding()
}

#[cfg(test)]
mod tests;
