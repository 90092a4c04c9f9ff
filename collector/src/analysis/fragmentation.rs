//! Fragmentation (docs/detection.md): memory that is there but cannot be used.
//!
//! Signals, per device:
//! - **Allocator retries**: an allocation failed, the program freed memory, and the same
//!   size then succeeded: PyTorch's caching allocator does exactly this (free cached
//!   blocks, retry) before it gives up. Each one is a device synchronization. Retries in
//!   ≥ 2 of the last 3 epochs are thrashing.
//! - **Failure with free memory**: the driver reported at least the requested size free
//!   right after refusing it: free memory not in one piece.
//! - **A growing gap between PyTorch's reserve and its tensors**: once per step, the
//!   allocator's reserve against the tensors it held at the step's peak. The gap (reserve
//!   minus tensors at peak) rising ≥ 2 MiB per step (Mann-Kendall p < 0.01 over the last
//!   [`CREEP_WINDOW`] steps) while the reserve is above 1.5x the tensors (the rule of thumb
//!   users know: reserved above 1.5x allocated) and the gap is at least one large segment
//!   ([`MIN_GAP`]) is fragmentation, whatever the tensors do: a working set that grows step
//!   after step (longer sequences) makes the cache take a new segment for each larger
//!   request and keep the old ones, so the gap grows faster than the tensors. Two sources:
//!   - with tensors traced (oomtrace's tracker on PyTorch's allocator): the reserve from the
//!     allocator's segment events, the tensors' peak within each step from the tensors;
//!   - without (`--segments`, a release the tracker cannot attach to): the readings the step
//!     hook takes from PyTorch at each optimizer step ([`FragmentationDetector::on_reading`]):
//!     `memory_reserved()` against `max_memory_allocated()` (the peak since the start: the
//!     gap it gives is a lower bound).
//!
//!   Device memory outside the allocator (an extension's own cudaMalloc) is not reserve;
//!   under the swapped allocator (`--torch=swap`) there is no reserve to see.
//!
//!   A gap that stops growing is said to have stopped: once its widest point is
//!   [`CREEP_WINDOW`] steps old and the gap's trend over the window fails the test, the
//!   finding says it grew until that step and has held since (`evidence.settled_step`), never
//!   "the gap grows"; growing again clears it. Whether such a finding stays is the remedies'
//!   word: the report drops one whose every remedy, replayed, saves nothing
//!   (`report/remedies.rs`): a cache that grew while the program warmed up and then holds,
//!   with no setting that would reserve less, is the allocator settling.
//!
//! The finding carries the pattern behind the gap (requests larger than every cached free
//! block, sizes growing step after step, many sizes), the lines where the cache grew (named by
//! the report) and the remedies (`PYTORCH_CUDA_ALLOC_CONF` settings), whose predicted effect
//! the report adds by replaying the trace (`oomtrace whatif`).

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use super::leaks::GrewAt;
use super::refusal::Remedy;
use super::refusal::{OomRecord, Retry};
use super::stats::{mann_kendall, theil_sen};
use super::trend::seconds;
use super::{
    Alert, Alerts, AllocObs, Cause, Change, Context, Detector, Evidence, Finding, Kind, PythonLine,
    Severity,
};
use crate::model::SiteId;
use crate::units::{fmt_bytes, fmt_rate};
use oomtrace_proto::{Api, MemoryClass};

/// The gap must grow at least this much per step: less is a cache settling.
const CREEP_MIN_SLOPE: f64 = (2u64 << 20) as f64;
/// Steps the gap's trend is judged over.
pub const CREEP_WINDOW: usize = 16;
const CREEP_MIN_SAMPLES: usize = 6;
/// Reserve above this multiple of the tensors at peak (the common rule of thumb).
pub const RATIO: f64 = 1.5;
/// What a reading of PyTorch's reserve may differ from the traced one by (beside 1 %) before
/// the readings are the source (four times this, beside 5 %, for its tensors).
const MISMATCH_FLOOR: f64 = (2u64 << 20) as f64;
/// The gap must be at least one large segment of PyTorch's allocator (kLargeBuffer, 20 MiB):
/// less is the normal slack of a cache.
pub const MIN_GAP: u64 = 20 << 20;
/// Requests of at least this size count towards "many sizes" (PyTorch's small pool ends
/// at 1 MiB; small requests share 2 MiB segments).
const LARGE_REQUEST: u64 = 1 << 20;
/// At most this many distinct sizes and cache-growing sites are kept per device.
const MAX_SIZES: usize = 4096;
const MAX_SITES: usize = 256;
/// "Many sizes": more distinct large request sizes than this.
pub const MANY_SIZES: u64 = 32;

