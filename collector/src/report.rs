//! The report: the `--json` contract (README "CLI", version 1), built from a `Trace`.
//!
//! Field names are pinned by the contract; extra fields are allowed, renames are not.
//! Findings open with OOMs (what a user asks first after a crash), then the call sites that
//! still held memory when each process ended.

use serde::Serialize;

use crate::detect::device_growth::{self, Events};
use crate::detect::growth::GrewAt;
use crate::detect::{growth, Evidence, Kind};
use crate::state::{EndState, Process, SiteId, HOST_DEVICE};
use crate::symbolize::{python_culprit, python_frames, FrameInfo, StackSymbolizer};
use crate::trace::Trace;
use oomtrace_proto::wire::GoodbyeReason;

pub const REPORT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub version: u32,
    pub trace: TraceInfo,
    pub processes: Vec<ProcessReport>,
    pub findings: Vec<Finding>,
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
    /// exited | exited (_exit) | detached | replaced by exec | ended without goodbye |
    /// running | protocol error
    pub status: String,
    pub events: u64,
    /// Events the shim could not deliver, all devices (see each device for its share).
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
    /// markers | auto | windows | none
    pub source: &'static str,
    pub count: u32,
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
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// oom | leak | device_growth | fragmentation | threshold | growth | live_at_exit
    pub kind: &'static str,
    /// error | warning | info (leaks: suspected | likely | confirmed)
    pub level: &'static str,
    pub pid: u32,
    pub device: i16,
    pub bytes: u64,
    pub growth_bytes_per_step: Option<f64>,
    pub steps: Option<u64>,
    /// Innermost frame first: the code that called the allocation API.
    pub stack: Vec<FrameInfo>,
    /// One sentence for a human.
    pub message: String,
    /// Allocations involved (live ones for live_at_exit).
    pub count: u64,
    /// The allocation API seen at this site.
    pub api: String,
    /// The likely cause, in a sentence.
    pub hint: String,
    pub growth_bytes_per_s: Option<f64>,
    /// The numbers behind a detector's finding (leak, growth, fragmentation, threshold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomDetail>,
}

#[derive(Clone, Debug, Serialize)]
pub struct OomDetail {
    pub requested_bytes: u64,
    pub result: i32,
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Tracked live bytes on the device when the allocation failed.
    pub live_bytes: u64,
    pub time_s: f64,
    /// The largest holders at that instant.
    pub top_sites: Vec<SiteShare>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteShare {
    pub bytes: u64,
    pub count: u64,
    pub stack: Vec<FrameInfo>,
}

#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Call sites per process and device in the live-at-exit list.
    pub top: usize,
    pub path: String,
    /// Symbolize stacks from the module files (off in tests that check raw frames).
    pub symbolize: bool,
}

/// "1.50 GiB", "512 B".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// "250 ms", "3.20 s", "4 min 12 s".
pub fn fmt_duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else if secs < 120.0 {
        format!("{secs:.2} s")
    } else {
        format!("{:.0} min {:.0} s", (secs / 60.0).floor(), secs % 60.0)
    }
}

fn status(p: &Process, trace: &Trace) -> String {
    match p.end {
        EndState::Running if trace.incomplete.is_some() => {
            let why = trace.incomplete.as_ref().map_or("", |i| i.cause.words());
            format!("cut short: the trace could not be written further ({why})")
        }
        EndState::Exited(Some(GoodbyeReason::Exit)) | EndState::Exited(None) => "exited".into(),
        EndState::Exited(Some(GoodbyeReason::UnderscoreExit)) => "exited (_exit)".into(),
        EndState::Exited(Some(GoodbyeReason::Detach)) => "detached".into(),
        EndState::Abrupt => "ended without goodbye (killed or crashed)".into(),
        EndState::Running => "running when the trace ended".into(),
        EndState::ProtocolError => "dropped (protocol error)".into(),
    }
}

