//! Fragmentation (docs/detection.md): memory that is there but cannot be used.
//!
//! Three signals, per device:
//! - **Allocator retries**: an allocation failed, the program freed memory, and the same
//!   size then succeeded: PyTorch's caching allocator does exactly this (free cached
//!   blocks, retry) before it gives up. Each one is a device synchronization. Retries in
//!   ≥ 2 of the last 3 epochs are thrashing.
//! - **Failure with free memory**: the driver reported at least the requested size free
//!   right after refusing it: free memory not in one piece.
//! - **Reserved-minus-live creep** (only with oomtrace's trace tracker on PyTorch's caching
//!   allocator, which reports both tensors and segments): the allocator's reserve (its own
//!   segments, nothing else) rising by ≥ 2 MiB per epoch (Mann-Kendall p < 0.01) while the
//!   peak of live tensors does not (p > 0.1). Device memory outside the allocator (an
//!   extension's own cudaMalloc) is not reserve; under the swapped allocator (`--torch=swap`)
//!   there is no reserve to see, so no creep is judged there.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::oom::{OomRecord, Retry};
use super::stats::{mann_kendall, theil_sen};
use super::{
    Alert, Alerts, AllocObs, Cause, Change, Context, Detector, Evidence, Finding, Kind, Severity,
};
use crate::units::{fmt_bytes, fmt_rate};
use oomtrace_proto::Api;

const CREEP_MIN_SLOPE: f64 = (2u64 << 20) as f64;
const CREEP_WINDOW: usize = 16;
const CREEP_MIN_SAMPLES: usize = 6;

#[derive(Clone, Debug, Default, Serialize)]
pub struct FragEvidence {
    pub retries: u64,
    pub retry_epochs: Vec<u32>,
    /// Failures while the driver reported enough free memory.
    pub failures_with_free_memory: u64,
    pub largest_failed_request_bytes: u64,
    pub free_at_failure_bytes: Option<u64>,
    pub reserved_slope_bytes_per_step: Option<f64>,
    pub reserved_bytes: Option<u64>,
    pub live_tensor_bytes: Option<u64>,
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
    reserved: VecDeque<f64>,
    tensor_peaks: VecDeque<f64>,
    creep: bool,
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

