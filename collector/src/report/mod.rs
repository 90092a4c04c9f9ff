//! The report: the `--json` contract (docs/json-report.md, version 1), built from a replayed
//! `Trace<Analysis>`: the model's accounting, the analysis's findings, completed from the
//! stacks ([`hints`]) and symbolized ([`symbolize`]). The live line ([`live`]) is the same
//! findings as they happen.
//!
//! Reads the model and the analysis; nothing inside the crate reads it but the top (the
//! server's live line). Field names are pinned by the contract; extra fields are allowed,
//! renames are not. Findings open with OOMs (what a user asks first after a crash), then the
//! call sites that still held memory when each process ended.

pub mod backward;
pub mod diff;
mod finding;
pub mod fit;
pub mod hints;
pub mod levers;
pub mod live;
mod live_at_exit;
pub mod merge;
pub mod module_file;
pub mod names;
mod process;
pub mod ranks;
pub mod remedies;
pub mod roles;
pub mod sections;
pub mod symbolize;

pub use crate::analysis::anatomy::{
    AnatomyMoment, AnatomyReport, AnatomyStep, LibraryBytes, LineBytes, RoleBytesReport,
};
use serde::Serialize;

// The report contract's one home: every type of the `--json` document, and what a front end
// reads to render it, is named here (the CLI imports nothing of the analysis).
pub use crate::analysis::device_growth::Events;
pub use crate::analysis::fragmentation::{every_remedy, is_tensor_level};
pub use crate::analysis::oom::{OomDetail, SiteShare};
pub use crate::analysis::refusal::{Lever, Remedy};
pub use crate::analysis::trend::Trend;
pub use crate::analysis::{
    Analysis, BackwardNode, Cause, Confidence, Evidence, Finding, Held, Kind, Level, PythonLine,
    Severity,
};
use crate::model::trace::Trace;
use crate::model::{FrameInfo, Process, SiteId};
use finding::complete_finding;
pub use hints::{
    device_growth_hint, fmt_python_lines, in_torch, python_lines, resolve_device_growth,
    thread_kind, torch_segments, traces_tensors, without_tensor_advice,
};
pub use live_at_exit::held_at;
use live_at_exit::live_at_exit;
use process::process_report;
use symbolize::StackSymbolizer;

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
    /// What makes the job fit (the `fit` object of `oomtrace fit --json`, docs/fit.md),
    /// predicted with each process's own allocator setting; absent without PyTorch's tensors
    /// or steps, or for a trace too large to replay for a report ([`levers`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<crate::fit::Fit>,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    /// How the text names the most recent one's call site ([`names::site_name`]).
    pub name: String,
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
    /// What the device's memory is (docs/anatomy.md): PyTorch's tensors by role, the cache's
    /// reserve gap and the memory outside PyTorch, at the peak, at each out-of-memory and at
    /// each step's end. Present where PyTorch's tensors are traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anatomy: Option<AnatomyReport>,
    /// The levers that would let the device hold more (the largest batch that fits, the module
    /// whose checkpointing takes the most off the peak), from `fit` ([`levers`]); absent
    /// where not predicted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levers: Vec<Lever>,
    /// With `report --since-mark LABEL` (a Python block, `oomtrace.trace()`): the most the
    /// device held at once since that marker, and when it came: `{"peak_bytes",
    /// "tensor_peak_bytes", "bytes_at_start", "tensor_bytes_at_start"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_mark: Option<crate::analysis::WindowPeak>,
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
        // The forward lines of its backward-pass sites, found once per process.
        let mut backward = backward::Lookup::new();
        // Advice to trace the tensors is for runs that do not.
        let tensors_traced = traces_tensors(p);
        let report = process_report(p, a, trace, &mut stack_of, &mut backward);
        for mut f in a.findings(p) {
            complete_finding(&mut f, p, tensors_traced, &mut stack_of, &mut backward);
            f.anatomy = oom_anatomy(&f, &report);
            detected.push(f);
        }
        processes.push(report);
        live.extend(live_at_exit(
            p,
            a,
            segments,
            opts.top,
            &mut stack_of,
            &mut backward,
        ));
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
            simulated: simulated_of(trace),
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
        fit: None,
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

/// An out-of-memory finding's anatomy: its device's, at its moment (matched by time).
fn oom_anatomy(f: &Finding, p: &ProcessReport) -> Option<AnatomyMoment> {
    let ts = f.record.as_ref().filter(|_| f.kind == Kind::Oom)?.ts_ns;
    p.devices
        .iter()
        .find(|d| d.device == f.device)?
        .anatomy
        .as_ref()?
        .at_oom
        .iter()
        .find(|m| m.ts_ns == ts)
        .cloned()
}

/// The simulated GPU a trace ran on, from its processes' own record of it (the shim keeps
/// `SIMCUDA_MEMORY`, which `oomtrace run --simulate` sets, among the launch variables of its
/// Hello): so a later `report`, `view` or `diff` of the file says it too.
fn simulated_of(trace: &Trace<Analysis>) -> Option<SimulatedDevice> {
    trace.processes.iter().find_map(|p| {
        let bytes: u64 = p
            .hello
            .launch
            .iter()
            .find(|(k, _)| k == "SIMCUDA_MEMORY")?
            .1
            .trim()
            .parse()
            .ok()?;
        Some(SimulatedDevice {
            device_memory: crate::units::fmt_bytes(bytes),
            device_memory_bytes: bytes,
        })
    })
}
