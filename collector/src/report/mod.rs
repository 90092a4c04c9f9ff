//! The report: the `--json` contract (docs/json-report.md, version 1), built from a replayed
//! `Trace<Analysis>`: the model's accounting, the analysis's findings, completed from the
//! stacks ([`hints`]) and symbolized ([`symbolize`]). The live line ([`live`]) is the same
//! findings as they happen.
//!
//! Reads the model and the analysis; nothing inside the crate reads it but the top (the
//! server's live line). Field names are pinned by the contract; extra fields are allowed,
//! renames are not. Findings open with OOMs (what a user asks first after a crash), then the
//! call sites that still held memory when each process ended.

pub mod hints;
pub mod live;
pub mod merge;
pub mod module_file;
pub mod names;
pub mod ranks;
pub mod remedies;
pub mod roles;
pub mod sections;
pub mod symbolize;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

pub use crate::analysis::oom::{OomDetail, SiteShare};
use crate::analysis::{fragmentation, growth, trend, Analysis, Evidence, Severity};
pub use crate::analysis::{BackwardNode, Cause, Finding, Held, Kind, Level, PythonLine};
use crate::model::trace::Trace;
use crate::model::{EndState, FrameInfo, Process, SiteId, HOST_DEVICE};
use crate::units::fmt_bytes;
pub use hints::{
    device_growth_hint, fmt_python_lines, in_torch, python_lines, resolve_device_growth,
    thread_kind, torch_segments, traces_tensors, without_tensor_advice,
};
use oomtrace_proto::wire::GoodbyeReason;
use symbolize::{culprit, StackSymbolizer};

pub const REPORT_VERSION: u32 = 1;

/// `processes[].status` of a process image whose stream ended at an exec (the next image
/// goes on).
pub const REPLACED_BY_EXEC: &str = "replaced by exec";

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub version: u32,
    pub trace: TraceInfo,
    pub processes: Vec<ProcessReport>,
    pub findings: Vec<Finding>,
    /// heaptrack_print-like sections per process and device ([`sections`]); filled by
    /// `oomtrace report`, absent (empty) elsewhere.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sections: Vec<sections::DeviceSections>,
    /// The ranks of a distributed job side by side ([`ranks`]); absent unless the processes
    /// hold at least two ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<ranks::Ranks>,
    /// Each trace file of a report merged from several ([`merge`]); `trace` then sums them up.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub traces: Vec<TraceInfo>,
    /// How a report of several traces put them together ([`merge::Combined`]); absent for
    /// one trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub combined: Option<merge::Combined>,
    /// The separate runs of a report of several traces that are not one job, each with its
    /// own rank table (`ranks` then compares nothing across runs); absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<merge::Run>,
    /// Modules whose files changed since the trace was taken ([`module_file`]): their frames
    /// have no names, only `module` and `offset`. Empty when every file matched (or the
    /// report was built without symbols).
    pub stale_modules: Vec<module_file::StaleModule>,
    /// Files of a directory given to `oomtrace report` that could not be read as traces, and
    /// why; the report covers the others. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

/// A member of a directory that is not a readable trace (corrupt, a FIFO, a device, ...).
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub path: String,
    /// Why, in one sentence (`it is a FIFO, not a trace file`).
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceInfo {
    pub path: String,
    pub producer: String,
    /// The writer finished cleanly and wrote everything it received.
    pub complete: bool,
    /// The file ends inside a record (its writer was killed or is still writing).
    pub truncated: bool,
    pub warnings: Vec<String>,
    /// Present when the writer could not write everything (a full disk): the trace stops
    /// early, for that reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<IncompleteInfo>,
    /// Present when the program ran on oomtrace's simulated GPU (`oomtrace run --simulate`):
    /// kernels did not run, so values computed on the device are meaningless; allocation
    /// sizes and lifetimes are those of a real GPU for programs whose shapes do not depend on
    /// data. Set by `run`, which knows; absent in reports built later from the trace file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<SimulatedDevice>,
}

/// The simulated GPU a program ran on (`oomtrace run --simulate SIZE`).
#[derive(Clone, Debug, Serialize)]
pub struct SimulatedDevice {
    /// SIZE as given (`16GiB`).
    pub device_memory: String,
    /// SIZE in bytes: each simulated device's capacity.
    pub device_memory_bytes: u64,
}

