//! The text report: `full` for `oomtrace report` and the demo, `summary` for the end of `run`.

use std::fmt::Write;

use oomtrace_collector::analysis::device_growth::Events;
use oomtrace_collector::analysis::growth::Trend;
use oomtrace_collector::analysis::Evidence;
use oomtrace_collector::report::ranks::Ranks;
use oomtrace_collector::report::sections::{site_name, DeviceSections, SiteRow};
use oomtrace_collector::report::symbolize::{culprit, FrameInfo};
use oomtrace_collector::report::{
    fmt_python_lines, EpochReport, Finding, Kind, Level, ProcessReport, Report,
};
use oomtrace_collector::units::{fmt_bytes, fmt_duration};

/// Native frames shown per stack in text (the JSON has them all; Python frames are always
/// shown in full).
const TEXT_FRAMES: usize = 8;

/// Calls shown on the line of the machinery a native culprit called into.
const INSIDE_CALLS: usize = 4;

fn frame_text(f: &FrameInfo) -> String {
    let func = if f.function.is_empty() {
        "??"
    } else {
        &f.function
    };
    let file = f.file.rsplit('/').next().unwrap_or(&f.file);
    match (file.is_empty(), f.module.is_empty()) {
        (false, _) if f.line > 0 => format!("{func}  {file}:{}", f.line),
        (false, _) => format!("{func}  {file}"),
        (true, false) => format!("{func}  [{} +{}]", f.module, f.offset),
        (true, true) => format!("{func}  [{}]", f.address),
    }
}

/// Startup frames that say nothing about the program.
fn is_runtime_start(f: &FrameInfo) -> bool {
    matches!(
        f.function.as_str(),
        "__libc_start_call_main"
            | "__libc_start_main"
            | "_start"
            | "__libc_start_main_impl"
            | "start_thread"
            | "clone3"
            | "__clone3"
    )
}

/// Every Python frame of `stack`, in the JSON's order (innermost first), the culprit (the
/// innermost frame of the user's own code) led by "at". Nothing is left out: the Python stack
/// is what the user wrote, and the text must not show less of it than the JSON. Returns false
/// when the stack has no Python frame.
fn python_text(out: &mut String, stack: &[FrameInfo], indent: &str) -> bool {
    let culprit = culprit(stack).filter(|c| c.python);
    let mut any = false;
    for f in stack.iter().filter(|f| f.python) {
        let lead = if culprit.is_some_and(|c| std::ptr::eq(c, f)) {
            "at "
        } else {
            "   "
        };
        let _ = writeln!(out, "{indent}{lead}{}", frame_text(f));
        any = true;
    }
    any
}

/// A call site's stack. With Python frames: all of them (see `python_text`), then the native
/// frames that led from the innermost one to CUDA, on one line. Without: up to
/// `native_frames` native frames.
fn stack_text(out: &mut String, stack: &[FrameInfo], indent: &str, native_frames: usize) {
    if stack.is_empty() {
        let _ = writeln!(out, "{indent}(no stack recorded)");
        return;
    }
    if python_text(out, stack, indent) {
        let native: Vec<&str> = stack
            .iter()
            .take_while(|f| !f.python)
            .filter(|f| !f.function.is_empty())
            .take(4)
            .map(|f| f.function.as_str())
            .collect();
        if !native.is_empty() {
            let _ = writeln!(out, "{indent}   (native: {} ...)", native.join(" <- "));
        }
        return;
    }
    let shown: Vec<&FrameInfo> = stack.iter().filter(|f| !is_runtime_start(f)).collect();
    // The listing opens at the culprit: the CUDA runtime and allocator frames it called
    // (a static runtime's `cudaMalloc` and hashed internals) follow on one line.
    let start = culprit(stack)
        .and_then(|c| shown.iter().position(|f| std::ptr::eq(*f, c)))
        .unwrap_or(0);
    let (inside, shown) = shown.split_at(start);
    for (i, f) in shown.iter().take(native_frames).enumerate() {
        let lead = if i == 0 { "at " } else { "   " };
        let _ = writeln!(out, "{indent}{lead}{}", frame_text(f));
    }
    if shown.len() > native_frames {
        let _ = writeln!(
            out,
            "{indent}   ... {} more frames",
            shown.len() - native_frames
        );
    }
    if !inside.is_empty() {
        // Outermost first, as the calls were made; a long way down keeps its two ends.
        let mut calls: Vec<&str> = inside
            .iter()
            .rev()
            .map(|f| {
                if f.function.is_empty() {
                    f.module.as_str()
                } else {
                    f.function.as_str()
                }
            })
            .collect();
        let more;
        if calls.len() > INSIDE_CALLS {
            more = format!("... {} more", calls.len() - INSIDE_CALLS + 1);
            let last = calls[calls.len() - 1];
            calls.truncate(INSIDE_CALLS - 2);
            calls.push(&more);
            calls.push(last);
        }
        let _ = writeln!(out, "{indent}   (which calls {})", calls.join(" -> "));
    }
}

