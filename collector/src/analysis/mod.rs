//! The analysis: what turns a process's stream of allocations into findings, while the job
//! runs. It observes the model ([`crate::model::Observer`]) and imports only the model and
//! [`crate::units`]; the report reads it, it never reads the report. The live server and a
//! trace replay own one [`Analysis`] beside each process and feed it, so what `oomtrace run`
//! printed while the job ran is what `oomtrace report` shows later. History replays for
//! exporters run the model without it.
//!
//! - [`epoch`]: the epoch clock (the iterations a leak is measured in).
//! - [`growth`]: leaks per call site and device (docs/detection.md).
//! - [`site_growth`]: one buffer per call site growing while its allocations are replaced
//!   (reallocate-and-copy, concatenation), which no surviving generation shows.
//! - The growth detectors' shared vocabulary, which names no detector: [`trend`] (thresholds,
//!   warm-up, the statistics of a trend), [`window`] (the trend windows), [`evidence`] (what a
//!   leak or growth finding shows), [`leaks`] (the leak detector as the others may read it),
//!   [`advice`] (hint texts said alike) and `growth_finding` (the one builder of their
//!   findings).
//! - [`device_growth`]: the process's total on each device rising step after step, whoever
//!   allocates it (the view that still works when a caching allocator spreads a leak over
//!   many call sites).
//! - [`fragmentation`]: allocator retries, failures with free memory, reserved-minus-live creep.
//! - [`oom`]: forensics at each failed allocation (the report opens with them).
//! - [`threshold`]: 85 / 90 / 95 % of device capacity, once per crossing.
//! - [`births`]: live allocations by birth epoch ("generations"), shared by the leak and
//!   device-growth detectors; [`stats`]: their statistics.
//!
//! Each detector is one file behind [`Detector`]: O(1) work per event, its statistics once per
//! epoch, and the findings it stands by at any moment. Detectors never read each other: what
//! one needs of another (OOM records for fragmentation, the leaks' generations for device
//! growth, through [`leaks::Leaks`]) is handed over here, by [`Analysis`], in a fixed order.
//! What one detector's finding means beside the others' (leaks holding the memory at an OOM,
//! a device growth that fragmentation explains, where the cache grew under a leak) is
//! attached here too, in [`Analysis::findings`]; `tests/layers.rs` checks the rule.
//!
//! Detectors see call sites, not stacks: what needs the stacks (a device growth's
//! `python_lines`, whether its allocations are PyTorch's segments) is completed by the report.

pub mod advice;
pub mod anatomy;
pub mod births;
pub mod detector;
pub mod device_growth;
pub mod epoch;
pub mod evidence;
pub mod finding;
pub mod fragmentation;
pub mod growth;
mod growth_finding;
pub mod leaks;
pub mod oom;
pub mod refusal;
#[cfg(test)]
pub(crate) mod sim;
pub mod site_growth;
pub mod stats;
pub mod threshold;
pub mod together;
pub mod trend;
pub mod window;

use std::collections::BTreeMap;

use crate::model::{
    Alloc, EndState, Free, MemInfo, Observer, OutOfMemory, Process, SiteId, TorchMemory,
};
use crate::units::fmt_bytes;
use epoch::EpochClock;
use leaks::Leaks;
use oomtrace_proto::wire::Frame;
use oomtrace_proto::MemoryClass;

// The findings' vocabulary (the JSON contract's types) lives in `finding.rs`; named here too,
// where every detector and the report have always found it.
pub use detector::{Alerts, AllocObs, Context, Detector};
pub use finding::{
    Alert, BackwardNode, Cause, Change, Confidence, Evidence, Finding, Held, Kind, Level,
    PythonLine, Severity,
};

/// A device's growth that the fragmentation finding on the same device explains.
const FRAGMENTED_DEVICE_HINT: &str = "PyTorch's cache grows while the tensors it holds do not \
    keep up: the growth is memory reserved and not used (see the fragmentation finding on this \
    device), not tensors held across steps.";