/// Why a trace stops early, as its writer recorded it.
#[derive(Clone, Debug, Serialize)]
pub struct IncompleteInfo {
    /// `disk_full`, `file_too_large` or `io_error`.
    pub cause: &'static str,
    /// The error as the writer saw it.
    pub message: String,
    /// Bytes of events received from then on and not written.
    pub unwritten_bytes: u64,
    /// Events in those bytes (for all processes).
    pub unwritten_events: u64,
    /// When the first write failed (Unix time, ns): the trace holds nothing after it.
    pub stops_at_unix_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessReport {
    pub pid: u32,
    pub ppid: u32,
    pub command: String,
    pub exe: String,
    /// Its rank in a distributed job, from the launcher's variables (`RANK`, `SLURM_PROCID`,
    /// ...); null for a process no launcher started.
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// A world size its launcher said that is not believed (above
    /// `oomtrace_proto::launch::MAX_WORLD_SIZE`): `world_size` is then null. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implausible_world_size: Option<u64>,
    /// The host it ran on ("" in traces from before it was recorded).
    pub host: String,
    /// When it started (Unix time, ns).
    pub start_unix_ns: u64,
    /// The trace file it came from, when a report reads several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// The job its launcher named (Slurm's `SLURM_JOB_ID`, torchrun's
    /// `TORCHELASTIC_RUN_ID`); absent without one. Traces of one job merge into one report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// exited | exited (_exit) | detached | replaced by exec | ended without goodbye |
    /// exited (end of stream lost) | running | protocol error
    pub status: String,
    pub events: u64,
    /// Events missing from the trace, all devices: what the process made less what was
    /// received (counted lost by the shim, left behind at the end of its stream, cut with
    /// its connection, not written on a full disk). Each device shows the share the shim
    /// could attribute.
    pub lost_events: u64,
    pub lost_frees: u64,
    pub lost_stacks: u64,
    /// Frees of pointers this trace never saw allocated (allocated before tracing, or lost).
    pub unmatched_frees: u64,
    pub failed_frees: u64,
    pub steps: u64,
    pub duration_s: f64,
    /// How the detectors cut the run into steps.
    pub epochs: EpochReport,
    pub devices: Vec<DeviceReport>,
    /// Failed allocations by API, error and device (out of memory, no driver, ...).
    pub failed_allocations: Vec<FailedAllocations>,
}

/// Allocations of one process that failed with one error.
#[derive(Clone, Debug, Serialize)]
pub struct FailedAllocations {
    pub api: &'static str,
    /// The code the call returned (`cudaError_t` or `CUresult`, by `api`).
    pub error_code: i32,
    /// Its symbol, e.g. `cudaErrorInsufficientDriver`; `""` if unknown.
    pub error: &'static str,
    /// What it usually means, in a few words; `""` if unknown.
    pub meaning: &'static str,
    /// `-1`: no device was current (or pinned host memory, per `api`).
    pub device: i16,
    pub count: u64,
    /// Bytes asked for by the most recent one.
    pub last_size: u64,
    pub stack: Vec<FrameInfo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EpochReport {
    /// markers | auto | time | none
    pub source: &'static str,
    pub count: u32,
    /// How sure the clock is that its epochs are the program's steps, 0..1 (1: markers;
    /// auto: 0.9 for an iteration found by its structure, 0.7 by its pace, times the share of
    /// recent iterations that matched; 0.3: time windows; 0: no epochs).
    pub confidence: f64,
    /// With `auto`: allocations per step of the anchor call site.
    pub period_allocations: Option<f64>,
    pub median_step_s: Option<f64>,
    /// The first step of the current source (earlier ones were cut another way).
    pub stable_since: u32,
    /// The first step whose allocations can count as a leak's generations.
    pub warmup_end: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    /// CUDA device ordinal; -1 holds pinned host memory.
    pub device: i16,
    /// "device" (GPU memory: plain, managed and VMM physical) or "host_pinned".
    pub memory: &'static str,
    pub peak_bytes: u64,
    pub live_at_exit_bytes: u64,
    pub live_at_exit_count: u64,
    pub events: u64,
    pub lost_events: u64,
    pub allocations: u64,
    pub frees: u64,
    pub failed_allocations: u64,
    pub bytes_allocated: u64,
    pub capacity_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub reserved_va_bytes: u64,
    /// PyTorch's tensors as its caching allocator's trace tracker reported them (`--torch`):
    /// they live inside the segments counted above, so they are not part of those totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors: Option<TensorTotals>,
    /// Bytes of segments PyTorch's caching allocator held at the end (its reserve), from the
    /// tracker's segment events (`--torch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_reserved_bytes: Option<u64>,
    /// How many segments made up `torch_reserved_bytes`; present with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_segments: Option<u64>,
    /// PyTorch's own statistics of the device at the last step marker, as the program read
    /// them (the Python step hook; every mode, `--segments` included). Absent when no reading
    /// came (no step hook, CUDA never initialised, or the reading failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_memory: Option<TorchMemoryReport>,
}

/// The last reading of PyTorch's own statistics of a device (`torch.cuda.memory_allocated()`
/// and friends), taken by the step hook right after a step marker.
#[derive(Clone, Debug, Serialize)]
pub struct TorchMemoryReport {
    /// `torch.cuda.memory_allocated(device)`: bytes of live tensors.
    pub allocated_bytes: u64,
    /// `torch.cuda.max_memory_allocated(device)`: the tensors' peak since the program started
    /// (or last reset PyTorch's peak statistics itself).
    pub max_allocated_bytes: u64,
    /// `torch.cuda.memory_reserved(device)`: bytes of the caching allocator's segments.
    pub reserved_bytes: u64,
    /// The step markers counted when it was read (it follows the last of them).
    pub step: u64,
    /// When it was read: seconds since the process's first event.
    pub at_s: f64,
}

/// A device's tensors under `--torch` (the trace tracker).
#[derive(Clone, Debug, Serialize)]
pub struct TensorTotals {
    pub peak_bytes: u64,
    pub live_at_exit_bytes: u64,
    pub live_at_exit_count: u64,
}

#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Call sites per process and device in the live-at-exit list.
    pub top: usize,
    pub path: String,
    /// Symbolize stacks from the module files (off in tests that check raw frames).
    pub symbolize: bool,
}

/// Whether a finding's allocations are PyTorch's caching-allocator segments: its site runs in
/// PyTorch's CUDA library and its events are not tensors (the trace tracker's and the
/// pluggable allocator's stacks pass through that library too).
fn segments_of_torch(p: &Process, f: &Finding) -> bool {
    f.api.is_none_or(|api| !fragmentation::is_tensor_level(api)) && in_torch(p.stacks(), f.site)
}

fn status(p: &Process, trace: &Trace<Analysis>) -> String {
    match p.end {
        EndState::Running if trace.incomplete.is_some() => {
            let why = trace.incomplete.as_ref().map_or("", |i| i.cause.words());
            format!("cut short: the trace could not be written further ({why})")
        }
        EndState::Exited(Some(GoodbyeReason::Exit)) | EndState::Exited(None) => "exited".into(),
        EndState::Exited(Some(GoodbyeReason::UnderscoreExit)) => "exited (_exit)".into(),
        EndState::Exited(Some(GoodbyeReason::Detach)) => "detached".into(),
        EndState::Abrupt => "ended without goodbye (killed or crashed)".into(),
        // It said goodbye (through its counter page), but the end of its stream was lost.
        EndState::Unheard(GoodbyeReason::Exit) => "exited (end of stream lost)".into(),
        EndState::Unheard(GoodbyeReason::UnderscoreExit) => {
            "exited (_exit, end of stream lost)".into()
        }
        EndState::Unheard(GoodbyeReason::Detach) => "detached (end of stream lost)".into(),
        EndState::Running => "running when the trace ended".into(),
        EndState::ProtocolError => "dropped (protocol error)".into(),
    }
}

/// Why memory might still be live at exit, from what the trace can tell.
fn live_hint(
    p: &Process,
    a: &Analysis,
    device: i16,
    site: SiteId,
    held: Option<Held>,
) -> (Cause, String) {
    let leaking = a.is_leak(site, device);
    if held == Some(Held::TorchReserve) {
        (
            Cause::NeverFreed,
            "Segments PyTorch's caching allocator keeps for reuse until torch.cuda.empty_cache() \
             or exit: its reserve, not memory a line holds. The tensors inside them are listed \
             by the lines that made them (without --segments)."
                .into(),
        )
    } else if leaking {
        (
            Cause::LiveAndLeaking,
            "This call site is also reported as a leak: its memory grew step by step.".into(),
        )
    } else if p.end != EndState::Exited(Some(GoodbyeReason::Exit))
        && p.end != EndState::Exited(None)
    {
        (
            Cause::EndedAbnormally,
            "The process did not exit normally, so memory it would have freed may be listed."
                .into(),
        )
    } else {
        (
            Cause::NeverFreed,
            "Never freed before exit. Harmless if it was meant to live until the end (weights, \
             caches); the driver reclaims it at exit. A leak shows as growth across steps \
             instead."
                .into(),
        )
    }
}

/// One warning per process of `trace` whose analysis failed (a detector bug): its findings
/// stop where it failed. The caller says them (the library never prints).
pub fn analysis_failures(trace: &Trace<Analysis>) -> Vec<String> {
    trace
        .processes
        .iter()
        .zip(&trace.observers)
        .filter(|(_, a)| a.failed)
        .map(|(p, _)| Analysis::failure_warning(p.pid()))
        .collect()
}

/// The forward lines of each operator in one process (see [`forward_lines`]).
type ForwardLines = HashMap<String, Vec<PythonLine>>;

/// What a finding says once its stack is symbolized: the frame that names it and, in
/// PyTorch's backward pass, the autograd node and the forward lines behind it.
fn complete_site(
    f: &mut Finding,
    p: &Process,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    forward: &mut ForwardLines,
) {
    f.culprit = culprit(&f.stack).cloned();
    if symbolize::runs_python(&f.stack) {
        return;
    }
    let Some(name) = roles::backward_node(&f.stack) else {
        return;
    };
    let forward_op = roles::forward_op(name).unwrap_or_default();
    let forward_lines = if forward_op.is_empty() {
        Vec::new()
    } else {
        forward
            .entry(forward_op.clone())
            .or_insert_with(|| forward_lines(p, &forward_op, stack_of))
            .clone()
    };
    f.backward_node = Some(BackwardNode {
        name: name.to_string(),
        forward_op,
        forward_lines,
    });
}

/// Forward lines kept per backward node, most allocations first.
const FORWARD_LINES: usize = 5;

/// The Python lines (innermost user frame) of every call site of `p` that allocated inside
/// the dispatcher entry of operator `op` (`at::_ops::addmm::call`): where the forward op ran
/// whose autograd node a backward-pass allocation belongs to. Each line counts the
/// allocations of its sites over the whole run; a line that runs the same op on other
/// tensors is among them too (see docs/sites.md, "Backward pass").
fn forward_lines(
    p: &Process,
    op: &str,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
) -> Vec<PythonLine> {
    let mut by_line: BTreeMap<(String, u32, String), (u64, u64)> = BTreeMap::new();
    for (i, raw) in p.sites.iter().enumerate().skip(1) {
        let has_python = raw
            .iter()
            .any(|f| oomtrace_proto::python::PyFrame::decode(f.addr).is_some());
        if !has_python {
            continue;
        }
        let site = SiteId(i as u32);
        let frames = stack_of(p, site);
        if !frames.iter().any(|f| roles::runs_op(f, op)) {
            continue;
        }
        let Some(line) = symbolize::python_culprit(&frames) else {
            continue;
        };
        // By device (a few), not by scanning every site of every device for this one.
        let (bytes, count) = p
            .devices
            .keys()
            .filter_map(|&d| p.site_stats.get(&(site, d)))
            .fold((0u64, 0u64), |(b, c), st| {
                (b.saturating_add(st.total_bytes), c + st.allocations)
            });
        let e = by_line
            .entry((line.file.clone(), line.line, line.function.clone()))
            .or_default();
        e.0 = e.0.saturating_add(bytes);
        e.1 += count;
    }
    let mut lines: Vec<PythonLine> = by_line
        .into_iter()
        .map(|((file, line, function), (bytes, count))| PythonLine {
            description: format!("{}:{line}", file.rsplit('/').next().unwrap_or(&file)),
            file,
            line,
            function,
            bytes,
            count,
        })
        .collect();
    lines.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(a.description.cmp(&b.description))
    });
    lines.truncate(FORWARD_LINES);
    lines
}