/// For a call site in PyTorch's backward pass: its autograd node and the forward lines that
/// ran its op, on one line.
fn backward_text(out: &mut String, f: &Finding, indent: &str) {
    let Some(b) = &f.backward_node else { return };
    let forward = if b.forward_lines.is_empty() {
        String::new()
    } else {
        format!(
            "; its forward op `{}` ran at {}",
            b.forward_op,
            fmt_python_lines(&b.forward_lines, "allocation", 3)
        )
    };
    let _ = writeln!(
        out,
        "{indent}in the backward pass, autograd node {}{forward}",
        b.name
    );
}

/// Whether a stack has Python frames (its place is then shown as the Python stack).
fn has_python(stack: &[FrameInfo]) -> bool {
    stack.iter().any(|f| f.python)
}

fn device_name(d: i16) -> String {
    if d < 0 {
        "host (pinned)".into()
    } else {
        format!("device {d}")
    }
}

/// How the run was cut into steps, and how sure that is.
fn epochs_line(e: &EpochReport) -> String {
    let how = match e.source {
        "markers" => "step markers".to_string(),
        "auto" => match e.period_allocations {
            Some(p) => {
                format!("iterations found in the allocations (one every {p:.1} allocations)")
            }
            None => "iterations found in the allocations".to_string(),
        },
        "windows" => "time windows closed at troughs (no iteration found)".to_string(),
        _ => "none (no step marker, no iteration found)".to_string(),
    };
    format!(
        "epochs: {} from {how}, confidence {:.2}",
        e.count, e.confidence
    )
}