/// The analysis of one process: its epoch clock and every detector, fed by the model, and the
/// coordinator between detectors.
#[derive(Debug, Default)]
pub struct Analysis {
    /// Epoch boundaries (markers, an auto-detected iteration, or time windows).
    pub clock: EpochClock,
    pub growth: growth::GrowthDetector,
    pub site_growth: site_growth::SiteGrowthDetector,
    pub device_growth: device_growth::DeviceGrowthDetector,
    pub fragmentation: fragmentation::FragmentationDetector,
    pub threshold: threshold::ThresholdDetector,
    pub oom: oom::OomDetector,
    /// What the memory is: the tensors' roles at the peak, each OOM and each step's end.
    pub anatomy: anatomy::Anatomy,
    pub alerts: Alerts,
    /// Set if a detector ever failed (a bug): the clock and the detectors stop, the process's
    /// accounting and its trace go on.
    pub failed: bool,
    /// What of the process it analyses: all of it, or what follows a step marker.
    window: Window,
    /// Per device, the most it held at once since the window opened (none without a window).
    pub window_peaks: BTreeMap<i16, WindowPeak>,
}

/// What a device held at most since a window opened ([`Analysis::since_mark`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WindowPeak {
    /// Device memory the process held (PyTorch's segments, other CUDA allocations).
    pub peak_bytes: u64,
    /// PyTorch's tensors (what `torch.cuda.max_memory_allocated()` would say, counted from
    /// the window's start).
    pub tensor_peak_bytes: u64,
    /// What the device held when the window opened, as `peak_bytes` counts it.
    pub bytes_at_start: u64,
    /// PyTorch's tensors live when the window opened.
    pub tensor_bytes_at_start: u64,
}

/// What of a process the analysis sees. The model always sees everything (what is live, the
/// device's totals); a window only decides what the detectors and the anatomy are told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Window {
    #[default]
    Whole,
    /// Nothing until a step marker with this label.
    Waiting(String),
    /// Since that marker.
    Open,
}

/// What a device holds: its CUDA allocations, or PyTorch's reserve where the CUDA calls are
/// not seen (the library loaded into a running Python program sees PyTorch's segments only).
fn device_bytes(d: &crate::model::DeviceState) -> u64 {
    d.live_bytes.max(d.torch_reserved_bytes.unwrap_or(0))
}

/// The epoch an allocation made before a window opened is born in: never told to a detector,
/// so its free is not told either.
const BEFORE_WINDOW: u32 = u32::MAX;

impl Analysis {
    /// Analyses only what follows the first step marker labelled `label` (the block a
    /// program's `oomtrace.trace()` marks, `report --since-mark`): the detectors and the
    /// anatomy see nothing before it, and nothing of allocations made before it.
    pub fn since_mark(&mut self, label: &str) {
        if self.window == Window::Whole {
            self.window = Window::Waiting(label.to_owned());
        }
    }

    /// Whether a window was asked for and its marker never came.
    pub fn window_never_opened(&self) -> bool {
        matches!(self.window, Window::Waiting(_))
    }

    /// Whether the detectors are told what happens now.
    fn sees(&self) -> bool {
        !matches!(self.window, Window::Waiting(_))
    }

    /// The detectors' view of `p` now (for a report).
    pub fn context<'a>(&'a self, p: &'a Process) -> Context<'a> {
        Context {
            epoch: self.clock.epoch,
            ts_ns: p.last_ts_ns,
            clock: &self.clock,
            devices: &p.devices,
            ended: p.end != EndState::Running,
        }
    }