    /// The driver's reading after a failure: enough free memory means fragmentation.
    pub fn on_failure_info(&mut self, r: &OomRecord, out: &mut Alerts) {
        let Some(free) = r.free_bytes.filter(|&f| f >= r.size) else {
            return;
        };
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

    /// PyTorch's own statistics of one device, read after a step marker.
    pub fn torch_memory(&mut self, _m: &crate::model::TorchMemory) {}
}

impl Detector for FragmentationDetector {
    fn on_alloc(&mut self, a: &AllocObs, _out: &mut Alerts) {
        if is_tensor_level(a.api) {
            let d = self.devices.entry(a.device).or_default();
            d.tensor_live = d.tensor_live.saturating_add(a.size);
            d.tensor_peak_epoch = d.tensor_peak_epoch.max(d.tensor_live);
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
            if d.tensor_peak_epoch == 0 && d.tensor_live == 0 {
                continue;
            }
            let Some(dev) = ctx.devices.get(&device) else {
                continue;
            };
            // The allocator's own segments; without them (the swapped allocator) there is
            // no reserve to judge.
            let Some(reserved) = dev.torch_reserved_bytes else {
                continue;
            };
            push(&mut d.reserved, reserved as f64);
            push(&mut d.tensor_peaks, d.tensor_peak_epoch as f64);
            d.tensor_peak_epoch = d.tensor_live;
            d.ev.reserved_bytes = Some(reserved);
            d.ev.live_tensor_bytes = Some(d.tensor_live);
            if ctx.epoch < super::growth::warmup_end(ctx) || d.reserved.len() < CREEP_MIN_SAMPLES {
                continue;
            }
            let r: Vec<f64> = d.reserved.iter().copied().collect();
            let a: Vec<f64> = d.tensor_peaks.iter().copied().collect();
            let mk_r = mann_kendall(&r);
            let slope = theil_sen(&r, mk_r.var, 0.95)
                .map(|t| t.slope)
                .unwrap_or(0.0);
            let creep = mk_r.p < 0.01 && slope >= CREEP_MIN_SLOPE && mann_kendall(&a).p > 0.1;
            if creep && !d.creep {
                d.creep = true;
                d.ev.reserved_slope_bytes_per_step = Some(slope);
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
    if let Some(s) = ev.reserved_slope_bytes_per_step.filter(|_| d.creep) {
        parts.push(format!(
            "reserved memory grows {} while live tensors do not",
            fmt_rate(s, None)
        ));
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
        bytes: ev.largest_failed_request_bytes,
        growth_bytes_per_step: ev.reserved_slope_bytes_per_step.filter(|_| d.creep),
        growth_bytes_per_s: None,
        steps: None,
        count: ev.retries + ev.failures_with_free_memory,
        api: None,
        message: format!("device {device}: {}", parts.join("; ")),
        hint: "Memory is reserved but not usable for the requests that come: free blocks of the \
               wrong size or place. With PyTorch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
               lets segments grow instead of splitting; otherwise allocate the largest, \
               long-lived buffers first and keep request sizes steady (pad dynamic shapes to a \
               few buckets)."
            .into(),
        evidence: Some(Evidence::Fragmentation(ev.clone())),
        record: None,
        culprit: None,
        backward_node: None,
        held: None,
    }
}

#[cfg(test)]
mod tests {
    use crate::analysis::{Analysis, Detector, Finding, Level, Severity};
    use crate::model::{Process, OUT_OF_MEMORY};
    use oomtrace_proto::wire::{Frame, Hello};
    use oomtrace_proto::{Api, Event, EventKind, StackId};

    /// A process and its analysis.
    struct Proc {
        p: Process,
        a: Analysis,
    }

    impl Proc {
        fn new() -> Proc {
            Proc {
                p: Process::new(1, Hello::default()),
                a: Analysis::default(),
            }
        }
        fn apply_event(&mut self, e: &Event) {
            self.p.apply_event(e, &mut self.a);
        }
        fn apply(&mut self, f: &Frame<'_>) {
            self.p.apply(f, &mut self.a);
        }
    }

    const MIB: u64 = 1 << 20;

    fn ev(kind: EventKind, api: Api, ptr: u64, size: u64, ts: u64) -> Event {
        let mut e = Event::new(kind, api);
        e.ptr = ptr;
        e.size = size;
        e.device = 0;
        e.ts_ns = ts;
        e
    }

    fn mark(p: &mut Proc, ts: u64) {
        p.apply(&Frame::Marker {
            seq: 0,
            ts_ns: ts,
            tid: 0,
            stack: StackId(0),
            label: "step".into(),
        });
    }

    fn frag(p: &Proc) -> Vec<Finding> {
        p.a.fragmentation.findings(&p.a.context(&p.p))
    }

    /// 20 steps: a 4 MiB cudaMalloc every step that is never freed (a segment of PyTorch's
    /// allocator when `segment`, else an extension's own buffer), while tensors (`alloc` /
    /// `free` APIs) come and go at a flat 8 MiB.
    fn creeping(segment: bool, alloc: Api, free: Api) -> Vec<Finding> {
        let mut p = Proc::new();
        let mut ts = 1;
        for step in 0..20u64 {
            ts += 10;
            let base = 0x1000_0000 + step * 0x100_0000;
            p.apply_event(&ev(EventKind::Alloc, Api::cudaMalloc, base, 4 * MIB, ts));
            if segment {
                let seg = ev(
                    EventKind::Segment,
                    Api::oomtrace_torch_segment,
                    base,
                    4 * MIB,
                    ts,
                );
                p.apply_event(&seg);
            }
            ts += 10;
            p.apply_event(&ev(EventKind::Alloc, alloc, 0x9000_0000, 8 * MIB, ts));
            ts += 10;
            p.apply_event(&ev(EventKind::Free, free, 0x9000_0000, 0, ts));
            mark(&mut p, ts + 5);
        }
        frag(&p)
    }

    #[test]
    fn reserved_creeping_while_tensors_stay_flat_is_fragmentation() {
        let f = creeping(true, Api::oomtrace_torch_alloc, Api::oomtrace_torch_free);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].message.contains("reserved memory grows"),
            "{}",
            f[0].message
        );
        assert!(f[0].growth_bytes_per_step.unwrap() >= 3.9 * MIB as f64);
    }

    /// Memory outside the tensor allocator (an extension's own cudaMalloc) is not reserve,
    /// with the tracker (which reports the allocator's segments) or the swapped allocator
    /// (which has none to report).
    #[test]
    fn memory_outside_the_allocator_is_not_reserve() {
        let tracker = creeping(false, Api::oomtrace_torch_alloc, Api::oomtrace_torch_free);
        assert!(tracker.is_empty(), "{tracker:?}");
        let swap = creeping(false, Api::oomtrace_malloc, Api::oomtrace_free);
        assert!(swap.is_empty(), "{swap:?}");
    }

    #[test]
    fn a_failure_with_enough_free_memory_is_fragmentation() {
        let mut p = Proc::new();
        let mut fail = ev(EventKind::AllocFailed, Api::cudaMalloc, 0, 64 * MIB, 10);
        fail.result = OUT_OF_MEMORY;
        fail.tid = 3;
        p.apply_event(&fail);
        let mut info = ev(
            EventKind::MemInfo,
            Api::cuMemGetInfo_v2,
            100 * MIB,
            1024 * MIB,
            11,
        );
        info.tid = 3;
        p.apply_event(&info);
        let f = frag(&p);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].level, Level::Severity(Severity::Error));
        assert!(f[0].message.contains("free"), "{}", f[0].message);
        // Without a retry it stays an OOM error too.
        let oom = p.a.oom.findings(&p.a.context(&p.p));
        assert_eq!(oom[0].level, Level::Severity(Severity::Error));
        assert!(oom[0].hint.contains("not in one piece"));
    }

    #[test]
    fn a_failure_without_enough_free_memory_is_not_fragmentation() {
        let mut p = Proc::new();
        let mut fail = ev(EventKind::AllocFailed, Api::cudaMalloc, 0, 64 * MIB, 10);
        fail.result = OUT_OF_MEMORY;
        p.apply_event(&fail);
        p.apply_event(&ev(
            EventKind::MemInfo,
            Api::cuMemGetInfo_v2,
            10 * MIB,
            1024 * MIB,
            11,
        ));
        assert!(frag(&p).is_empty());
    }
}