fn process_text(out: &mut String, p: &ProcessReport) {
    let lost = if p.lost_events > 0 {
        format!(", {} LOST", p.lost_events)
    } else {
        String::new()
    };
    let steps = if p.steps > 0 {
        format!(", {} steps", p.steps)
    } else {
        String::new()
    };
    let rank = match (p.rank, p.world_size, p.implausible_world_size) {
        (Some(r), Some(w), _) => format!(" (rank {r}/{w})"),
        (Some(r), None, Some(_)) => format!(" (rank {r}, world size implausible)"),
        (Some(r), None, None) => format!(" (rank {r})"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  pid {}{rank}  {}\n      {}, {}{steps}, {} events{lost}",
        p.pid,
        p.command,
        p.status,
        fmt_duration(p.duration_s),
        p.events
    );
    let _ = writeln!(out, "      {}", epochs_line(&p.epochs));
    for d in &p.devices {
        let cap = d
            .capacity_bytes
            .map(|c| format!("   capacity {}", fmt_bytes(c)))
            .unwrap_or_default();
        let failed = if d.failed_allocations > 0 {
            format!("   {} failed", d.failed_allocations)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "      {:<14} peak {:>11}   live at exit {:>11} in {}{cap}{failed}",
            device_name(d.device),
            fmt_bytes(d.peak_bytes),
            fmt_bytes(d.live_at_exit_bytes),
            d.live_at_exit_count
        );
        if let Some(t) = &d.tensors {
            let reserve = d
                .torch_reserved_bytes
                .map(|r| format!("   PyTorch's reserve at exit {}", fmt_bytes(r)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "      {:<14} peak {:>11}   live at exit {:>11} in {}{reserve}",
                "  tensors",
                fmt_bytes(t.peak_bytes),
                fmt_bytes(t.live_at_exit_bytes),
                t.live_at_exit_count
            );
        }
    }
    for f in &p.failed_allocations {
        let error = match (f.error, f.meaning) {
            ("", _) => format!("error {}", f.error_code),
            (name, "") => format!("{name} (error {})", f.error_code),
            (name, meaning) => format!("{name} (error {}: {meaning})", f.error_code),
        };
        let place = match f.device {
            d if d >= 0 => format!(" on device {d}"),
            _ => String::new(),
        };
        // A Python stack is shown whole below the line; a native one by its culprit.
        let at = culprit(&f.stack)
            .filter(|_| !has_python(&f.stack))
            .map(|fr| format!(" at {}", frame_text(fr)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "      {} failed {}{place}: {error}; last asked for {}{at}",
            f.count,
            f.api,
            fmt_bytes(f.last_size)
        );
        python_text(out, &f.stack, "          ");
    }
    if p.unmatched_frees > 0 {
        let _ = writeln!(
            out,
            "      {} frees of pointers never seen allocated (allocated before tracing, or lost)",
            p.unmatched_frees
        );
    }
}

/// " (rank N)" for a finding of a ranked process, "" otherwise.
fn rank_text(f: &Finding) -> String {
    f.rank.map_or_else(String::new, |r| format!(" (rank {r})"))
}

fn oom_text(out: &mut String, f: &Finding, with_holders: bool, native_frames: usize) {
    let _ = writeln!(out, "  pid {}{}: {}", f.pid, rank_text(f), f.message);
    backward_text(out, f, "      ");
    stack_text(out, &f.stack, "      ", native_frames);
    if let (true, Some(o)) = (with_holders, &f.oom) {
        if !o.top_sites.is_empty() {
            let _ = writeln!(out, "    memory held at that moment by:");
            for s in &o.top_sites {
                // A native holder is named by its culprit on its line; a Python one by its
                // whole Python stack below it.
                let top = if has_python(&s.stack) {
                    String::new()
                } else {
                    culprit(&s.stack)
                        .map(|c| format!("  {}", frame_text(c)))
                        .unwrap_or_else(|| "  (no stack)".into())
                };
                let _ = writeln!(
                    out,
                    "      {:>11} in {:>5}{top}",
                    fmt_bytes(s.bytes),
                    s.count
                );
                python_text(out, &s.stack, "          ");
            }
        }
    }
}

/// The trend behind a leak or a device growth, with what the text says beside it.
struct TrendText<'a> {
    trend: &'a Trend,
    onset_step: u32,
    peak_bytes: u64,
    peak_step: u32,
    time_to_oom_s: Option<f64>,
}

fn trend_text(e: &Evidence) -> Option<TrendText<'_>> {
    match e {
        Evidence::Leak(e) => e.trend.as_ref().map(|trend| TrendText {
            trend,
            onset_step: e.onset_step,
            peak_bytes: e.peak_bytes,
            peak_step: e.peak_step,
            time_to_oom_s: e.time_to_oom_s,
        }),
        Evidence::DeviceGrowth(e) => e.trend.as_ref().map(|trend| TrendText {
            trend,
            onset_step: e.onset_step,
            peak_bytes: e.peak_bytes,
            peak_step: e.peak_step,
            time_to_oom_s: e.time_to_oom_s,
        }),
        Evidence::Fragmentation(_) | Evidence::Threshold(_) => None,
    }
}

/// `x`, or `otherwise` when it is not finite (what the JSON writes as `null`).
fn finite_or(x: f64, otherwise: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        otherwise
    }
}