/// Where a fragmentation finding's allocated and reserved figures come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FragSource {
    /// PyTorch's tensors, traced one by one, and its segment events.
    Tensors,
    /// PyTorch's own counters, read by the step hook at each optimizer step.
    StepReadings,
}

/// What the requests looked like while the cache grew.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FragPattern {
    /// Segments the allocator took from CUDA.
    pub segments_taken: u64,
    /// Of them, taken while the cache held at least the request unallocated: the request was
    /// larger than every cached free block (tensors traced only).
    pub segments_taken_with_room: u64,
    /// The largest request (a tensor, or a segment without tensors) in the last step.
    pub largest_request_bytes: u64,
    /// The mean request of 1 MiB or more per step rises step after step (Mann-Kendall
    /// p < 0.01): the requests grow, not just one of them.
    pub sizes_growing: bool,
    /// How fast that mean grows.
    pub mean_request_slope_bytes_per_step: Option<f64>,
    /// Distinct request sizes of 1 MiB and more (at most 4096 counted).
    pub distinct_large_sizes: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct FragEvidence {
    pub retries: u64,
    pub retry_epochs: Vec<u32>,
    /// Failures while the driver reported enough free memory.
    pub failures_with_free_memory: u64,
    pub largest_failed_request_bytes: u64,
    pub free_at_failure_bytes: Option<u64>,
    /// How fast the gap (reserve minus tensors at peak) grows, once it was found growing.
    pub reserved_slope_bytes_per_step: Option<f64>,
    /// PyTorch's reserve at the last step.
    pub reserved_bytes: Option<u64>,
    pub live_tensor_bytes: Option<u64>,
    /// Where the figures below come from.
    pub source: Option<FragSource>,
    /// The tensors at the last step's peak (PyTorch's `max_memory_allocated()` without
    /// tensors traced).
    pub tensors_at_peak_bytes: Option<u64>,
    /// `reserved_bytes - tensors_at_peak_bytes`: memory the cache holds that no tensor used.
    pub gap_bytes: Option<u64>,
    pub gap_slope_bytes_per_step: Option<f64>,
    /// `reserved_bytes / tensors_at_peak_bytes`.
    pub reserved_to_allocated: Option<f64>,
    /// The reserve and the tensors at peak over the last steps, oldest first.
    pub reserved_samples: Vec<u64>,
    pub tensor_peak_samples: Vec<u64>,
    /// The step the gap last grew at, once it has held for [`CREEP_WINDOW`] steps since
    /// (absent while it grows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_step: Option<u32>,
    /// PyTorch's own `memory_reserved() / memory_allocated()` at the latest step reading (the
    /// `oomtrace` package's step hook), where it read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pytorch_reserved_to_allocated: Option<f64>,
    /// How much of the reserve's growth over those samples the tensors at peak grew by
    /// (0..1): what the tensors held explain of it (absent: the reserve did not grow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors_share_of_reserve_growth: Option<f64>,
    pub onset_step: Option<u32>,
    pub onset_s: Option<f64>,
    pub detected_step: Option<u32>,
    pub detected_s: Option<f64>,
    pub pattern: Option<FragPattern>,
    /// The step since detection at which the gap was widest, and the figures then: what the
    /// finding's sentence states (an out-of-memory retry may empty the cache later).
    pub widest: Option<WidestGap>,
    /// The lines whose requests made the cache take segments (filled in by the report).
    pub python_lines: Vec<PythonLine>,
    /// Settings that may help, with their predicted effect (filled in by the report).
    pub remedies: Vec<Remedy>,
    /// The sites behind `python_lines`, raw.
    #[serde(skip)]
    pub grew_at: Vec<GrewAt>,
}

