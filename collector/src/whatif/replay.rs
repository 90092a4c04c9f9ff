//! A trace replayed through [`Allocator`] models: each process's tensor requests and frees, in
//! order, per device, through one model per setting asked about, in one pass over the file.
//!
//! What the trace gives (the shim's `recording::torch_*`, from PyTorch's own trace entries):
//! - `Alloc` with `Api::oomtrace_torch_alloc`: a tensor (`ptr`, `size` = bytes requested,
//!   `aux` = stream), PyTorch's `ALLOC`;
//! - `Free` with `Api::oomtrace_torch_free`: its block went back to the cache (`ptr`), PyTorch's
//!   `FREE_COMPLETED` (after the other streams that used it are done, so `record_stream` delays
//!   are in the trace's order already);
//! - `AllocFailed` with `Api::oomtrace_torch_alloc` and result 2: PyTorch raised
//!   `OutOfMemoryError` for `size` bytes (already rounded);
//! - `Segment` / `SegmentFree`: the reserve PyTorch really held (the recorded peak);
//! - `MemInfo`: the device's total and free memory, whence the limit each model runs under.
//! - On PyTorch's OOM, `extra`: what its allocator was allowed to reserve, as its out-of-memory
//!   observer said. Below the device's total it is the cap the program set with
//!   `torch.cuda.set_per_process_memory_fraction`: every model of that process and device runs
//!   under it from the process's start (a first pass over the file finds it: PyTorch fixes
//!   the cap when the program sets it, usually first thing, and the trace learns it only at the
//!   OOM; a cap set midway is replayed as if set from the start), unless the setting asked
//!   about names its own `per_process_memory_fraction`.
//!
//! The limit: the device total less what the process's own other CUDA allocations hold now
//! (tracked allocations that are not PyTorch's segments: cuBLAS workspaces, NCCL buffers,
//! extensions' cudaMalloc) less what the driver last said was in use beyond everything the
//! process had allocated (its context, other processes). Before the first `MemInfo` nothing is
//! known and nothing fails.
//!
//! A recorded OOM is replayed as the same request: if the model refuses it too it "would still
//! happen"; if not, the model hands the block out and takes it back at once, since the program
//! never had that tensor (what it did next, after its exception, is what the trace goes on
//! with). A request the program was granted but the model refuses is a new OOM under that
//! setting; the replay goes on without that tensor, and what follows is counted as if the
//! program had survived it (`new_ooms` says so).
//!
//! Sizes are whatever the file holds: a request (or a reserve) past 2^64 - 1 bytes is refused
//! by the model, as by any driver, and counted apart (`past_64_bits`) when no device limit was
//! known to refuse it; PyTorch's segments adding up past 2^64 - 1 are a warning. Nothing
//! saturates into a peak silently.

use std::collections::BTreeMap;
use std::path::Path;

use oomtrace_proto::{Api, EventKind};
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::allocator::Allocator;
use super::conf::{AllocConf, Backend};
use super::Error;
use crate::model::history::{self, Seen};
use crate::model::trace::Trace;
use crate::model::Process;

/// How far the replay of a run's own setting may land from the peak reserve the run really
/// held before a prediction says so (`own_setting_check`, a warning).
pub const OWN_SETTING_TOLERANCE: f64 = 0.02;

/// What PyTorch's allocator failure reads as (CUDA_ERROR_OUT_OF_MEMORY).
const OUT_OF_MEMORY: i32 = 2;
/// New OOMs listed per device (all are counted).
const MAX_NEW_OOMS: usize = 16;

/// The prediction for one setting: the `oomtrace whatif --json` document.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    /// 1: fields are added, never renamed.
    pub version: u32,
    /// The setting replayed: the string given, or each process's recorded one (the same for
    /// all, or "recorded" when they differ; see each process's `alloc_conf`).
    pub alloc_conf: String,
    pub processes: Vec<ProcessPrediction>,
}