/// Where a device's memory grew: the innermost user Python frame of the allocations (see
/// [`python_lines`]), or, for allocations without Python frames, the kind of thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PythonLine {
    /// `""`/`0` for allocations without Python frames.
    pub file: String,
    pub line: u32,
    pub function: String,
    pub bytes: u64,
    pub count: u64,
    /// How the text names it: `train.py:42`, or e.g. `autograd thread (no Python frames)`.
    pub description: String,
}

/// Lines kept in `python_lines`, largest first.
const PYTHON_LINES: usize = 10;

/// The kind of thread a stack without Python frames ran on, from its native frames.
pub fn thread_kind(native: &[FrameInfo]) -> &'static str {
    if native
        .iter()
        .any(|f| f.function.contains("torch::autograd::Engine::thread_main"))
    {
        "autograd thread (no Python frames)"
    } else {
        "threads without Python frames"
    }
}

/// The allocations of `grew_at` by the innermost user Python frame of their call site (the
/// line a user can change), the largest [`PYTHON_LINES`]; those without Python frames in one
/// bucket per kind of thread, named from the native frames `native` gives. Empty when the
/// process sent no Python code (not Python, or `OOMTRACE_PYTHON=0`).
pub fn python_lines(
    p: &Process,
    grew_at: &[GrewAt],
    mut native: impl FnMut(SiteId) -> Vec<FrameInfo>,
) -> Vec<PythonLine> {
    if p.codes.is_empty() {
        return Vec::new();
    }
    let mut by_line: std::collections::BTreeMap<(String, u32, String, String), (u64, u64)> =
        Default::default();
    for g in grew_at {
        let frames = python_frames(p, g.site);
        let key = match python_culprit(&frames) {
            Some(f) => {
                let name = f.file.rsplit('/').next().unwrap_or(&f.file);
                let description = format!("{name}:{}", f.line);
                (f.file.clone(), f.line, f.function.clone(), description)
            }
            None => (
                String::new(),
                0,
                String::new(),
                thread_kind(&native(g.site)).to_string(),
            ),
        };
        let e = by_line.entry(key).or_default();
        e.0 = e.0.saturating_add(g.bytes);
        e.1 += g.count;
    }
    let mut v: Vec<PythonLine> = by_line
        .into_iter()
        .map(
            |((file, line, function, description), (bytes, count))| PythonLine {
                file,
                line,
                function,
                bytes,
                count,
                description,
            },
        )
        .collect();
    v.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.description.cmp(&b.description))
    });
    v.truncate(PYTHON_LINES);
    v
}

/// "train.py:42 (128.00 MiB in 4 segments), autograd thread (no Python frames): 64.00 MiB in
/// 2 segments": the first `max` lines, then how many more. `unit` names one allocation.
pub fn fmt_python_lines(lines: &[PythonLine], unit: &str, max: usize) -> String {
    let amount = |l: &PythonLine| {
        format!(
            "{} in {} {unit}{}",
            fmt_bytes(l.bytes),
            l.count,
            if l.count == 1 { "" } else { "s" }
        )
    };
    let mut parts: Vec<String> = lines
        .iter()
        .take(max)
        .map(|l| {
            if l.file.is_empty() {
                format!("{}: {}", l.description, amount(l))
            } else {
                format!("{} ({})", l.description, amount(l))
            }
        })
        .collect();
    if lines.len() > max {
        parts.push(format!("{} more", lines.len() - max));
    }
    parts.join(", ")
}

/// Whether a device's growth is made of PyTorch's caching-allocator segments: `Some(true)`
/// when a call site that made it grow runs in PyTorch's CUDA library, `Some(false)` when the
/// program is Python (PyTorch is likely but not seen), `None` otherwise. Only for growth
/// without tensor-level events.
pub fn torch_segments(p: &Process, grew_at: &[GrewAt]) -> Option<bool> {
    if grew_at.iter().any(|g| in_torch(p, g.site)) {
        Some(true)
    } else if !p.codes.is_empty() {
        Some(false)
    } else {
        None
    }
}

/// Whether a site's stack passes through PyTorch's CUDA allocator.
pub fn in_torch(p: &Process, site: SiteId) -> bool {
    p.sites.get(site.0 as usize).is_some_and(|frames| {
        frames.iter().filter_map(|f| f.module).any(|m| {
            let path = &p.modules[m].def.path;
            path.contains("libc10_cuda") || path.contains("libtorch_cuda")
        })
    })
}