/// A detector's finding: what, the rate, the likely cause, where.
fn detected_text(out: &mut String, f: &Finding, frames: usize) {
    let tag = match f.kind {
        Kind::Leak => format!("{} leak", f.level.name()),
        Kind::Growth => "bounded growth".to_string(),
        Kind::DeviceGrowth => format!("{} device growth", f.level.name()),
        kind => format!("{} {}", kind.name(), f.level.name()),
    };
    let _ = writeln!(
        out,
        "  [{tag}] pid {}{}: {}",
        f.pid,
        rank_text(f),
        f.message
    );
    if let Some(t) = f.evidence.as_ref().and_then(trend_text) {
        let tr = t.trend;
        let ci = |i: usize| fmt_bytes(finite_or(tr.slope_ci[i], 0.0).max(0.0) as u64);
        // The trend of the last window and the peak; what was held when it was detected and
        // at the end is in the message above (never the end's count as the evidence).
        let _ = writeln!(
            out,
            "      evidence: {} steps, Mann-Kendall p = {:.1e}, slope 95 % CI [{}, {}]/step, \
             onset step {}, peak {} at step {}",
            tr.window,
            finite_or(tr.p_value, 1.0),
            ci(0),
            ci(1),
            t.onset_step,
            fmt_bytes(t.peak_bytes),
            t.peak_step,
        );
        if let Some(s) = t.time_to_oom_s.filter(|s| s.is_finite()) {
            let _ = writeln!(
                out,
                "      at this rate the device is full in {}",
                fmt_duration(s)
            );
        }
    }
    // Which lines made the device (or PyTorch's cache) grow: a device's growth has no stack of
    // its own, and a leak of segments has only the call that found the cache exhausted.
    let grew_at = match &f.evidence {
        Some(Evidence::DeviceGrowth(e)) => Some((e.events, &e.python_lines)),
        Some(Evidence::Leak(e)) => Some((Events::Segments, &e.python_lines)),
        _ => None,
    };
    if let Some((events, lines)) = grew_at.filter(|(_, l)| !l.is_empty()) {
        let _ = writeln!(
            out,
            "      {}: {}",
            events.grew_at(),
            fmt_python_lines(lines, events.unit(), 5)
        );
    }
    let _ = writeln!(out, "      why: {}", f.hint);
    backward_text(out, f, "      ");
    if !f.stack.is_empty() {
        stack_text(out, &f.stack, "      ", frames);
    }
}

fn is_detected(f: &Finding) -> bool {
    f.kind.detected()
}

/// The whole text report. OOMs open it: after a crash that is the first question.
pub fn full(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "oomtrace report: {}", r.trace.path);
    // The reasons are stated here, in the report itself: the warnings on stderr may never be
    // seen by whoever reads this text (redirected to a file, piped, shown by the demo).
    let mut warnings = r.trace.warnings.iter();
    if !r.trace.complete {
        let reason = match warnings.next() {
            Some(w) => w.clone(),
            None => "the trace has no end record (its writer was killed or is still \
                     writing): the last events may be missing"
                .to_string(),
        };
        let _ = writeln!(out, "  (incomplete trace: {reason})");
    }
    for w in warnings {
        let _ = writeln!(out, "  (warning: {w})");
    }
    for s in &r.skipped {
        let _ = writeln!(out, "  (skipped {}: {})", s.path, s.reason);
    }
    if let Some(ranks) = &r.ranks {
        ranks_text(&mut out, ranks);
    }
    let ooms: Vec<&Finding> = r.findings.iter().filter(|f| f.kind == Kind::Oom).collect();
    if !ooms.is_empty() {
        let _ = writeln!(out, "\nOut of memory ({})", ooms.len());
        for (i, f) in ooms.iter().enumerate() {
            // The first failure tells the story; later ones are usually retries.
            oom_text(&mut out, f, i == 0, TEXT_FRAMES);
            if i == 0 {
                let _ = writeln!(out, "      why: {}", f.hint);
            }
        }
    }
    let detected: Vec<&Finding> = r.findings.iter().filter(|f| is_detected(f)).collect();
    if !detected.is_empty() {
        let _ = writeln!(out, "\nFindings ({})", detected.len());
        for f in detected {
            detected_text(&mut out, f, TEXT_FRAMES);
        }
    }
    let _ = writeln!(out, "\nProcesses ({})", r.processes.len());
    for p in &r.processes {
        process_text(&mut out, p);
    }
    let live: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| f.kind == Kind::LiveAtExit)
        .collect();
    if live.is_empty() {
        let _ = writeln!(
            out,
            "\nNothing was still allocated when the processes ended."
        );
    } else {
        let _ = writeln!(out, "\nStill live at exit, by call site");
        for (i, f) in live.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:>2}. {} in {} ({}), {}, pid {}",
                i + 1,
                fmt_bytes(f.bytes),
                f.count,
                f.api_name(),
                device_name(f.device),
                f.pid
            );
            backward_text(&mut out, f, "        ");
            stack_text(&mut out, &f.stack, "        ", TEXT_FRAMES);
        }
    }
    for s in &r.sections {
        sections_text(&mut out, s);
    }
    out
}