/// Where a process's setting came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfSource {
    /// Asked about (`--alloc-conf`).
    Given,
    /// The process's own `PYTORCH_ALLOC_CONF` / `PYTORCH_CUDA_ALLOC_CONF`, as the trace
    /// recorded it (unset: PyTorch's defaults).
    Recorded,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessPrediction {
    pub pid: u32,
    /// The setting this process was replayed with ("" = PyTorch's defaults).
    pub alloc_conf: String,
    pub alloc_conf_source: ConfSource,
    pub devices: Vec<DevicePrediction>,
    /// What the reader should know about this process's prediction, one sentence each.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DevicePrediction {
    pub device: i16,
    /// The largest reserve (`torch.cuda.max_memory_reserved()`) the setting would reach.
    pub peak_reserved_bytes: u64,
    /// The largest `torch.cuda.max_memory_allocated()` under it (rounded blocks in use).
    pub peak_allocated_bytes: u64,
    /// The largest reserve the program really held, from PyTorch's own segment events.
    pub recorded_peak_reserved_bytes: u64,
    /// Each OOM the program had, in order, and whether the setting would still have it.
    pub ooms: Vec<OomPrediction>,
    /// Requests the program was granted that the setting would refuse (first ones listed).
    pub new_ooms: Vec<NewOom>,
    pub new_oom_count: u64,
    /// Tensor requests replayed.
    pub requests: u64,
    /// The device's total memory as the driver reported it (null: never reported, so no OOM
    /// could be predicted).
    pub device_total_bytes: Option<u64>,
    /// The reserve at the end of the trace, under the setting.
    pub reserved_at_end_bytes: u64,
    /// Requests the model refused only because they would take it past 2^64 - 1 bytes
    /// (null: none).
    pub past_64_bits: Option<Past64Bits>,
    /// The replay of the run's own setting beside the peak reserve the run held, when the
    /// two differ by more than [`OWN_SETTING_TOLERANCE`] (absent: they agree): the model
    /// missed something of this run, and every prediction for it is off by about as much.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_setting_check: Option<OwnSettingCheck>,
    /// The memory cap the program set itself (`torch.cuda.set_per_process_memory_fraction`),
    /// in bytes, as its OOM said it: the replay ran under it (absent: none seen, or the
    /// setting replayed names its own `per_process_memory_fraction`, which replaces it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program_cap_bytes: Option<u64>,
}

/// The run's own setting replayed, against what the run reserved.
#[derive(Clone, Debug, Serialize)]
pub struct OwnSettingCheck {
    pub replayed_peak_reserved_bytes: u64,
    pub recorded_peak_reserved_bytes: u64,
    /// (replayed - recorded) / recorded.
    pub off_by: f64,
    /// What the trace shows that the model cannot replay, one phrase each (may be empty).
    pub why: Vec<String>,
}