/// The gap at one step.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct WidestGap {
    pub step: u32,
    pub reserved_bytes: u64,
    pub tensors_at_peak_bytes: u64,
    pub gap_bytes: u64,
}

/// PyTorch's own counters for a device, as the step hook read them.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    allocated: u64,
    max_allocated: u64,
    reserved: u64,
}

#[derive(Debug, Default)]
struct DeviceFrag {
    ev: FragEvidence,
    level: Option<Severity>,
    /// Epochs of recent retries (the last few).
    recent: VecDeque<u32>,
    /// Live bytes from tensor-level events (trace tracker or pluggable allocator).
    tensor_live: u64,
    tensor_peak_epoch: u64,
    /// Tensor-level events were seen on this device.
    tensors: bool,
    reserved: VecDeque<f64>,
    tensor_peaks: VecDeque<f64>,
    /// The epoch each sample belongs to.
    sample_epochs: VecDeque<u32>,
    creep: bool,
    /// The latest reading of PyTorch's counters (step hook).
    reading: Option<Reading>,
    /// A reading found PyTorch's reserve other than the segments traced added up to: the
    /// readings are the source from then on.
    reserve_mismatch: bool,
    /// A segment was just taken while this much reserve was unallocated: the tensor request
    /// that made the allocator take it comes next.
    pending_segment: Option<u64>,
    pattern: FragPattern,
    largest_request_epoch: u64,
    /// Requests of 1 MiB or more in the current step: their bytes and count.
    large_requests_epoch: (u64, u64),
    /// The mean of those per step.
    mean_requests: VecDeque<f64>,
    sizes: FxHashSet<u64>,
    /// Sites whose requests made the cache take segments: bytes and segments.
    grew_at: FxHashMap<SiteId, (u64, u64)>,
}

#[derive(Debug, Default)]
pub struct FragmentationDetector {
    devices: FxHashMap<i16, DeviceFrag>,
}

/// Tensor-level events: PyTorch's tensors, through its swapped allocator or oomtrace's trace
/// tracker on its own.
pub fn is_tensor_level(api: Api) -> bool {
    matches!(
        api,
        Api::oomtrace_malloc | Api::oomtrace_torch_alloc | Api::oomtrace_torch_free
    )
}

impl FragmentationDetector {
    pub fn on_retry(&mut self, r: &Retry, epoch: u32, ts: u64, out: &mut Alerts) {
        let d = self.devices.entry(r.device).or_default();
        d.ev.retries += 1;
        d.ev.largest_failed_request_bytes = d.ev.largest_failed_request_bytes.max(r.size);
        if d.ev.retry_epochs.len() < 64 {
            d.ev.retry_epochs.push(epoch);
        }
        if d.recent.back() != Some(&epoch) {
            d.recent.push_back(epoch);
            if d.recent.len() > 3 {
                d.recent.pop_front();
            }
        }
        let thrashing = d.recent.iter().filter(|&&x| x + 2 >= epoch).count() >= 2;
        let level = if thrashing {
            Severity::Error
        } else {
            Severity::Warning
        };
        if d.level < Some(level) {
            let change = if d.level.is_some() {
                Change::Upgraded
            } else {
                Change::New
            };
            d.level = Some(level);
            out.push(Alert {
                finding: finding(r.device, d),
                change,
                epoch,
                ts_ns: ts,
            });
        }
    }

    /// The driver's reading after a failure: enough free memory means fragmentation, unless
    /// the memory cap the program set refused it (the driver was never asked).
    pub fn on_failure_info(&mut self, r: &OomRecord, out: &mut Alerts) {
        let Some(free) = r.free_bytes.filter(|&f| f >= r.size) else {
            return;
        };
        if r.cap().is_some() {
            return;
        }
        let d = self.devices.entry(r.device).or_default();
        d.ev.failures_with_free_memory += 1;
        d.ev.free_at_failure_bytes = Some(free);
        d.ev.largest_failed_request_bytes = d.ev.largest_failed_request_bytes.max(r.size);
        if d.level < Some(Severity::Error) {
            d.level = Some(Severity::Error);
            out.push(Alert {
                finding: finding(r.device, d),
                change: Change::New,
                epoch: r.epoch,
                ts_ns: r.ts_ns,
            });
        }
    }