    /// Every finding, OOMs first.
    pub fn findings(&self, p: &Process) -> Vec<Finding> {
        let ctx = self.context(p);
        let mut v = self.oom.findings(&ctx);
        v.extend(self.growth.findings(&ctx));
        // Leaks kept by one object are one finding, at the keeper's line.
        for (device, g) in self.kept_together(p) {
            together::merge(&mut v, device, &g);
        }
        // One finding per site: the leak detector's when it has one.
        v.extend(
            self.site_growth
                .findings(&ctx)
                .into_iter()
                .filter(|f| !self.growth.reported(f.site, f.device)),
        );
        v.extend(self.device_growth.findings(&ctx));
        v.extend(self.fragmentation.findings(&ctx));
        v.extend(self.threshold.findings(&ctx));
        // "At this rate the device is full in ..." once the device has run out of memory
        // (an allocation refused and not recovered by a retry) is a forecast of the past.
        for f in &mut v {
            let ran_out = self
                .oom
                .records
                .iter()
                .any(|r| r.device == f.device && r.recovered.is_none());
            if !ran_out {
                continue;
            }
            match f.evidence.as_mut() {
                Some(Evidence::Leak(e)) => (e.steps_to_oom, e.time_to_oom_s) = (None, None),
                Some(Evidence::DeviceGrowth(e)) => (e.steps_to_oom, e.time_to_oom_s) = (None, None),
                _ => {}
            }
        }
        for f in &mut v {
            self.attach_causes(f);
        }
        v
    }

    /// What one detector's finding means beside the others' (the detectors never read each
    /// other): memory that leaking sites held at an OOM, a device's growth that its
    /// fragmentation explains, and where the device's cache grew, for a leak of PyTorch's
    /// segments (the report turns those call sites into `python_lines` when the stacks say
    /// they are PyTorch's segments).
    fn attach_causes(&self, f: &mut Finding) {
        let leaked_at_oom = f.record.as_ref().map_or(0, |o| {
            o.top_sites
                .iter()
                .filter(|(site, _, _)| self.is_leak(*site, o.device))
                .fold(0u64, |acc, &(_, bytes, _)| acc.saturating_add(bytes))
        });
        if leaked_at_oom > 0 {
            f.cause = Cause::LeaksHeldAtOom;
            f.hint = format!(
                "{} of the memory live at the failure was held by call sites that leak \
                 step by step (see the leak findings): without them this allocation \
                 would have had that much more room.",
                fmt_bytes(leaked_at_oom)
            );
        }
        let leaks = self.growth.leaks_on(f.device).0;
        match f.evidence.as_mut() {
            // Tensors that leak on the device grow too: the reserve's growth is not only the
            // cache's unused part, and the words never say the tensors are freed.
            Some(Evidence::Fragmentation(e))
                if leaks > 0 && e.gap_slope_bytes_per_step.is_some() =>
            {
                f.hint = fragmentation::gap_hint(e, leaks);
            }
            Some(Evidence::DeviceGrowth(_))
                if self.fragmentation.gap_growing(f.device) && leaks == 0 =>
            {
                // The reserve grows away from the tensors: what grows is the cache's unused
                // part, not memory any line holds.
                f.cause = Cause::Fragmented;
                f.hint = FRAGMENTED_DEVICE_HINT.into();
            }
            Some(Evidence::Leak(e)) => {
                e.cache_grew_at = self.device_growth.grew_at(f.device).to_vec();
            }
            _ => {}
        }
    }

    /// The leaks kept by one object on each device now ([`together`]): the leak detector's
    /// sites read with what the anatomy says each made.
    fn kept_together(&self, p: &Process) -> Vec<(i16, together::Group)> {
        let leaks = self.growth.leaks_by_step();
        let mut out = Vec::new();
        let mut i = 0;
        while i < leaks.len() {
            let device = leaks[i].1;
            let n = leaks[i..].iter().take_while(|l| l.1 == device).count();
            if !(2..=together::MAX_MEMBERS).contains(&n) {
                i += n;
                continue;
            }
            let members: Vec<together::Member<'_>> = leaks[i..i + n]
                .iter()
                .map(|&(site, _, by_step)| together::Member {
                    site,
                    by_step,
                    made: self.anatomy.site_made(site),
                    path: together::python_path(p, site),
                })
                .collect();
            out.extend(together::groups(&members).into_iter().map(|g| (device, g)));
            i += n;
        }
        out
    }

