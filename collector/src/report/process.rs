//! The report of one process (`processes[]`): who it was, how it ended, its epoch clock, its
//! devices and its failed allocations, from the model's accounting and the analysis's clock.

use oomtrace_proto::wire::GoodbyeReason;

use super::{
    AnatomyMoment, AnatomyReport, AnatomyStep, DeviceReport, EpochReport, FailedAllocations,
    LibraryBytes, LineBytes, ProcessReport, RoleBytesReport, TensorTotals, TorchMemoryReport,
    REPLACED_BY_EXEC,
};
use crate::analysis::anatomy::MomentAnatomy;
use crate::analysis::{trend, Analysis};
use crate::model::trace::Trace;
use crate::model::{EndState, FrameInfo, Process, SiteId, HOST_DEVICE};

/// The report of `p`, whose analysis is `a`; `trace` holds the later images of the same
/// process (after an exec) and why the trace may have been cut short.
pub(super) fn process_report(
    p: &Process,
    a: &Analysis,
    trace: &Trace<Analysis>,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    backward: &mut super::backward::Lookup,
) -> ProcessReport {
    let mut anatomy = anatomy_reports(p, a, stack_of);
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
            anatomy: anatomy.remove(&device),
            levers: Vec::new(),
            since_mark: a.window_peaks.get(&device).copied(),
        })
        .collect();
    ProcessReport {
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
                let stack = stack_of(p, f.last_site);
                let place = backward.backward(p, &stack, &mut |s| stack_of(p, s));
                FailedAllocations {
                    api: api.name(),
                    error_code: code,
                    error: known.map_or("", |e| e.name),
                    meaning: known.map_or("", |e| e.meaning),
                    device,
                    count: f.count,
                    last_size: f.last_size,
                    name: super::names::site_name(&stack, place.as_ref()),
                    stack,
                }
            })
            .collect(),
    }
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

/// Activation lines listed per moment.
const ACTIVATION_LINES: usize = 5;

/// Each device's anatomy, its activation sites named by the line a user reads.
fn anatomy_reports(
    p: &Process,
    a: &Analysis,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
) -> std::collections::BTreeMap<i16, AnatomyReport> {
    let settled = a.anatomy.report(p, &mut |site| {
        super::roles::allocates_library_workspace(&stack_of(p, site))
    });
    let at_s = |ts: u64| ts.saturating_sub(p.first_ts_ns) as f64 / 1e9;
    let mut moment = |m: &MomentAnatomy| {
        let roles = RoleBytesReport::of(&m.roles);
        AnatomyMoment {
            at_s: at_s(m.ts_ns),
            ts_ns: m.ts_ns,
            step: m.step,
            device_bytes: m.device_bytes,
            roles,
            tensor_bytes: roles.total(),
            reserve_gap_bytes: m.reserve_gap_bytes,
            outside_pytorch_bytes: m.outside_bytes,
            outside_pytorch: m
                .outside
                .iter()
                .map(|(library, bytes)| LibraryBytes {
                    library: library.clone(),
                    bytes: *bytes,
                })
                .collect(),
            activations: activation_lines(p, &m.activation_sites, stack_of),
        }
    };
    settled
        .into_iter()
        .map(|d| {
            let report = AnatomyReport {
                at_peak: d.at_peak.as_ref().map(&mut moment),
                at_oom: d.at_oom.iter().map(&mut moment).collect(),
                per_step: d
                    .per_step
                    .iter()
                    .map(|s| AnatomyStep {
                        step: s.step,
                        at_s: at_s(s.ts_ns),
                        roles: RoleBytesReport::of(&s.roles),
                    })
                    .collect(),
            };
            (d.device, report)
        })
        .collect()
}

/// Activation bytes by the line a user reads (the sites' culprit frames; sites that name the
/// same line add up), largest first.
fn activation_lines(
    p: &Process,
    sites: &[(SiteId, u64)],
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
) -> Vec<LineBytes> {
    let mut lines: Vec<LineBytes> = Vec::new();
    // The largest sites first; a few more than shown, since several may share a line.
    for &(site, bytes) in sites.iter().take(ACTIVATION_LINES * 4) {
        let frames = stack_of(p, site);
        let (function, file, line) = match super::symbolize::culprit(&frames) {
            Some(f) => (f.function.clone(), f.file.clone(), f.line),
            None => ("(no stack)".to_string(), String::new(), 0),
        };
        match lines
            .iter_mut()
            .find(|l| l.file == file && l.line == line && l.function == function)
        {
            Some(l) => l.bytes = l.bytes.saturating_add(bytes),
            None => lines.push(LineBytes {
                function,
                file,
                line,
                bytes,
            }),
        }
    }
    lines.sort_by_key(|l| std::cmp::Reverse(l.bytes));
    lines.truncate(ACTIVATION_LINES);
    lines
}