    /// PyTorch's allocator took a segment of `size` bytes at `site` while `unallocated` bytes
    /// of its reserve held no tensor.
    pub fn on_segment(&mut self, device: i16, site: SiteId, size: u64, unallocated: u64) {
        let d = self.devices.entry(device).or_default();
        d.pending_segment = Some(unallocated);
        took_segment(d, site, size);
    }

    /// PyTorch's own statistics of one device, read by the step hook after a step marker:
    /// what segment mode judges the gap by.
    pub fn torch_memory(&mut self, m: &crate::model::TorchMemory) {
        self.on_reading(m.device, m.allocated, m.max_allocated, m.reserved);
    }

    /// PyTorch's own counters for `device` (see [`FragmentationDetector::torch_memory`]).
    pub fn on_reading(&mut self, device: i16, allocated: u64, max_allocated: u64, reserved: u64) {
        let d = self.devices.entry(device).or_default();
        // Read right after the step marker whose sample was just taken: where PyTorch's own
        // reserve, or its tensors, are not what the traced segments and tensors add up to, its
        // counters are what the finding rests on from then on (and what its ratio says).
        if let Some(&ours) = d.reserved.back().filter(|_| d.tensors) {
            // The reserve is the segments, exactly; the tensors differ by PyTorch's rounding
            // (512-byte blocks) and a tensor in flight at the reading (a few MiB): only a
            // difference beyond that says the traced tensors are not PyTorch's.
            let reserve_off =
                (ours - reserved as f64).abs() > (0.01 * reserved as f64).max(MISMATCH_FLOOR);
            let tensors_off = (d.tensor_live as f64 - allocated as f64).abs()
                > (0.05 * allocated as f64).max(4.0 * MISMATCH_FLOOR);
            if reserve_off || tensors_off {
                d.reserve_mismatch = true;
            }
        }
        if allocated > 0 {
            d.ev.pytorch_reserved_to_allocated = Some(reserved as f64 / allocated as f64);
        }
        d.reading = Some(Reading {
            allocated,
            max_allocated,
            reserved,
        });
    }
}

/// The sites that made the cache grow, largest first, for the report to name.
fn sites_largest_first(sites: &FxHashMap<SiteId, (u64, u64)>) -> Vec<GrewAt> {
    let mut v: Vec<GrewAt> = sites
        .iter()
        .map(|(&site, &(bytes, count))| GrewAt { site, bytes, count })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    v
}

/// The cache took `size` bytes at `site`.
fn took_segment(d: &mut DeviceFrag, site: SiteId, size: u64) {
    d.pattern.segments_taken += 1;
    if !d.tensors {
        // Without tensors the segment is the request the pattern is made of.
        note_request(d, size);
    }
    let n = d.grew_at.len();
    if let Some(e) = d.grew_at.get_mut(&site) {
        e.0 = e.0.saturating_add(size);
        e.1 += 1;
    } else if n < MAX_SITES {
        d.grew_at.insert(site, (size, 1));
    }
}

fn note_request(d: &mut DeviceFrag, size: u64) {
    d.largest_request_epoch = d.largest_request_epoch.max(size);
    if size >= LARGE_REQUEST {
        d.large_requests_epoch.0 = d.large_requests_epoch.0.saturating_add(size);
        d.large_requests_epoch.1 += 1;
        if d.sizes.len() < MAX_SIZES {
            // PyTorch rounds requests to 512 bytes: sizes that round alike are one size to it.
            d.sizes.insert(size.div_ceil(512));
        }
    }
}