/// A size bucket's range, e.g. `[1.0 MiB, 2.0 MiB)`.
fn bucket_text(min: u64, max: u64) -> String {
    if min == 0 {
        "0 B".into()
    } else {
        format!("[{}, {})", fmt_bytes(min), fmt_bytes(max.saturating_add(1)))
    }
}

fn site_row_text(out: &mut String, r: &SiteRow) {
    let _ = writeln!(
        out,
        "    peak {:>10}  end {:>10}  {:>7} allocs  {:>7} temporary  {:>+12.0} B/step  {}",
        fmt_bytes(r.peak_bytes),
        fmt_bytes(r.live_at_exit_bytes),
        r.allocations,
        r.temporary,
        r.growth_per_step,
        site_name(&r.stack)
    );
}

/// The heaptrack_print-like sections of one process and device (`oomtrace report`).
fn sections_text(out: &mut String, s: &DeviceSections) {
    let t = &s.totals;
    let _ = writeln!(out, "\nSections: pid {}, {}", s.pid, device_name(s.device));
    let _ = writeln!(
        out,
        "  totals: {} allocations, {} frees ({} temporary), {} allocated in total, peak {} at \
         {}, {} in {} live at exit, {} steps",
        t.allocations,
        t.frees,
        t.temporary,
        fmt_bytes(t.bytes_allocated),
        fmt_bytes(t.peak_bytes),
        fmt_duration(t.peak_time_s),
        fmt_bytes(t.live_at_exit_bytes),
        t.live_at_exit_count,
        t.steps
    );
    let _ = writeln!(out, "  peak consumers (held at the peak):");
    for c in &s.peak_consumers {
        let _ = writeln!(
            out,
            "    {:>10} in {:>5}  {}",
            fmt_bytes(c.bytes),
            c.count,
            site_name(&c.stack)
        );
    }
    let _ = writeln!(out, "  most allocations:");
    for r in &s.most_allocations {
        let _ = writeln!(
            out,
            "    {:>7} allocations, {:>10} in total  {}",
            r.allocations,
            fmt_bytes(r.bytes_allocated),
            site_name(&r.stack)
        );
    }
    let _ = writeln!(out, "  most temporary allocations (freed in their step):");
    for r in &s.most_temporary {
        let _ = writeln!(
            out,
            "    {:>7} of {:>7} allocations  {}",
            r.temporary,
            r.allocations,
            site_name(&r.stack)
        );
    }
    let _ = writeln!(out, "  allocation sizes:");
    for b in &s.size_histogram {
        let _ = writeln!(
            out,
            "    {:>22}  {:>7} allocations  {:>10}",
            bucket_text(b.min_bytes, b.max_bytes),
            b.count,
            fmt_bytes(b.bytes)
        );
    }
    let _ = writeln!(out, "  call sites (by {}):", s.sort);
    for r in &s.sites {
        site_row_text(out, r);
    }
}