    /// Whether a call site is reported as a leak now, by either per-site detector.
    pub fn is_leak(&self, site: SiteId, device: i16) -> bool {
        self.growth.is_leak(site, device) || self.site_growth.is_leak(site, device)
    }

    /// What to tell the user once `failed` is set.
    pub fn failure_warning(pid: u32) -> String {
        format!(
            "oomtrace: internal error in the detectors for process {pid}; going on without \
             leak detection for it (please report this)"
        )
    }

    /// Runs the detectors' per-epoch work for the epoch the clock just closed.
    fn end_epoch(&mut self, p: &Process, ts: u64) {
        let ctx = Context {
            epoch: self.clock.epoch.saturating_sub(1),
            ts_ns: ts,
            clock: &self.clock,
            devices: &p.devices,
            ended: p.end != EndState::Running,
        };
        let first = self.alerts.list.len();
        self.growth.on_epoch_end(&ctx, &mut self.alerts);
        // Leaks kept by one object: one line, at the keeper's.
        let kept = self.kept_together(p);
        merge_alerts(&mut self.alerts, first, &kept, &self.growth, &ctx);
        // After the leaks: a site they report is theirs, and their generations say whether a
        // site's allocations survive.
        self.site_growth
            .on_epoch_end_after_leaks(&ctx, &self.growth, &mut self.alerts);
        // After the leaks: device growth reads their generations and findings, the leaks kept
        // by one object counted once.
        let leaks = KeptOnce {
            leaks: &self.growth,
            kept: &kept,
        };
        self.device_growth
            .on_epoch_end_after_leaks(&ctx, &leaks, &mut self.alerts);
        self.fragmentation.on_epoch_end(&ctx, &mut self.alerts);
        self.threshold.on_epoch_end(&ctx, &mut self.alerts);
    }
}

/// The leak detector as the device-growth detector reads it, with the leaks that one object
/// keeps counted as the one finding they are (a device growth is then "explained by 1 leak
/// finding", as the report has one).
struct KeptOnce<'a> {
    leaks: &'a growth::GrowthDetector,
    kept: &'a [(i16, together::Group)],
}

impl Leaks for KeptOnce<'_> {
    fn born_between(&self, device: i16, from: u32, upto: u32) -> Vec<leaks::GrewAt> {
        self.leaks.born_between(device, from, upto)
    }

    fn leaks_on(&self, device: i16) -> (u32, f64) {
        let (n, slope) = self.leaks.leaks_on(device);
        let parts: usize = self
            .kept
            .iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, g)| g.members.len().saturating_sub(1))
            .sum();
        (
            n.saturating_sub(u32::try_from(parts).unwrap_or(u32::MAX)),
            slope,
        )
    }

    fn reported(&self, site: SiteId, device: i16) -> bool {
        self.leaks.reported(site, device)
    }

    fn generations(&self, site: SiteId, device: i16, from: u32, upto: u32) -> u32 {
        self.leaks.generations(site, device, from, upto)
    }
}

/// The leak alerts raised since `first` whose sites one object keeps together: the keeper's
/// becomes the group's (its parts listed, the sums), the others' are not said (the keeper's
/// line says them).
fn merge_alerts(
    alerts: &mut Alerts,
    first: usize,
    kept: &[(i16, together::Group)],
    leaks: &growth::GrowthDetector,
    ctx: &Context<'_>,
) {
    if kept.is_empty() || alerts.list.len() <= first {
        return;
    }
    let raised = |a: &Alert| {
        a.finding.kind == Kind::Leak && matches!(a.change, Change::New | Change::Upgraded)
    };
    for (device, g) in kept {
        let of_group = |a: &Alert| {
            raised(a)
                && a.finding.device == *device
                && g.members.iter().any(|m| m.0 == a.finding.site)
        };
        if let Some(k) = (first..alerts.list.len())
            .find(|&i| of_group(&alerts.list[i]) && alerts.list[i].finding.site == g.keeper)
        {
            let mut v: Vec<Finding> = g
                .members
                .iter()
                .filter_map(|m| leaks.finding_of(m.0, *device, ctx))
                .collect();
            if together::merge(&mut v, *device, g) {
                if let Some(f) = v.into_iter().find(|f| f.site == g.keeper) {
                    alerts.list[k].finding = f;
                }
            }
        }
        let mut i = first;
        while i < alerts.list.len() {
            let a = &alerts.list[i];
            if of_group(a) && g.is_part(a.finding.site) {
                alerts.list.remove(i);
            } else {
                i += 1;
            }
        }
    }
}