impl Detector for FragmentationDetector {
    fn on_alloc(&mut self, a: &AllocObs, _out: &mut Alerts) {
        if is_tensor_level(a.api) {
            let d = self.devices.entry(a.device).or_default();
            d.tensors = true;
            d.tensor_live = d.tensor_live.saturating_add(a.size);
            d.tensor_peak_epoch = d.tensor_peak_epoch.max(d.tensor_live);
            note_request(d, a.size);
            if let Some(unallocated) = d.pending_segment.take() {
                if unallocated >= a.size {
                    d.pattern.segments_taken_with_room += 1;
                }
            }
        } else if a.api.memory_class() == MemoryClass::Device {
            // Segments only (PyTorch's readings came, no tensors): its cudaMalloc calls are its
            // segments (beside what other libraries take themselves, which cannot be told
            // apart here).
            if let Some(d) = self
                .devices
                .get_mut(&a.device)
                .filter(|d| !d.tensors && d.reading.is_some())
            {
                took_segment(d, a.site, a.size);
            }
        }
    }

    fn on_free(&mut self, a: &AllocObs, _birth: u32) {
        if is_tensor_level(a.api) {
            if let Some(d) = self.devices.get_mut(&a.device) {
                d.tensor_live = d.tensor_live.saturating_sub(a.size);
            }
        }
    }