/// A site's frames as bare addresses (reports built without symbolizing).
pub(crate) fn raw_stack(p: &Process, site: SiteId) -> Vec<FrameInfo> {
    p.sites
        .get(site.0 as usize)
        .map(|fs| {
            fs.iter()
                .map(|f| FrameInfo {
                    address: format!("{:#x}", f.addr),
                    ..Default::default()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What a call site's memory is on `device`, when PyTorch's tensors are traced there.
pub fn held_at(p: &Process, device: i16, site: SiteId) -> Option<Held> {
    if !p.tensors_traced(device) {
        return None;
    }
    let s = p.site_stats.get(&(site, device))?;
    Some(if s.reserve_allocations > 0 {
        Held::TorchReserve
    } else if s
        .api
        .is_some_and(|a| a.memory_class() == oomtrace_proto::MemoryClass::Tensor)
    {
        Held::Tensors
    } else {
        Held::OutsideTorch
    })
}

/// A device's growth that the fragmentation finding on the same device explains.
const FRAGMENTED_DEVICE_HINT: &str = "PyTorch's cache grows while the tensors it holds do not \
    keep up: the growth is memory reserved and not used (see the fragmentation finding on this \
    device), not tensors held across steps.";

pub fn build(trace: &Trace<Analysis>, opts: &ReportOptions) -> Report {
    build_with(trace, opts, &mut StackSymbolizer::new())
}

/// [`build`] with a symbolizer the caller keeps: reading a module's debug information is
/// most of a small trace's report, and the traces of one job share their modules (`report
/// DIR` keeps one per thread). Where PyTorch's tensors are traced, the call sites live at
/// exit are its tensors and the memory outside its allocator, not its segments.
pub fn build_with(
    trace: &Trace<Analysis>,
    opts: &ReportOptions,
    sym: &mut StackSymbolizer,
) -> Report {
    build_with_segments(trace, opts, false, sym)
}

/// [`build_with`], listing PyTorch's segments among the call sites live at exit when
/// `segments` (`oomtrace report --segments`).
pub fn build_with_segments(
    trace: &Trace<Analysis>,
    opts: &ReportOptions,
    segments: bool,
    sym: &mut StackSymbolizer,
) -> Report {
    let mut stack_of = |p: &Process, site| {
        if opts.symbolize {
            sym.site(p, site)
        } else {
            raw_stack(p, site)
        }
    };
    let mut processes = Vec::new();
    let mut detected = Vec::new();
    let mut live = Vec::new();
    for (p, a) in trace.processes.iter().zip(&trace.observers) {
        // Forward lines by operator, found once per process.
        let mut forward = ForwardLines::default();
        // Advice to trace the tensors is for runs that do not.
        let tensors_traced = traces_tensors(p);
        let devices = p
            .devices
            .iter()
            .filter(|(_, d)| d.allocations > 0 || d.failed_allocations > 0 || d.capacity.is_some())
            .map(|(&device, d)| DeviceReport {
                device,
                memory: if device == HOST_DEVICE {
                    "host_pinned"
                } else {
                    "device"
                },
                peak_bytes: d.peak_bytes,
                live_at_exit_bytes: d.live_bytes,
                live_at_exit_count: d.live_count,
                events: d.events,
                lost_events: p.lost_on(device),
                allocations: d.allocations,
                frees: d.frees,
                failed_allocations: d.failed_allocations,
                bytes_allocated: d.bytes_allocated,
                capacity_bytes: d.capacity,
                free_bytes: d.last_free,
                reserved_va_bytes: d.reserved_va_bytes,
                tensors: (d.tensor_peak_bytes > 0).then_some(TensorTotals {
                    peak_bytes: d.tensor_peak_bytes,
                    live_at_exit_bytes: d.tensor_bytes,
                    live_at_exit_count: d.tensor_count,
                }),
                torch_reserved_bytes: d.torch_reserved_bytes,
                torch_segments: d.torch_reserved_bytes.map(|_| d.torch_segments),
                torch_memory: p.torch_memory.get(&device).map(|m| TorchMemoryReport {
                    allocated_bytes: m.allocated,
                    max_allocated_bytes: m.max_allocated,
                    reserved_bytes: m.reserved,
                    step: m.step,
                    at_s: m.ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
                }),
            })
            .collect();
        processes.push(ProcessReport {
            pid: p.pid(),
            ppid: p.hello.ppid,
            command: p.command(),
            exe: p.hello.exe.clone(),
            rank: p.launch.rank,
            local_rank: p.launch.local_rank,
            world_size: p.launch.world_size,
            implausible_world_size: p.launch.implausible_world_size,
            host: p.hello.host.clone(),
            start_unix_ns: p.hello.start_unix_ns,
            trace: None,
            job: p.launch.job.clone(),
            status: if p.end == EndState::Abrupt
                && trace
                    .processes
                    .iter()
                    .any(|q| q.pid() == p.pid() && q.hello.ppid == p.hello.ppid && q.conn > p.conn)
            {
                // A later image of the same process: the stream ended at an exec.
                REPLACED_BY_EXEC.into()
            } else {
                status(p, trace)
            },
            events: p.events,
            lost_events: p.lost_events(),
            lost_frees: p.lost.frees,
            lost_stacks: p.lost.stacks,
            unmatched_frees: p.unmatched_frees,
            failed_frees: p.failed_frees,
            steps: p.markers,
            duration_s: p.last_ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
            epochs: EpochReport {
                source: a.clock.source.name(),
                count: a.clock.epoch,
                confidence: (a.clock.confidence() * 100.0).round() / 100.0,
                period_allocations: a.clock.period_allocs(),
                median_step_s: a.clock.median_duration_s(),
                stable_since: a.clock.stable_since,
                warmup_end: a.clock.stable_since + trend::WARMUP,
            },
            devices,
            failed_allocations: p
                .alloc_failures
                .iter()
                .map(|(&(api, code, device), f)| {
                    let known = oomtrace_proto::cuda_error::lookup(api, code);
                    FailedAllocations {
                        api: api.name(),
                        error_code: code,
                        error: known.map_or("", |e| e.name),
                        meaning: known.map_or("", |e| e.meaning),
                        device,
                        count: f.count,
                        last_size: f.last_size,
                        stack: stack_of(p, f.last_site),
                    }
                })
                .collect(),
        });
        for mut f in a.findings(p) {
            f.pid = p.pid();
            f.rank = p.launch.rank;
            let record = f.record.and_then(|i| a.oom.records.get(i));
            f.oom = record.map(|o| OomDetail {
                requested_bytes: o.size,
                result: o.result,
                free_bytes: o.free_bytes,
                total_bytes: o.total_bytes,
                live_bytes: o.live_bytes,
                time_s: o.ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
                unix_s: (p.hello.start_mono_ns != 0).then(|| {
                    (p.hello.start_unix_ns as f64 + o.ts_ns as f64 - p.hello.start_mono_ns as f64)
                        / 1e9
                }),
                top_sites: o
                    .top_sites
                    .iter()
                    .map(|&(site, bytes, count)| SiteShare {
                        bytes,
                        count,
                        stack: stack_of(p, site),
                    })
                    .collect(),
                reserved_bytes: o.torch_reserved_bytes,
                allocated_bytes: o.tensor_bytes,
                reserved_unallocated_bytes: o.in_pieces(),
                remedies: if o.in_pieces().is_some() {
                    fragmentation::remedies(&Default::default())
                } else {
                    Vec::new()
                },
            });
            if f.site.0 != 0 {
                f.stack = stack_of(p, f.site);
            }
            complete_site(&mut f, p, &mut stack_of, &mut forward);
            let leaked_at_oom = record.map(|o| {
                o.top_sites
                    .iter()
                    .filter(|(site, _, _)| a.is_leak(*site, o.device))
                    .fold(0u64, |acc, &(_, bytes, _)| acc.saturating_add(bytes))
            });
            match leaked_at_oom {
                Some(leaked) if leaked > 0 => {
                    f.cause = Cause::LeaksHeldAtOom;
                    f.hint = format!(
                        "{} of the memory live at the failure was held by call sites that leak \
                         step by step (see the leak findings): without them this allocation \
                         would have had that much more room.",
                        fmt_bytes(leaked)
                    );
                }
                _ if f.kind == Kind::Leak
                    && f.cause == Cause::NativeLeak
                    && segments_of_torch(p, &f) =>
                {
                    f.cause = Cause::TorchCacheLeak;
                    f.hint = growth::TORCH_CACHE_HINT.to_string();
                }
                _ => {}
            }
            let segments = segments_of_torch(p, &f);
            match f.evidence.as_mut() {
                Some(Evidence::DeviceGrowth(e)) => {
                    let hint = std::mem::take(&mut f.hint);
                    (f.cause, f.hint) = device_growth_hint(p.stacks(), e, f.cause, hint);
                    if a.fragmentation.gap_growing(f.device) {
                        // The reserve grows away from the tensors: what grows is the cache's
                        // unused part, not memory any line holds.
                        f.cause = Cause::Fragmented;
                        f.hint = FRAGMENTED_DEVICE_HINT.into();
                    }
                    resolve_device_growth(p.stacks(), e, |site| stack_of(p, site));
                }
                // A leak of PyTorch's segments: the lines that made the device's cache grow
                // over the same steps say more than the one call that found it exhausted.
                // The lines whose requests made the cache take segments.
                Some(Evidence::Fragmentation(e)) => {
                    e.python_lines = python_lines(p.stacks(), &e.grew_at, |site| stack_of(p, site));
                }
                Some(Evidence::Leak(e)) if segments => {
                    let grew_at = a.device_growth.grew_at(f.device);
                    e.python_lines = python_lines(p.stacks(), grew_at, |site| stack_of(p, site));
                }
                _ => {}
            }
            if tensors_traced {
                f.hint = without_tensor_advice(&f.hint);
            }
            detected.push(f);
        }
        for &device in p.devices.keys() {
            let sites = if segments {
                p.top_sites(device, opts.top)
            } else {
                p.top_holders(device, opts.top)
            };
            for (site, bytes, count) in sites {
                let api = p.site_stats.get(&(site, device)).and_then(|s| s.api);
                let api_name = api.map_or("?", |a| a.name());
                let place = if device == HOST_DEVICE {
                    "in pinned host memory".to_string()
                } else {
                    format!("on device {device}")
                };
                let held = held_at(p, device, site);
                let (cause, hint) = live_hint(p, a, device, site, held);
                let plural = if count == 1 { "" } else { "s" };
                let what = match held {
                    Some(Held::Tensors) => format!("{count} tensor{plural}"),
                    Some(Held::TorchReserve) => {
                        format!("{count} segment{plural} of PyTorch's cache ({api_name})")
                    }
                    Some(Held::OutsideTorch) => format!(
                        "{count} allocation{plural} ({api_name}, outside PyTorch's allocator)"
                    ),
                    None => format!("{count} allocation{plural} ({api_name})"),
                };
                let mut f = Finding {
                    pid: p.pid(),
                    rank: p.launch.rank,
                    bytes,
                    stack: stack_of(p, site),
                    held,
                    message: format!(
                        "{} in {what} still live {place} when the process ended",
                        fmt_bytes(bytes),
                    ),
                    count,
                    api,
                    hint,
                    site,
                    cause,
                    ..Finding::new(Kind::LiveAtExit, Severity::Info, device)
                };
                complete_site(&mut f, p, &mut stack_of, &mut forward);
                live.push(f);
            }
        }
    }
    live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    detected.sort_by_key(order);
    let mut findings = detected;
    findings.extend(live);
    let ranks = ranks::build(&processes, &findings);
    Report {
        version: REPORT_VERSION,
        trace: TraceInfo {
            path: opts.path.clone(),
            producer: trace.header.producer.clone(),
            complete: trace.complete && trace.incomplete.is_none(),
            incomplete: trace.incomplete.as_ref().map(|i| IncompleteInfo {
                cause: i.cause.name(),
                message: i.message.clone(),
                unwritten_bytes: i.unwritten_bytes,
                unwritten_events: i.unwritten_events,
                stops_at_unix_ns: i.t_unix_ns,
            }),
            truncated: matches!(
                trace.tail,
                oomtrace_proto::trace_file::Tail::Truncated { .. }
            ),
            warnings: trace.warnings.clone(),
            simulated: None,
        },
        processes,
        findings,
        sections: Vec::new(),
        ranks,
        traces: Vec::new(),
        combined: None,
        runs: Vec::new(),
        stale_modules: if opts.symbolize {
            module_file::stale_modules(trace.processes.iter().map(crate::model::Stacks::from))
        } else {
            Vec::new()
        },
        skipped: Vec::new(),
    }
}

/// Where a finding goes in the report: OOMs open it, then leaks, device growth (the
/// process-level view of the same memory), fragmentation, thresholds and bounded growth, then
/// what was live at exit.
pub fn order(f: &Finding) -> u8 {
    match f.kind {
        Kind::Oom => 0,
        Kind::Leak => 1,
        // Fragmentation explains a device's growth when both are found: it comes first.
        Kind::Fragmentation => 2,
        Kind::DeviceGrowth => 3,
        Kind::Threshold => 4,
        Kind::Growth => 5,
        Kind::LiveAtExit => 6,
    }
}