impl Analysis {
    /// A live allocation gone (freed, or become PyTorch's reserve), as the detectors see it.
    fn gone(&self, f: &Free) -> AllocObs {
        AllocObs {
            device: f.device,
            site: f.site,
            size: f.size,
            api: f.api,
            epoch: self.clock.epoch,
            ts_ns: f.ts_ns,
            device_live: f.device_live,
            capacity: f.capacity,
        }
    }
}

impl Observer for Analysis {
    fn alloc(&mut self, p: &Process, a: &Alloc) -> u32 {
        if !self.sees() {
            return BEFORE_WINDOW;
        }
        if self.window == Window::Open {
            // Told before the model counts it.
            let d = p.devices.get(&a.device);
            let (device, tensors) = if a.api.memory_class() == MemoryClass::Tensor {
                let tensors = d.map_or(0, |d| d.tensor_bytes).saturating_add(a.size);
                (d.map_or(0, device_bytes), tensors)
            } else if a.api.memory_class().on_device() {
                (a.device_live_before.saturating_add(a.size), 0)
            } else {
                (0, 0)
            };
            let w = self.window_peaks.entry(a.device).or_default();
            w.peak_bytes = w.peak_bytes.max(device);
            w.tensor_peak_bytes = w.tensor_peak_bytes.max(tensors);
        }
        if self.failed {
            return self.clock.epoch;
        }
        if self
            .clock
            .on_alloc(a.site, a.tid, a.ts_ns, a.device_live_before)
        {
            self.end_epoch(p, a.ts_ns);
            // Without step markers (a snapshot) the epochs found are the anatomy's steps too.
            if p.never_marks_steps() {
                self.anatomy.on_step(a.ts_ns);
            }
        }
        let obs = AllocObs {
            device: a.device,
            site: a.site,
            size: a.size,
            api: a.api,
            epoch: self.clock.epoch,
            ts_ns: a.ts_ns,
            // A tracker tensor sits inside a segment already counted.
            device_live: if a.api.memory_class() == MemoryClass::Tensor {
                a.device_live_before
            } else {
                a.device_live_before.saturating_add(a.size)
            },
            capacity: a.capacity,
        };
        self.growth.on_alloc(&obs, &mut self.alerts);
        self.site_growth.on_alloc(&obs, &mut self.alerts);
        self.device_growth.on_alloc(&obs, &mut self.alerts);
        self.fragmentation.on_alloc(&obs, &mut self.alerts);
        self.threshold.on_alloc(&obs, &mut self.alerts);
        self.anatomy.on_alloc(p, a);
        if let Some(r) = self.oom.take_retry(&obs) {
            self.fragmentation
                .on_retry(&r, obs.epoch, obs.ts_ns, &mut self.alerts);
        }
        self.clock.epoch
    }

    fn free(&mut self, p: &Process, f: &Free) {
        if self.failed || !self.sees() || f.birth == BEFORE_WINDOW {
            return;
        }
        self.anatomy.on_free(p, f);
        let obs = self.gone(f);
        if !f.reserve {
            // A segment of PyTorch's allocator left the leak detectors when it became reserve.
            self.growth.on_free(&obs, f.birth);
            self.site_growth.on_free(&obs, f.birth);
        }
        self.device_growth.on_free(&obs, f.birth);
        self.fragmentation.on_free(&obs, f.birth);
        self.threshold.on_free(&obs, f.birth);
        self.oom.on_free(&obs, f.birth);
    }