    fn on_epoch_end(&mut self, ctx: &Context<'_>, out: &mut Alerts) {
        for (&device, d) in self.devices.iter_mut() {
            // The allocator's own segments against its tensors; without tensors traced, its
            // own counters as the step hook read them; with neither (the swapped allocator,
            // a program without PyTorch) there is no reserve to judge.
            let tracked = ctx
                .devices
                .get(&device)
                .and_then(|dev| dev.torch_reserved_bytes)
                .filter(|_| d.tensors && !(d.reserve_mismatch && d.reading.is_some()));
            let (source, reserved, at_peak, live) = match (tracked, d.reading) {
                (Some(reserved), _) => (
                    FragSource::Tensors,
                    reserved,
                    d.tensor_peak_epoch,
                    d.tensor_live,
                ),
                (None, Some(r)) => (
                    FragSource::StepReadings,
                    r.reserved,
                    r.max_allocated,
                    r.allocated,
                ),
                (None, None) => continue,
            };
            d.tensor_peak_epoch = d.tensor_live;
            push(&mut d.reserved, reserved as f64);
            push(&mut d.tensor_peaks, at_peak as f64);
            if d.sample_epochs.len() == CREEP_WINDOW {
                d.sample_epochs.pop_front();
            }
            d.sample_epochs.push_back(ctx.epoch);
            let (bytes, n) = std::mem::take(&mut d.large_requests_epoch);
            push(&mut d.mean_requests, bytes as f64 / n.max(1) as f64);
            d.pattern.largest_request_bytes = d.largest_request_epoch;
            d.largest_request_epoch = 0;
            let ev = &mut d.ev;
            ev.source = Some(source);
            ev.reserved_bytes = Some(reserved);
            ev.live_tensor_bytes = Some(live);
            ev.tensors_at_peak_bytes = Some(at_peak);
            ev.gap_bytes = Some(reserved.saturating_sub(at_peak));
            ev.reserved_to_allocated = (at_peak > 0).then(|| reserved as f64 / at_peak as f64);
            ev.reserved_samples = d.reserved.iter().map(|&x| x as u64).collect();
            ev.tensor_peak_samples = d.tensor_peaks.iter().map(|&x| x as u64).collect();
            ev.tensors_share_of_reserve_growth = ev
                .growth()
                .map(|(reserve, tensors)| tensors as f64 / reserve as f64);
            if ctx.epoch < super::trend::warmup_end(ctx) || d.reserved.len() < CREEP_MIN_SAMPLES {
                continue;
            }
            let gaps: Vec<f64> = d
                .reserved
                .iter()
                .zip(&d.tensor_peaks)
                .map(|(r, a)| (r - a).max(0.0))
                .collect();
            let mk = mann_kendall(&gaps);
            let slope = theil_sen(&gaps, mk.var, 0.95).map_or(0.0, |t| t.slope);
            let sizes: Vec<f64> = d.mean_requests.iter().copied().collect();
            let mk_sizes = mann_kendall(&sizes);
            d.pattern.sizes_growing = mk_sizes.p < 0.01;
            d.pattern.mean_request_slope_bytes_per_step = theil_sen(&sizes, mk_sizes.var, 0.95)
                .map(|t| t.slope)
                .filter(|&s| s > 0.0 && d.pattern.sizes_growing);
            d.pattern.distinct_large_sizes = d.sizes.len() as u64;
            let gap = reserved.saturating_sub(at_peak);
            let now = WidestGap {
                step: ctx.epoch,
                reserved_bytes: reserved,
                tensors_at_peak_bytes: at_peak,
                gap_bytes: gap,
            };
            let growing = mk.p < 0.01 && slope >= CREEP_MIN_SLOPE;
            let ratio_high = reserved as f64 > RATIO * at_peak as f64;
            if growing {
                ev.gap_slope_bytes_per_step = Some(slope);
            }
            if d.creep {
                // Found: keep its figures current for the report.
                if ev.widest.is_none_or(|w| gap > w.gap_bytes) {
                    ev.widest = Some(now);
                }
                // Stopped growing, or growing again (the module comment).
                let widest_step = ev.widest.map_or(ctx.epoch, |w| w.step);
                if growing {
                    ev.settled_step = None;
                } else if ctx.epoch.saturating_sub(widest_step) as usize >= CREEP_WINDOW {
                    ev.settled_step.get_or_insert(widest_step);
                }
                if growing {
                    ev.reserved_slope_bytes_per_step = Some(slope);
                }
                ev.pattern = Some(d.pattern.clone());
                ev.grew_at = sites_largest_first(&d.grew_at);
                ev.remedies = remedies(&d.pattern);
                continue;
            }
            if growing && ratio_high && gap >= MIN_GAP {
                d.creep = true;
                ev.widest = Some(now);
                ev.reserved_slope_bytes_per_step = Some(slope);
                // The first step of the window whose gap is above the window's first.
                let onset = d
                    .sample_epochs
                    .iter()
                    .zip(&gaps)
                    .find(|(_, &g)| g > gaps[0])
                    .map_or(ctx.epoch, |(&e, _)| e);
                ev.onset_step = Some(onset);
                ev.onset_s = ctx.clock.start_of(onset).map(|t| seconds(ctx, t));
                ev.detected_step = Some(ctx.epoch);
                ev.detected_s = Some(seconds(ctx, ctx.ts_ns));
                ev.pattern = Some(d.pattern.clone());
                ev.grew_at = sites_largest_first(&d.grew_at);
                ev.remedies = remedies(&d.pattern);
                if d.level < Some(Severity::Warning) {
                    d.level = Some(Severity::Warning);
                }
                out.push(Alert {
                    finding: finding(device, d),
                    change: Change::New,
                    epoch: ctx.epoch,
                    ts_ns: ctx.ts_ns,
                });
            }
        }
    }

    fn findings(&self, _ctx: &Context<'_>) -> Vec<Finding> {
        let mut v: Vec<Finding> = self
            .devices
            .iter()
            .filter(|(_, d)| d.level.is_some())
            .map(|(&dev, d)| finding(dev, d))
            .collect();
        v.sort_by_key(|f| f.device);
        v
    }
}

impl FragmentationDetector {
    /// Whether the reserve of `device` was found growing away from its tensors.
    pub fn gap_growing(&self, device: i16) -> bool {
        self.devices.get(&device).is_some_and(|d| d.creep)
    }
}

/// Every setting [`remedies`] may suggest, whatever the pattern: what a replay tries when
/// it answers for all of them at once (the report's predictions, `whatif` without a setting).
pub fn every_remedy() -> Vec<Remedy> {
    remedies(&FragPattern {
        distinct_large_sizes: MANY_SIZES + 1,
        ..Default::default()
    })
}