/// Requests past what 64 bits count: rounded, with their segment, or with the reserve, more
/// than 2^64 - 1 bytes, and no device size known to refuse them. No device holds that, so the
/// model refuses each as out of memory (in `ooms` or `new_ooms`), as a driver would, rather
/// than saturate into a peak no device has; the line says the prediction met that bound.
#[derive(Clone, Debug, Serialize)]
pub struct Past64Bits {
    pub count: u64,
    /// The first one: the request as the trace holds it, and when.
    pub request_bytes: u64,
    pub at_s: f64,
    /// The run was granted it: then the trace's sizes are not a real device's.
    pub granted: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct OomPrediction {
    /// The request PyTorch could not serve (rounded, as PyTorch reports it).
    pub request_bytes: u64,
    pub would_still_happen: bool,
    /// Seconds into the process.
    pub at_s: f64,
    /// The reserve and allocated bytes under the setting at that request (after the cache was
    /// emptied when it still fails).
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// What the device left to the allocator then (null: unknown).
    pub limit_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NewOom {
    pub request_bytes: u64,
    pub at_s: f64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub limit_bytes: Option<u64>,
}

/// One device of one process: a model per setting and the recorded reserve.
struct DeviceRun {
    models: Vec<Model>,
    recorded_reserved: u64,
    recorded_peak: u64,
    /// Bytes in use on the device that neither this process's tracked allocations nor the
    /// allocator hold (context, other processes), from the last `MemInfo`.
    unseen: u64,
    total: Option<u64>,
    /// PyTorch's segments in the trace added up past 2^64 - 1 bytes (warned once).
    recorded_past_64_bits: bool,
    /// Segments the run gave back to the driver.
    segments_given_back: u64,
}

struct Model {
    alloc: Allocator,
    ooms: Vec<OomPrediction>,
    new_ooms: Vec<NewOom>,
    new_oom_count: u64,
    requests: u64,
    past_64_bits: Option<Past64Bits>,
}

impl Model {
    /// Counts a refusal that was the 64-bit bound's (see [`Past64Bits`]).
    fn past_64_bits(&mut self, request_bytes: u64, at_s: f64, granted: bool) {
        match &mut self.past_64_bits {
            Some(p) => p.count += 1,
            None => {
                self.past_64_bits = Some(Past64Bits {
                    count: 1,
                    request_bytes,
                    at_s,
                    granted,
                })
            }
        }
    }
}

struct ProcessRun {
    pid: u32,
    first_ts_ns: u64,
    /// One setting per asked one, each with where it came from.
    confs: Vec<(AllocConf, ConfSource)>,
    devices: BTreeMap<i16, DeviceRun>,
    warnings: Vec<String>,
    /// The memory caps the program set itself, by device ([`program_caps`]).
    caps: BTreeMap<i16, u64>,
}

/// The setting a process recorded: its two variables from the Hello, as torch reads them.
pub fn recorded_conf(p: &Process) -> (Result<AllocConf, String>, String) {
    let var = |name: &str| {
        p.hello
            .launch
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let (cuda, generic) = (var("PYTORCH_CUDA_ALLOC_CONF"), var("PYTORCH_ALLOC_CONF"));
    let shown = match (cuda, generic) {
        (Some(c), Some(g)) if c != g => {
            format!("PYTORCH_ALLOC_CONF={g} PYTORCH_CUDA_ALLOC_CONF={c}")
        }
        _ => generic.or(cuda).unwrap_or("").to_string(),
    };
    (
        AllocConf::from_env(cuda, generic).map_err(|e| e.to_string()),
        shown,
    )
}

/// The memory caps each process set itself, by connection and device: the least that its
/// out-of-memory observer said its allocator was allowed to reserve, where that is less than
/// the device's total (its `MemInfo` readings). An event-only first pass over the file (no
/// model): see the module comment.
fn program_caps(path: &Path) -> Result<FxHashMap<u32, BTreeMap<i16, u64>>, Error> {
    let mut allowed: FxHashMap<(u32, i16), u64> = FxHashMap::default();
    let mut totals: FxHashMap<(u32, i16), u64> = FxHashMap::default();
    let mut scan = |p: &mut Process, _: &mut (), frame: &oomtrace_proto::wire::Frame<'_>| {
        let oomtrace_proto::wire::Frame::Events(batch) = frame else {
            return;
        };
        for ev in batch.iter() {
            match (ev.kind(), ev.api()) {
                (Some(EventKind::MemInfo), _) if ev.size != 0 => {
                    totals.insert((p.conn, ev.device), ev.size);
                }
                (Some(EventKind::AllocFailed), Api::oomtrace_torch_alloc) if ev.extra != 0 => {
                    let a = allowed.entry((p.conn, ev.device)).or_insert(u64::MAX);
                    *a = (*a).min(ev.extra);
                }
                _ => {}
            }
        }
    };
    Trace::<()>::load_with(path, &mut scan, &mut |_, _| {})?;
    let mut caps: FxHashMap<u32, BTreeMap<i16, u64>> = FxHashMap::default();
    for ((conn, device), a) in allowed {
        if totals.get(&(conn, device)).is_some_and(|&t| a < t) {
            caps.entry(conn).or_default().insert(device, a);
        }
    }
    Ok(caps)
}

impl ProcessRun {
    /// `asked`: the settings replayed; `asked_own`: whether the user asked for the run's own
    /// (its warnings about it are said only then).
    fn new(
        p: &Process,
        asked: &[Option<AllocConf>],
        asked_own: bool,
        caps: BTreeMap<i16, u64>,
    ) -> ProcessRun {
        let mut warnings = Vec::new();
        let (recorded, shown) = recorded_conf(p);
        let recorded = match recorded {
            Ok(c) => c,
            Err(e) => {
                if asked_own {
                    warnings.push(format!(
                        "its recorded setting {shown:?} cannot be read ({e}): replayed with \
                         PyTorch's defaults instead"
                    ));
                }
                AllocConf {
                    source: shown,
                    ..AllocConf::default()
                }
            }
        };
        if asked_own && recorded.backend == Backend::CudaMallocAsync {
            warnings.push(
                "it ran with backend:cudaMallocAsync, which is not PyTorch's caching allocator: \
                 its own setting is replayed as the native allocator's defaults"
                    .to_string(),
            );
        }
        let confs: Vec<(AllocConf, ConfSource)> = asked
            .iter()
            .map(|c| match c {
                Some(c) => (c.clone(), ConfSource::Given),
                None => (recorded.clone(), ConfSource::Recorded),
            })
            .collect();
        if confs.iter().any(|(c, _)| c.throw_on_cudamalloc_oom) {
            warnings.push(
                "throw_on_cudamalloc_oom is not modelled: the prediction frees the cache and \
                 retries before an OOM, as the default does"
                    .to_string(),
            );
        }
        if caps.is_empty()
            && confs.iter().any(|(c, _)| {
                c.garbage_collection_threshold > 0.0 && c.per_process_memory_fraction.is_none()
            })
        {
            warnings.push(
                "garbage_collection_threshold acts only with a memory fraction \
                 (per_process_memory_fraction, or torch.cuda.set_per_process_memory_fraction, \
                 which a trace learns only from an out-of-memory under it): without one it \
                 changes nothing"
                    .to_string(),
            );
        }
        ProcessRun {
            pid: p.pid(),
            // Seconds count from the process's start (its Hello), or its first event.
            first_ts_ns: match p.hello.start_mono_ns {
                0 => p.first_ts_ns,
                t => t,
            },
            confs,
            devices: BTreeMap::new(),
            warnings,
            caps,
        }
    }

    fn device(&mut self, device: i16) -> &mut DeviceRun {
        let confs = &self.confs;
        let cap = self.caps.get(&device).copied();
        self.devices.entry(device).or_insert_with(|| DeviceRun {
            models: confs
                .iter()
                .map(|(c, _)| Model {
                    alloc: {
                        let mut a = Allocator::new(c.clone(), None);
                        if let Some(cap) = cap {
                            a.set_program_cap(cap);
                        }
                        a
                    },
                    ooms: Vec::new(),
                    new_ooms: Vec::new(),
                    new_oom_count: 0,
                    requests: 0,
                    past_64_bits: None,
                })
                .collect(),
            recorded_reserved: 0,
            recorded_peak: 0,
            unseen: 0,
            total: None,
            recorded_past_64_bits: false,
            segments_given_back: 0,
        })
    }
}

/// What the allocator may hold on `device` now (see the module comment).
fn limit(p: &Process, run: &DeviceRun, device: i16) -> Option<u64> {
    let total = run.total?;
    let d = p.devices.get(&device);
    let live = d.map_or(0, |d| d.live_bytes);
    let torch = d.and_then(|d| d.torch_reserved_bytes).unwrap_or(0);
    let others = live.saturating_sub(torch);
    Some(total.saturating_sub(run.unseen).saturating_sub(others))
}

/// The check of the model on one device: its replay of the run's own setting against the peak
/// reserve the run held, when they differ by more than [`OWN_SETTING_TOLERANCE`], with what the
/// trace shows that the model cannot replay.
fn own_setting_check(m: &Model, d: &DeviceRun, p: Option<&Process>) -> Option<OwnSettingCheck> {
    let recorded = d.recorded_peak;
    // Sizes past 64 bits are said on their own: no real device's peak to check against.
    if recorded == 0 || d.recorded_past_64_bits || m.past_64_bits.is_some() {
        return None;
    }
    let replayed = m.alloc.peak_reserved();
    let off_by = (replayed as f64 - recorded as f64) / recorded as f64;
    if off_by.abs() <= OWN_SETTING_TOLERANCE {
        return None;
    }
    let mut why = Vec::new();
    if d.segments_given_back > 0 {
        why.push(format!(
            "the run gave {} segment{} back to the driver, by torch.cuda.empty_cache() or a \
             retry before an out-of-memory, and the replay gives segments back only before an \
             out-of-memory",
            d.segments_given_back,
            if d.segments_given_back == 1 { "" } else { "s" }
        ));
    }
    if let Some(p) = p {
        if p.lost_events() > 0 {
            why.push(format!("the trace lost {} events", p.lost_events()));
        }
        if p.unmatched_frees > 0 {
            why.push(format!(
                "{} frees of memory allocated before tracing began (tensors made before the \
                 tracker attached are not in the trace)",
                p.unmatched_frees
            ));
        }
        if recorded_conf(p)
            .0
            .is_ok_and(|c| c.backend == Backend::CudaMallocAsync)
        {
            why.push("the run used backend:cudaMallocAsync".to_string());
        }
    }
    Some(OwnSettingCheck {
        replayed_peak_reserved_bytes: replayed,
        recorded_peak_reserved_bytes: recorded,
        off_by,
        why,
    })
}

impl OwnSettingCheck {
    /// The warning line: how far, and why if the trace says.
    pub fn sentence(&self, device: i16) -> String {
        let why = if self.why.is_empty() {
            String::new()
        } else {
            format!("; why: {}", self.why.join("; "))
        };
        format!(
            "on cuda:{device} the replay of the run's own setting reaches a peak reserve of {} \
             where the run reserved {} ({:+.1} %), so its predictions here are off by about as \
             much{why}",
            crate::units::fmt_bytes(self.replayed_peak_reserved_bytes),
            crate::units::fmt_bytes(self.recorded_peak_reserved_bytes),
            100.0 * self.off_by
        )
    }
}

/// Replays the trace at `path` through one model per setting (`None`: each process's recorded
/// setting), and returns one prediction per setting, in order.
pub fn predict(path: &Path, confs: &[Option<AllocConf>]) -> Result<Vec<Prediction>, Error> {
    for c in confs.iter().flatten() {
        if c.backend == Backend::CudaMallocAsync {
            return Err(Error::Unmodelled(
                "backend:cudaMallocAsync is CUDA's own stream-ordered allocator, not PyTorch's \
                 caching allocator: whatif models only the native one"
                    .to_string(),
            ));
        }
    }
    // The run's own setting is always replayed too: what checks the model against the peak
    // reserve the run really held (`own_setting_check`).
    let mut all: Vec<Option<AllocConf>> = confs.to_vec();
    let own = match confs.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            all.push(None);
            all.len() - 1
        }
    };
    let asked_own = own < confs.len();
    let mut caps = program_caps(path)?;
    let mut runs: FxHashMap<u32, ProcessRun> = FxHashMap::default();
    let mut order: Vec<u32> = Vec::new();
    let mut tensor_events = 0u64;
    let trace = history::replay(path, |p, seen| {
        let Seen::Event { event: ev, .. } = seen else {
            return;
        };
        let run = runs.entry(p.conn).or_insert_with(|| {
            order.push(p.conn);
            ProcessRun::new(p, &all, asked_own, caps.remove(&p.conn).unwrap_or_default())
        });
        if run.first_ts_ns == 0 {
            run.first_ts_ns = ev.ts_ns;
        }
        let at_s = ev.ts_ns.saturating_sub(run.first_ts_ns) as f64 / 1e9;
        let Some(kind) = ev.kind() else { return };
        match (kind, ev.api()) {
            (EventKind::MemInfo, _) => {
                let dev = run.device(ev.device);
                let live = p.devices.get(&ev.device).map_or(0, |d| d.live_bytes);
                dev.total = Some(ev.size);
                dev.unseen = ev.size.saturating_sub(ev.ptr).saturating_sub(live);
                for m in &mut dev.models {
                    m.alloc.set_device_total(ev.size);
                }
            }
            (EventKind::Segment, Api::oomtrace_torch_segment) => {
                let device = ev.device;
                let dev = run.device(device);
                let reserved = dev.recorded_reserved.checked_add(ev.size);
                let first_past = reserved.is_none() && !dev.recorded_past_64_bits;
                dev.recorded_past_64_bits |= reserved.is_none();
                dev.recorded_reserved = reserved.unwrap_or(u64::MAX);
                dev.recorded_peak = dev.recorded_peak.max(dev.recorded_reserved);
                if first_past {
                    run.warnings.push(format!(
                        "on cuda:{device} PyTorch's segments in the trace add up to more than \
                         2^64 - 1 bytes, which no device holds: its recorded peak stops there, \
                         and the trace's sizes are not a real device's"
                    ));
                }
            }
            (EventKind::SegmentFree, Api::oomtrace_torch_segment) => {
                let dev = run.device(ev.device);
                dev.recorded_reserved = dev.recorded_reserved.saturating_sub(ev.size);
                dev.segments_given_back += 1;
            }
            (EventKind::Alloc, Api::oomtrace_torch_alloc) => {
                tensor_events += 1;
                let device = ev.device;
                let dev = run.device(device);
                let lim = limit(p, dev, device);
                for m in &mut dev.models {
                    m.requests += 1;
                    m.alloc.set_limit(lim.unwrap_or(u64::MAX));
                    if let Err(e) = m.alloc.malloc(ev.ptr, ev.size, ev.aux) {
                        if e.past_64_bits {
                            m.past_64_bits(ev.size, at_s, true);
                        }
                        m.new_oom_count += 1;
                        if m.new_ooms.len() < MAX_NEW_OOMS {
                            m.new_ooms.push(NewOom {
                                request_bytes: e.size,
                                at_s,
                                reserved_bytes: e.reserved,
                                allocated_bytes: e.allocated,
                                limit_bytes: lim,
                            });
                        }
                    }
                }
            }
            (EventKind::Free, Api::oomtrace_torch_free) => {
                tensor_events += 1;
                let dev = run.device(ev.device);
                for m in &mut dev.models {
                    m.alloc.free(ev.ptr);
                }
            }
            (EventKind::AllocFailed, Api::oomtrace_torch_alloc) if ev.result == OUT_OF_MEMORY => {
                tensor_events += 1;
                let device = ev.device;
                let dev = run.device(device);
                let lim = limit(p, dev, device);
                // A key no tensor of the trace has: addresses are never this high.
                let key = u64::MAX - 1;
                for m in &mut dev.models {
                    m.requests += 1;
                    m.alloc.set_limit(lim.unwrap_or(u64::MAX));
                    let outcome = m.alloc.malloc(key, ev.size, ev.aux);
                    let (reserved_bytes, allocated_bytes) = match outcome {
                        Err(e) => {
                            if e.past_64_bits {
                                m.past_64_bits(ev.size, at_s, false);
                            }
                            (e.reserved, e.allocated)
                        }
                        Ok(()) => {
                            let held = (m.alloc.reserved(), m.alloc.allocated());
                            m.alloc.free(key);
                            held
                        }
                    };
                    m.ooms.push(OomPrediction {
                        request_bytes: ev.size,
                        would_still_happen: outcome.is_err(),
                        at_s,
                        reserved_bytes,
                        allocated_bytes,
                        limit_bytes: lim,
                    });
                }
            }
            _ => {}
        }
    })?;
    if tensor_events == 0 {
        return Err(Error::NoTensors(path.to_path_buf()));
    }
    // Processes in the report's order (by connection), not in the order their first event
    // reached the file.
    order.sort_unstable();
    let mut predictions = Vec::with_capacity(confs.len());
    for (i, asked) in confs.iter().enumerate() {
        let mut processes = Vec::new();
        for conn in &order {
            let run = &runs[conn];
            let devices: Vec<DevicePrediction> = run
                .devices
                .iter()
                .filter(|(_, d)| d.models[i].requests > 0 || d.recorded_peak > 0)
                .map(|(&device, d)| {
                    let m = &d.models[i];
                    DevicePrediction {
                        device,
                        peak_reserved_bytes: m.alloc.peak_reserved(),
                        peak_allocated_bytes: m.alloc.peak_allocated(),
                        recorded_peak_reserved_bytes: d.recorded_peak,
                        ooms: m.ooms.clone(),
                        new_ooms: m.new_ooms.clone(),
                        new_oom_count: m.new_oom_count,
                        requests: m.requests,
                        device_total_bytes: d.total,
                        reserved_at_end_bytes: m.alloc.reserved(),
                        past_64_bits: m.past_64_bits.clone(),
                        own_setting_check: own_setting_check(
                            &d.models[own],
                            d,
                            trace.processes.iter().find(|p| p.conn == *conn),
                        ),
                        program_cap_bytes: run
                            .caps
                            .get(&device)
                            .copied()
                            .filter(|_| run.confs[i].0.per_process_memory_fraction.is_none()),
                    }
                })
                .collect();
            if devices.is_empty() {
                continue;
            }
            let (conf, source) = &run.confs[i];
            let mut warnings = run.warnings.clone();
            for d in &devices {
                if let Some(c) = &d.own_setting_check {
                    warnings.push(c.sentence(d.device));
                }
            }
            processes.push(ProcessPrediction {
                pid: run.pid,
                alloc_conf: conf.source.clone(),
                alloc_conf_source: *source,
                devices,
                warnings,
            });
        }
        let alloc_conf = match asked {
            Some(c) => c.source.clone(),
            None => {
                let mut all = processes.iter().map(|p| p.alloc_conf.as_str());
                let first = all.next().unwrap_or("");
                if all.all(|s| s == first) {
                    first.to_string()
                } else {
                    "recorded".to_string()
                }
            }
        };
        predictions.push(Prediction {
            version: 1,
            alloc_conf,
            processes,
        });
    }
    Ok(predictions)
}