/// Why memory might still be live at exit, from what the trace can tell.
fn live_hint(p: &Process, device: i16, site: SiteId) -> String {
    let leaking = p.detect.growth.is_leak(site, device);
    if leaking {
        "This call site is also reported as a leak: its memory grew step by step.".into()
    } else if p.end != EndState::Exited(Some(GoodbyeReason::Exit))
        && p.end != EndState::Exited(None)
    {
        "The process did not exit normally, so memory it would have freed may be listed.".into()
    } else {
        "Never freed before exit. Harmless if it was meant to live until the end (weights, \
         caches); the driver reclaims it at exit. A leak shows as growth across steps instead."
            .into()
    }
}

/// A device growth's hint once the stacks are known: PyTorch's segments are named as such
/// (with how to see the tensors); leaks that explain the growth keep their pointer to them.
pub fn device_growth_hint(
    p: &Process,
    e: &device_growth::DeviceGrowthEvidence,
    detected: String,
) -> String {
    let replaceable =
        detected == device_growth::NATIVE_HINT || detected == device_growth::EXPLAINED_HINT;
    if !replaceable || e.events == Events::Tensors {
        return detected;
    }
    match torch_segments(p, &e.grew_at) {
        Some(certain) if detected == device_growth::EXPLAINED_HINT => {
            format!("{detected} {}", device_growth::segments_hint(certain))
        }
        Some(certain) => device_growth::segments_hint(certain),
        None => detected,
    }
}

/// Completes a device growth's evidence from the process's stacks (the detector sees call
/// sites only): the lines that made it grow, and whether its allocations are PyTorch's
/// segments. `native` gives a site's symbolized stack.
pub fn resolve_device_growth(
    p: &Process,
    e: &mut device_growth::DeviceGrowthEvidence,
    native: impl FnMut(SiteId) -> Vec<FrameInfo>,
) {
    e.python_lines = python_lines(p, &e.grew_at, native);
    if e.events == Events::Allocations && torch_segments(p, &e.grew_at).is_some() {
        e.events = Events::Segments;
    }
}