/// The settings worth trying for a pattern, best first. Their effect is predicted by the
/// report; the order and the sentences are what the pattern alone says.
pub fn remedies(p: &FragPattern) -> Vec<Remedy> {
    let mut v = vec![remedy(
        "expandable_segments:True",
        "segments grow in place instead of one new segment per larger request, and freed \
         pages serve any size",
    )];
    if p.distinct_large_sizes > MANY_SIZES || p.sizes_growing {
        v.push(remedy(
            "roundup_power2_divisions:4",
            "rounds request sizes up to a few steps per power of two, so that a freed block \
             fits the next, slightly different request",
        ));
    }
    // Not garbage_collection_threshold: PyTorch applies it only under a per-process memory
    // fraction (torch.cuda.set_per_process_memory_fraction), which a trace cannot see.
    v.push(remedy(
        "max_split_size_mb:128",
        "keeps large cached blocks whole for large requests; often worse when sizes keep \
         growing",
    ));
    v
}

fn remedy(conf: &str, why: &str) -> Remedy {
    Remedy {
        alloc_conf: conf.into(),
        why: why.into(),
        predicted_peak_reserved_bytes: None,
        baseline_peak_reserved_bytes: None,
        oom_avoided: None,
    }
}

fn push(q: &mut VecDeque<f64>, x: f64) {
    if q.len() == CREEP_WINDOW {
        q.pop_front();
    }
    q.push_back(x);
}

fn finding(device: i16, d: &DeviceFrag) -> Finding {
    let ev = &d.ev;
    let mut parts = Vec::new();
    if ev.failures_with_free_memory > 0 {
        parts.push(format!(
            "an allocation of {} failed while the driver reported {} free",
            fmt_bytes(ev.largest_failed_request_bytes),
            fmt_bytes(ev.free_at_failure_bytes.unwrap_or(0))
        ));
    }
    if ev.retries > 0 {
        parts.push(format!(
            "{} allocation{} succeeded only after freeing cached memory and retrying{}",
            ev.retries,
            if ev.retries == 1 { "" } else { "s" },
            if d.level == Some(Severity::Error) && ev.failures_with_free_memory == 0 {
                " (in most recent steps: the allocator is thrashing)"
            } else {
                ""
            }
        ));
    }
    if d.creep {
        parts.push(gap_sentence(ev));
    }
    Finding {
        kind: Kind::Fragmentation,
        level: d.level.unwrap_or(Severity::Warning).into(),
        pid: 0,
        rank: None,
        device,
        site: Default::default(),
        stack: Vec::new(),
        oom: None,
        cause: Cause::Fragmented,
        bytes: if d.creep {
            ev.gap_bytes.unwrap_or(0)
        } else {
            ev.largest_failed_request_bytes
        },
        growth_bytes_per_step: ev.reserved_slope_bytes_per_step.filter(|_| d.creep),
        growth_bytes_per_s: None,
        steps: None,
        count: ev.retries + ev.failures_with_free_memory,
        api: None,
        message: format!("device {device}: {}", parts.join("; ")),
        hint: if d.creep {
            gap_hint(ev, 0)
        } else {
            HINT.into()
        },
        evidence: Some(Evidence::Fragmentation(Box::new(ev.clone()))),
        record: None,
        culprit: None,
        backward_node: None,
        site_name: String::new(),
        held: None,
        anatomy: None,
        parts: Vec::new(),
        levers: Vec::new(),
    }
}

const HINT: &str = "Memory is reserved but not usable for the requests that come: free blocks \
                    of the wrong size or place. With PyTorch, \
                    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow \
                    instead of splitting; otherwise allocate the largest, long-lived buffers \
                    first and keep request sizes steady (pad dynamic shapes to a few buckets).";