/// A few lines for the end of `oomtrace run`.
/// The rank table and what it says (`report::ranks`).
fn ranks_text(out: &mut String, ranks: &Ranks) {
    let of = match (ranks.world_size, ranks.implausible_world_size) {
        (Some(w), _) => format!(" of {w}"),
        (None, Some(said)) => format!(
            "; world size unknown: {} is implausible (above {})",
            if said == u64::MAX {
                "a number beyond 2^64".to_string()
            } else {
                said.to_string()
            },
            oomtrace_proto::launch::MAX_WORLD_SIZE
        ),
        (None, None) => String::new(),
    };
    let _ = writeln!(out, "\nRanks ({}{of})", ranks.rows.len());
    for v in &ranks.verdicts {
        let _ = writeln!(out, "  {}", v.message);
    }
    if !ranks.missing.is_empty() {
        let missing: Vec<String> = ranks.missing.iter().map(u32::to_string).collect();
        let more = ranks
            .missing_count
            .saturating_sub(ranks.missing.len() as u64);
        let (s, more) = if more > 0 {
            ("s", format!(" and {more} more"))
        } else if ranks.missing_count > 1 {
            ("s", String::new())
        } else {
            ("", String::new())
        };
        let _ = writeln!(
            out,
            "  no trace holds {} rank{s}: {}{more}",
            ranks.missing_count,
            missing.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "  {:>5}  {:<16} {:>8}  {:>10}  {:>10}  {:>12}  findings",
        "rank", "host", "pid", "peak", "at exit", "growth/step"
    );
    for row in &ranks.rows {
        let growth = row
            .growth_bytes_per_step
            .map_or_else(|| "-".to_string(), |g| format!("+{}", fmt_bytes(g as u64)));
        let oom = if row.oom { ", OOM" } else { "" };
        let _ = writeln!(
            out,
            "  {:>5}  {:<16} {:>8}  {:>10}  {:>10}  {:>12}  {}{oom}",
            row.rank,
            if row.host.is_empty() { "?" } else { &row.host },
            row.pid,
            fmt_bytes(row.peak_bytes),
            fmt_bytes(row.live_at_exit_bytes),
            growth,
            row.findings
        );
    }
}

pub fn summary(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\noomtrace summary");
    if let Some(ranks) = &r.ranks {
        for v in &ranks.verdicts {
            let _ = writeln!(out, "  ranks: {}", v.message);
        }
    }
    for p in &r.processes {
        process_text(&mut out, p);
    }
    if let Some(f) = r.findings.iter().find(|f| f.kind == Kind::Oom) {
        let _ = writeln!(out, "  first out-of-memory:");
        oom_text(&mut out, f, false, TEXT_FRAMES);
    }
    for f in r
        .findings
        .iter()
        // Growth that stopped or slowed (a cache filling up) is in the full report only.
        .filter(|f| is_detected(f) && f.kind != Kind::Growth)
        .filter(|f| !(f.kind == Kind::DeviceGrowth && f.level == Level::INFO))
        .take(5)
    {
        detected_text(&mut out, f, 3);
    }
    for f in r
        .findings
        .iter()
        .filter(|f| f.kind == Kind::LiveAtExit)
        .take(3)
    {
        let _ = writeln!(
            out,
            "  live at exit: {} in {} ({}), {}, pid {}",
            fmt_bytes(f.bytes),
            f.count,
            f.api_name(),
            device_name(f.device),
            f.pid
        );
        backward_text(&mut out, f, "      ");
        stack_text(&mut out, &f.stack, "      ", 3);
    }
    // The summary is on stderr already: each changed module's line goes with it.
    for m in &r.stale_modules {
        let _ = writeln!(out, "  warning: {}", m.warning());
    }
    out
}

/// One line per module whose file changed since the trace was taken (for stderr: the text
/// report itself stays the report).
pub fn stale_module_warnings(r: &Report) -> impl Iterator<Item = String> + '_ {
    r.stale_modules
        .iter()
        .map(|m| format!("oomtrace: warning: {}", m.warning()))
}