pub fn build(trace: &Trace, opts: &ReportOptions) -> Report {
    let mut sym = StackSymbolizer::new();
    let mut stack_of = |p: &Process, site| {
        if opts.symbolize {
            sym.site(p, site)
        } else {
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
    };
    let mut processes = Vec::new();
    let mut detected = Vec::new();
    let mut live = Vec::new();
    for p in &trace.processes {
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
            })
            .collect();
        processes.push(ProcessReport {
            pid: p.pid(),
            ppid: p.hello.ppid,
            command: p.command(),
            exe: p.hello.exe.clone(),
            status: if p.end == EndState::Abrupt
                && trace
                    .processes
                    .iter()
                    .any(|q| q.pid() == p.pid() && q.hello.ppid == p.hello.ppid && q.conn > p.conn)
            {
                // A later image of the same process: the stream ended at an exec.
                "replaced by exec".into()
            } else {
                status(p, trace)
            },
            events: p.events,
            lost_events: p.lost.events,
            lost_frees: p.lost.frees,
            lost_stacks: p.lost.stacks,
            unmatched_frees: p.unmatched_frees,
            failed_frees: p.failed_frees,
            steps: p.markers,
            duration_s: p.last_ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
            epochs: EpochReport {
                source: p.clock.source.name(),
                count: p.clock.epoch,
                period_allocations: p.clock.period_allocs(),
                median_step_s: p.clock.median_duration_s(),
                stable_since: p.clock.stable_since,
                warmup_end: p.clock.stable_since + crate::detect::growth::WARMUP,
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
        let ctx = p.context();
        for f in p.detect.findings(&ctx) {
            let oom = f
                .record
                .and_then(|i| p.detect.oom.records.get(i))
                .map(|o| OomDetail {
                    requested_bytes: o.size,
                    result: o.result,
                    free_bytes: o.free_bytes,
                    total_bytes: o.total_bytes,
                    live_bytes: o.live_bytes,
                    time_s: o.ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
                    top_sites: o
                        .top_sites
                        .iter()
                        .map(|&(site, bytes, count)| SiteShare {
                            bytes,
                            count,
                            stack: stack_of(p, site),
                        })
                        .collect(),
                });
            let stack = if f.site.0 == 0 {
                Vec::new()
            } else {
                stack_of(p, f.site)
            };
            let leaked_at_oom = f.record.and_then(|i| p.detect.oom.records.get(i)).map(|o| {
                o.top_sites
                    .iter()
                    .filter(|(site, _, _)| p.detect.growth.is_leak(*site, o.device))
                    .fold(0u64, |acc, &(_, bytes, _)| acc.saturating_add(bytes))
            });
            let hint = match leaked_at_oom {
                Some(leaked) if leaked > 0 => format!(
                    "{} of the memory live at the failure was held by call sites that leak step \
                     by step (see the leak findings): without them this allocation would have \
                     had that much more room.",
                    fmt_bytes(leaked)
                ),
                _ if f.kind == Kind::Leak
                    && f.hint == growth::NATIVE_HINT
                    && in_torch(p, f.site) =>
                {
                    growth::TORCH_CACHE_HINT.to_string()
                }
                _ => f.hint,
            };
            let mut evidence = f.evidence;
            let hint = match evidence.as_mut() {
                Some(Evidence::DeviceGrowth(e)) => {
                    let hint = device_growth_hint(p, e, hint);
                    resolve_device_growth(p, e, |site| stack_of(p, site));
                    hint
                }
                // A leak of PyTorch's segments: the lines that made the device's cache grow
                // over the same steps say more than the one call that found it exhausted.
                Some(Evidence::Leak(e)) if in_torch(p, f.site) => {
                    let grew_at = p.detect.device_growth.grew_at(f.device);
                    e.python_lines = python_lines(p, grew_at, |site| stack_of(p, site));
                    hint
                }
                _ => hint,
            };
            detected.push(Finding {
                kind: f.kind.name(),
                level: f.level.name(),
                pid: p.pid(),
                device: f.device,
                bytes: f.bytes,
                growth_bytes_per_step: f.growth_bytes_per_step,
                steps: f.steps,
                stack,
                message: f.message,
                count: f.count,
                api: f.api.map(|a| a.name()).unwrap_or("").into(),
                hint,
                growth_bytes_per_s: f.growth_bytes_per_s,
                evidence,
                oom,
            });
        }
        for &device in p.devices.keys() {
            for (site, bytes, count) in p.top_sites(device, opts.top) {
                let api = p
                    .site_stats
                    .get(&(site, device))
                    .and_then(|s| s.api)
                    .map(|a| a.name())
                    .unwrap_or("?");
                let place = if device == HOST_DEVICE {
                    "in pinned host memory".to_string()
                } else {
                    format!("on device {device}")
                };
                live.push(Finding {
                    kind: "live_at_exit",
                    level: "info",
                    pid: p.pid(),
                    device,
                    bytes,
                    growth_bytes_per_step: None,
                    steps: None,
                    stack: stack_of(p, site),
                    message: format!(
                        "{} in {count} allocation{} ({api}) still live {place} when the process ended",
                        fmt_bytes(bytes),
                        if count == 1 { "" } else { "s" }
                    ),
                    count,
                    api: api.into(),
                    hint: live_hint(p, device, site),
                    growth_bytes_per_s: None,
                    evidence: None,
                    oom: None,
                });
            }
        }
    }
    live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    // OOMs open the report, then leaks, device growth (the process-level view of the same
    // memory), fragmentation, thresholds and bounded growth.
    let rank = |f: &Finding| match f.kind {
        "oom" => 0,
        "leak" => 1,
        "device_growth" => 2,
        "fragmentation" => 3,
        "threshold" => 4,
        _ => 5,
    };
    detected.sort_by_key(|f| rank(f));
    let mut findings = detected;
    findings.extend(live);
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
        },
        processes,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_human() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
    }
}