/// "PyTorch's cache reserved 2.14 GiB for 409.00 MiB of tensors at peak (5.4x, step 24); the
/// gap grows +70.06 MiB/step": short enough for a live line.
fn gap_sentence(ev: &FragEvidence) -> String {
    let (reserved, at_peak) = ev.widest.map_or(
        (
            ev.reserved_bytes.unwrap_or(0),
            ev.tensors_at_peak_bytes.unwrap_or(0),
        ),
        |w| (w.reserved_bytes, w.tensors_at_peak_bytes),
    );
    let what = match ev.source {
        Some(FragSource::StepReadings) => "max_memory_allocated()",
        _ => "tensors at peak",
    };
    let mut why = Vec::new();
    if at_peak > 0 {
        why.push(format!("{:.1}x", reserved as f64 / at_peak as f64));
    }
    if let Some(w) = ev.widest {
        why.push(format!("step {}", w.step));
    }

    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({})", why.join(", "))
    };
    let rate = fmt_rate(ev.reserved_slope_bytes_per_step.unwrap_or(0.0), None);
    let trend = match ev.settled_step {
        Some(step) => format!("the gap grew {rate} until step {step} and has held since"),
        None => format!("the gap grows {rate}"),
    };
    format!(
        "PyTorch's cache reserved {} for {} of {what}{why}; {trend}",
        fmt_bytes(reserved),
        fmt_bytes(at_peak),
    )
}

impl FragEvidence {
    /// The reserve's growth and the tensors' at peak over the samples, when the reserve grew.
    fn growth(&self) -> Option<(u64, u64)> {
        let reserve = self
            .reserved_samples
            .last()?
            .saturating_sub(*self.reserved_samples.first()?);
        let tensors = self
            .tensor_peak_samples
            .last()?
            .saturating_sub(*self.tensor_peak_samples.first()?);
        (reserve > 0).then_some((reserve, tensors.min(reserve)))
    }
}

/// The pattern behind the gap, in a PyTorch user's words, and what to do. `leaks`: the leak
/// findings on the device (the analysis knows them; the detector says 0): the tensors are then
/// not all freed, and the words never say they are.
pub fn gap_hint(ev: &FragEvidence, leaks: u32) -> String {
    let mut why = Vec::new();
    if let Some(p) = &ev.pattern {
        if p.segments_taken_with_room > 0 {
            why.push(format!(
                "{} of {} new segments were taken while the cache held at least the request \
                 unallocated: the requests were larger than every cached free block",
                p.segments_taken_with_room, p.segments_taken
            ));
        }
        if let Some(s) = p.mean_request_slope_bytes_per_step {
            why.push(format!(
                "request sizes grow step after step (their mean {}; the largest {})",
                fmt_rate(s, None),
                fmt_bytes(p.largest_request_bytes)
            ));
        }
        if p.distinct_large_sizes > MANY_SIZES {
            why.push(format!(
                "{}{} distinct request sizes of 1 MiB or more",
                p.distinct_large_sizes,
                if p.distinct_large_sizes as usize >= MAX_SIZES {
                    "+"
                } else {
                    ""
                }
            ));
        }
    }
    let pattern = if why.is_empty() {
        String::new()
    } else {
        format!(" Seen: {}.", why.join("; "))
    };
    let explained = ev
        .growth()
        .map(|(reserve, tensors)| {
            format!(
                " The tensors held at the step's peak explain {:.0} % of the reserve's growth \
                 ({} of {} over the last {} steps).",
                100.0 * tensors as f64 / reserve as f64,
                fmt_bytes(tensors),
                fmt_bytes(reserve),
                ev.reserved_samples.len().saturating_sub(1)
            )
        })
        .unwrap_or_default();
    let opening = if leaks == 0 {
        "Not a leak: the tensors are freed, but PyTorch's caching allocator keeps every segment \
         it took, and the requests that come (larger each step, or of many sizes) fit none of its \
         free blocks, so it takes more."
            .to_string()
    } else {
        format!(
            "Besides the tensors that the leak finding{} on this device keep{}, PyTorch's \
             caching allocator keeps every segment it took, and the requests that come (larger \
             each step, or of many sizes) fit none of its free blocks, so it takes more.",
            if leaks == 1 { "" } else { "s" },
            if leaks == 1 { "s" } else { "" }
        )
    };
    format!(
        "{opening}{explained}{pattern} Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
         (segments grow in place), or pad dynamic shapes to a few sizes; \
         torch.cuda.empty_cache() only hides it."
    )
}

#[cfg(test)]
mod tests;