    /// The caching allocator's segment is reserve: the leak detectors forget it as if freed
    /// (a line's memory is its tensors, traced one by one); device totals, fragmentation and
    /// the OOM view keep it.
    fn reserve(&mut self, p: &Process, f: &Free) {
        if self.failed || !self.sees() || f.birth == BEFORE_WINDOW {
            return;
        }
        let obs = self.gone(f);
        self.growth.on_free(&obs, f.birth);
        self.site_growth.on_free(&obs, f.birth);
        // Told before the segment counts in the reserve: what the cache held unallocated
        // when it needed another segment.
        let unallocated = p.devices.get(&f.device).map_or(0, |d| {
            d.torch_reserved_bytes
                .unwrap_or(0)
                .saturating_sub(d.tensor_bytes)
        });
        self.fragmentation
            .on_segment(f.device, f.site, f.size, unallocated);
    }

    fn step(&mut self, p: &Process, ts_ns: u64) {
        if let Window::Waiting(label) = &self.window {
            if p.last_marker.as_deref() == Some(label.as_str()) {
                self.window = Window::Open;
                // What each device holds as the window opens is its first peak.
                for (&device, d) in &p.devices {
                    self.window_peaks.insert(
                        device,
                        WindowPeak {
                            peak_bytes: device_bytes(d),
                            tensor_peak_bytes: d.tensor_bytes,
                            bytes_at_start: device_bytes(d),
                            tensor_bytes_at_start: d.tensor_bytes,
                        },
                    );
                }
            }
            return;
        }
        if self.failed {
            return;
        }
        self.clock.on_marker(ts_ns);
        self.end_epoch(p, ts_ns);
        self.anatomy.on_step(ts_ns);
    }

    fn out_of_memory(&mut self, p: &Process, o: &OutOfMemory) {
        if !self.sees() {
            return;
        }
        if !self.failed {
            self.anatomy.on_out_of_memory(p, o);
        }
        let record = refusal::OomRecord {
            seq: o.seq,
            ts_ns: o.ts_ns,
            epoch: self.clock.epoch,
            api: o.api,
            result: o.result,
            device: o.device,
            size: o.size,
            site: o.site,
            tid: o.tid,
            free_bytes: None,
            total_bytes: None,
            live_bytes: o.live_bytes,
            allowed_bytes: o.allowed_bytes,
            capacity_bytes: p.devices.get(&o.device).and_then(|d| d.capacity),
            torch_reserved_bytes: p
                .devices
                .get(&o.device)
                .filter(|d| d.tensor_tally.allocations > 0)
                .and_then(|d| d.torch_reserved_bytes),
            tensor_bytes: p
                .devices
                .get(&o.device)
                .filter(|d| d.tensor_tally.allocations > 0)
                .map(|d| d.tensor_bytes),
            top_sites: if self.oom.keeps_next() {
                p.top_holders(o.device, oom::TOP_SITES)
            } else {
                Vec::new()
            },
            recovered: None,
        };
        self.oom.on_failure(record, &mut self.alerts);
    }

    fn mem_info(&mut self, _p: &Process, m: &MemInfo) {
        if !self.sees() {
            return;
        }
        // The reading the shim takes right after a failure belongs to it.
        if let Some(r) = self.oom.on_meminfo(m.device, m.tid, m.free, m.total) {
            self.fragmentation.on_failure_info(r, &mut self.alerts);
        }
    }

    /// PyTorch's own allocated and reserved, read after a step marker: fragmentation judges
    /// its reserve against its tensors with them when tensors are not traced.
    fn torch_memory(&mut self, _p: &Process, m: &TorchMemory) {
        if self.failed || !self.sees() {
            return;
        }
        self.fragmentation.torch_memory(m);
    }

    /// Applies the frame; a panic inside (a detector bug) switches the analysis off for this
    /// process instead of losing it: its accounting and its trace go on.
    fn apply_frame(&mut self, p: &mut Process, frame: &Frame<'_>) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.apply(frame, self)));
        if r.is_err() {
            self.failed = true;
        }
    }
}

#[cfg(test)]
mod tests;
