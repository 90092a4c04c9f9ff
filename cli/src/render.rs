//! The text report: `full` for `oomtrace report` and the demo, `summary` for the end of `run`.
//!
//! Text is for reading: C++ names are shortened (`report::names`), PyTorch's own C++ frames
//! are folded into one line unless `--native`, and no line is wider than [`MAX_LINE`]
//! characters. The JSON keeps everything whole.

use std::fmt::Write;

use oomtrace_collector::analysis::device_growth::Events;
use oomtrace_collector::analysis::fragmentation::is_tensor_level;
use oomtrace_collector::analysis::refusal::Remedy;
use oomtrace_collector::analysis::trend::Trend;
use oomtrace_collector::analysis::{Cause, Evidence};
use oomtrace_collector::report::backward::in_backward;
use oomtrace_collector::report::diff::{delta as diff_delta, row_label, Diff, SideSite};
use oomtrace_collector::report::names::{ellipsize, is_torch_frame, short_function};
use oomtrace_collector::report::ranks::Ranks;
use oomtrace_collector::report::roles::FrameRole;
use oomtrace_collector::report::sections::{DeviceSections, ListsOf, SiteRow};
use oomtrace_collector::report::symbolize::{culprit, python_library, FrameInfo};
use oomtrace_collector::report::{
    fmt_python_lines, EpochReport, Finding, Held, Kind, Level, Lever, ProcessReport, Report,
    SimulatedDevice,
};
use oomtrace_collector::units::{device_name, fmt_bytes, fmt_count, fmt_duration, fmt_rate};

/// Native frames shown per stack in text (the JSON has them all; Python frames are always
/// shown in full).
const TEXT_FRAMES: usize = 8;

/// Calls shown on the line of the machinery a native culprit called into.
const INSIDE_CALLS: usize = 4;

/// The widest line of a text report, in characters.
pub const MAX_LINE: usize = 200;

/// The widest file or module name in a frame's text.
const MAX_FILE: usize = 60;

/// What the text shows beyond its default.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextOptions {
    /// PyTorch's own C++ frames one by one, instead of folded into one line
    /// (`oomtrace report --native`).
    pub native: bool,
    /// The trace ran on the simulated GPU: kernels did not run, so its seconds say nothing of
    /// a real run; forecasts are said in steps only.
    pub simulated: bool,
    /// Every Python frame, libraries' too, instead of each run of library frames folded into
    /// one line (`oomtrace report --full`).
    pub full: bool,
}

/// A frame's function as text: a C++ name shortened, `??` when unknown.
fn function_text(f: &FrameInfo) -> String {
    if f.function.is_empty() {
        "??".into()
    } else if f.python {
        ellipsize(&f.function, 2 * MAX_FILE)
    } else {
        short_function(&f.function)
    }
}

fn frame_text(f: &FrameInfo) -> String {
    let func = function_text(f);
    let file = f.file.rsplit('/').next().unwrap_or(&f.file);
    let file = ellipsize(file, MAX_FILE);
    let file = file.as_str();
    match (file.is_empty(), f.module.is_empty()) {
        (false, _) if f.line > 0 => format!("{func}  {file}:{}", f.line),
        (false, _) => format!("{func}  {file}"),
        (true, false) => format!("{func}  [{} +{}]", ellipsize(&f.module, MAX_FILE), f.offset),
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

/// The Python frames of `stack`, in the JSON's order (innermost first), the culprit (the
/// innermost frame of the user's own code) led by "at". The user's frames are all shown; each
/// run of library frames (PyTorch's, the standard library's) is one line naming them,
/// `(3 torch.nn frames)`, unless `opts.full` (`report --full`), and the culprit is shown even
/// where it is a library's (a stack with no frame of the user's). Returns false when the
/// stack has no Python frame.
fn python_text(out: &mut String, stack: &[FrameInfo], indent: &str, opts: &TextOptions) -> bool {
    let culprit = culprit(stack).filter(|c| c.python);
    let mut any = false;
    // The run of library frames not yet said: how many, and their libraries in order.
    let mut run: (usize, Vec<String>) = (0, Vec::new());
    let flush = |out: &mut String, run: &mut (usize, Vec<String>)| {
        if run.0 > 0 {
            let s = if run.0 == 1 { "" } else { "s" };
            let _ = writeln!(out, "{indent}   ({} {} frame{s})", run.0, run.1.join(", "));
            *run = (0, Vec::new());
        }
    };
    for f in stack.iter().filter(|f| f.python) {
        any = true;
        let is_culprit = culprit.is_some_and(|c| std::ptr::eq(c, f));
        if !opts.full && !is_culprit {
            if let Some(library) = python_library(f) {
                run.0 += 1;
                if !run.1.contains(&library) {
                    run.1.push(library);
                }
                continue;
            }
        }
        flush(out, &mut run);
        let lead = if is_culprit { "at " } else { "   " };
        let _ = writeln!(out, "{indent}{lead}{}", frame_text(f));
    }
    flush(out, &mut run);
    any
}

/// The native frames of `frames` for one line, innermost first: each by its short name, and
/// (unless `opts.native`) each run of PyTorch's own C++ frames as one part,
/// `14 PyTorch C++ frames`.
fn native_parts(frames: &[&FrameInfo], opts: &TextOptions) -> Vec<String> {
    let mut parts = Vec::new();
    let mut folded = 0usize;
    let fold = |parts: &mut Vec<String>, folded: &mut usize| {
        if *folded > 0 {
            let s = if *folded == 1 { "" } else { "s" };
            parts.push(format!("{folded} PyTorch C++ frame{s}"));
            *folded = 0;
        }
    };
    // Consecutive frames of one unnamed module are one part: `libcublas.so.13 (4 frames)`.
    let mut repeated = 0usize;
    for f in frames {
        if !opts.native && FrameRole::of(f) == FrameRole::Interpreter {
            // The interpreter between two Python frames: its Python frames say it.
            continue;
        }
        if !opts.native && is_torch_frame(f) {
            folded += 1;
            continue;
        }
        fold(&mut parts, &mut folded);
        let part = if f.function.is_empty() {
            ellipsize(f.module.rsplit('/').next().unwrap_or(&f.module), MAX_FILE)
        } else {
            function_text(f)
        };
        if f.function.is_empty() && parts.last().is_some_and(|p| p.starts_with(&part)) {
            repeated += 1;
            if let Some(last) = parts.last_mut() {
                *last = format!("{part} ({} frames)", repeated + 1);
            }
            continue;
        }
        repeated = 0;
        parts.push(part);
    }
    fold(&mut parts, &mut folded);
    parts
}

/// A call site's stack. With Python frames: all of them (see `python_text`), then the native
/// frames that led from the innermost one to CUDA, on one line. Without: up to
/// `native_frames` native frames. PyTorch's own C++ frames are folded unless `opts.native`.
fn stack_text(
    out: &mut String,
    stack: &[FrameInfo],
    indent: &str,
    native_frames: usize,
    opts: &TextOptions,
) {
    if stack.is_empty() {
        let _ = writeln!(out, "{indent}(no stack recorded)");
        return;
    }
    if python_text(out, stack, indent, opts) {
        let native: Vec<&FrameInfo> = stack
            .iter()
            .take_while(|f| !f.python)
            .filter(|f| !f.function.is_empty() || !f.module.is_empty())
            .collect();
        let parts = native_parts(&native, opts);
        let shown = if opts.native { native_frames } else { 4 };
        if !parts.is_empty() {
            let more = if parts.len() > shown { " ..." } else { "" };
            let parts: Vec<&str> = parts.iter().take(shown).map(String::as_str).collect();
            let _ = writeln!(out, "{indent}   (native: {}{more})", parts.join(" <- "));
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
    // Each line: a frame, or a run of PyTorch's own frames folded into one.
    let mut lines: Vec<String> = Vec::new();
    let mut folded = 0usize;
    for f in shown {
        if !opts.native && is_torch_frame(f) {
            folded += 1;
            continue;
        }
        if folded > 0 {
            lines.push(format!("... {folded} PyTorch C++ frames"));
            folded = 0;
        }
        lines.push(frame_text(f));
    }
    if folded > 0 {
        lines.push(format!(
            "... {folded} PyTorch C++ frames (--native shows them)"
        ));
    }
    for (i, line) in lines.iter().take(native_frames).enumerate() {
        let lead = if i == 0 && !line.starts_with("...") {
            "at "
        } else {
            "   "
        };
        let _ = writeln!(out, "{indent}{lead}{line}");
    }
    if lines.len() > native_frames {
        let _ = writeln!(
            out,
            "{indent}   ... {} more frames",
            lines.len() - native_frames
        );
    }
    if !inside.is_empty() {
        // Outermost first, as the calls were made; a long way down keeps its two ends.
        let outermost_first: Vec<&FrameInfo> = inside.iter().rev().copied().collect();
        let mut calls = native_parts(&outermost_first, opts);
        if calls.len() > INSIDE_CALLS {
            let more = format!("... {} more", calls.len() - INSIDE_CALLS + 1);
            let last = calls.pop().unwrap_or_default();
            calls.truncate(INSIDE_CALLS - 2);
            calls.push(more);
            calls.push(last);
        }
        let _ = writeln!(out, "{indent}   (which calls {})", calls.join(" -> "));
    }
}

/// For a call site in PyTorch's backward pass: its autograd node and the forward lines that
/// ran its op, on one line; for an allocation of the autograd engine outside any node, its
/// name (the lines that ran the backward pass).
fn backward_text(out: &mut String, f: &Finding, indent: &str) {
    let Some(b) = &f.backward_node else {
        if in_backward(&f.stack) && !f.site_name.is_empty() {
            let _ = writeln!(out, "{indent}in the backward pass: {}", f.site_name);
        }
        return;
    };
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

fn process_text(out: &mut String, p: &ProcessReport, opts: &TextOptions) {
    let lost = if p.lost_events > 0 {
        format!(", {} LOST", p.lost_events)
    } else {
        String::new()
    };
    let steps = if p.steps > 0 {
        format!(", {}", fmt_count(p.steps, "step"))
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
        "  pid {}{rank}  {}\n      {}, {}{steps}, {}{lost}",
        p.pid,
        p.command,
        p.status,
        fmt_duration(p.duration_s),
        fmt_count(p.events, "event")
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
            let _ = writeln!(
                out,
                "      {:<14} peak {:>11}   live at exit {:>11} in {}",
                "  tensors",
                fmt_bytes(t.peak_bytes),
                fmt_bytes(t.live_at_exit_bytes),
                t.live_at_exit_count
            );
        }
        // PyTorch's reserve: one line for the device, not its segments' call sites.
        if let Some(reserved) = d.torch_reserved_bytes {
            let segments = d.torch_segments.unwrap_or(0);
            let in_tensors = d.tensors.as_ref().map_or(0, |t| t.live_at_exit_bytes);
            let _ = writeln!(
                out,
                "        PyTorch's cache: {} reserved in {segments} segment{}, {} of it in tensors \
                 at exit",
                fmt_bytes(reserved),
                if segments == 1 { "" } else { "s" },
                fmt_bytes(in_tensors)
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
        // A Python stack is shown whole below the line; a native one by its culprit, a
        // backward-pass one by its name.
        let at = if in_backward(&f.stack) {
            format!(" at {}", f.name)
        } else {
            culprit(&f.stack)
                .filter(|_| !has_python(&f.stack))
                .map(|fr| format!(" at {}", frame_text(fr)))
                .unwrap_or_default()
        };
        // oomtrace's own entry points are no name a user knows: what they allocate is.
        let s = if f.count == 1 { "" } else { "s" };
        let api = match f.api {
            "oomtrace_torch_alloc" => format!("tensor allocation{s} (PyTorch's allocator)"),
            "oomtrace_malloc" => format!("tensor allocation{s} (through oomtrace's allocator)"),
            other => other.to_string(),
        };
        let _ = writeln!(
            out,
            "      {} failed {api}{place}: {error}; last asked for {}{at}",
            f.count,
            fmt_bytes(f.last_size)
        );
        python_text(out, &f.stack, "          ", opts);
    }
    if p.unmatched_frees > 0 {
        let _ = writeln!(
            out,
            "      {} never seen allocated (allocated before tracing, or lost)",
            if p.unmatched_frees == 1 {
                "1 free of a pointer".to_string()
            } else {
                format!("{} frees of pointers", p.unmatched_frees)
            }
        );
    }
}

/// " (rank N)" for a finding of a ranked process, "" otherwise.
fn rank_text(f: &Finding) -> String {
    f.rank.map_or_else(String::new, |r| format!(" (rank {r})"))
}

fn oom_text(
    out: &mut String,
    f: &Finding,
    with_holders: bool,
    native_frames: usize,
    opts: &TextOptions,
) {
    headline(
        out,
        &format!("  pid {}{}:", f.pid, rank_text(f)),
        &f.message,
    );
    backward_text(out, f, "      ");
    stack_text(out, &f.stack, "      ", native_frames, opts);
    if let Some(o) = &f.oom {
        if let Some(u) = o.reserved_unallocated_bytes {
            let _ = writeln!(
                out,
                "    the memory was there but in pieces: {} reserved but unallocated in PyTorch's \
                 cache, {} requested",
                fmt_bytes(u),
                fmt_bytes(o.requested_bytes)
            );
        }
        remedies_text(out, &o.remedies);
    }
    if let Some(m) = &f.anatomy {
        let _ = writeln!(out, "    what the device's memory was then:");
        anatomy::moment(out, m, "      ");
    }
    levers_text(out, &f.levers, "    ", "to make it fit");
    if let (true, Some(o)) = (with_holders, &f.oom) {
        if !o.top_sites.is_empty() {
            let _ = writeln!(out, "    memory held at that moment by:");
            for s in &o.top_sites {
                // A native holder is named by its culprit on its line; a Python one by its
                // whole Python stack below it.
                let top = if has_python(&s.stack) {
                    String::new()
                } else if in_backward(&s.stack) {
                    format!("  {}", s.name)
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
                python_text(out, &s.stack, "          ", opts);
            }
        }
    }
}

/// A finding's first line, `head` then its message; a message that would make the line
/// wider than [`MAX_LINE`] goes whole on the next line (a finding's message is found in the
/// text as it is in the JSON).
fn headline(out: &mut String, head: &str, message: &str) {
    if head.chars().count() + 1 + message.chars().count() <= MAX_LINE {
        let _ = writeln!(out, "{head} {message}");
    } else {
        let _ = writeln!(out, "{head}\n      {message}");
    }
}

/// The trend behind a leak or a device growth, with what the text says beside it.
struct TrendText<'a> {
    trend: &'a Trend,
    onset_step: u32,
    peak_bytes: u64,
    peak_step: u32,
    time_to_oom_s: Option<f64>,
    steps_to_oom: Option<f64>,
}

fn trend_text(e: &Evidence) -> Option<TrendText<'_>> {
    match e {
        Evidence::Leak(e) => e.trend.as_ref().map(|trend| TrendText {
            trend,
            onset_step: e.onset_step,
            peak_bytes: e.peak_bytes,
            peak_step: e.peak_step,
            time_to_oom_s: e.time_to_oom_s,
            steps_to_oom: e.steps_to_oom,
        }),
        Evidence::DeviceGrowth(e) => e.trend.as_ref().map(|trend| TrendText {
            trend,
            onset_step: e.onset_step,
            peak_bytes: e.peak_bytes,
            peak_step: e.peak_step,
            time_to_oom_s: e.time_to_oom_s,
            steps_to_oom: e.steps_to_oom,
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
fn detected_text(out: &mut String, f: &Finding, frames: usize, opts: &TextOptions) {
    let tag = match f.kind {
        Kind::Leak => format!("{} leak", f.level.name()),
        Kind::Growth if f.cause == Cause::WorkingSetGrowing => {
            format!("working set growth {}", f.level.name())
        }
        Kind::Growth => "bounded growth".to_string(),
        Kind::DeviceGrowth => format!("{} device growth", f.level.name()),
        kind => format!("{} {}", kind.name(), f.level.name()),
    };
    // Tensors kept by a Python line: that line is what to change, named first.
    let tensors = f.api.is_some_and(is_tensor_level);
    // A backward-pass site by its name (its forward line).
    let at = if in_backward(&f.stack) && !f.site_name.is_empty() {
        format!(" at {}", f.site_name)
    } else {
        culprit(&f.stack)
            .filter(|c| c.python && tensors)
            .map(|c| {
                let file = c.file.rsplit('/').next().unwrap_or(&c.file);
                format!(" at {}:{}", ellipsize(file, MAX_FILE), c.line)
            })
            .unwrap_or_default()
    };
    let head = format!("  [{tag}] pid {}{}{at}:", f.pid, rank_text(f));
    headline(out, &head, &f.message);
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
        // In steps, which mean the same on a real GPU; seconds too, except on the simulated
        // one, where kernels take no time.
        let steps = t
            .steps_to_oom
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| fmt_count(s.ceil() as u64, "step"));
        let secs = t
            .time_to_oom_s
            .filter(|s| s.is_finite() && !opts.simulated)
            .map(fmt_duration);
        let when = match (steps, secs) {
            (Some(n), Some(s)) => Some(format!("{n} ({s})")),
            (Some(n), None) => Some(n),
            (None, Some(s)) => Some(s),
            (None, None) => None,
        };
        if let Some(when) = when {
            let _ = writeln!(out, "      at this rate the device is full in {when}");
        }
    }
    // Which lines made the device (or PyTorch's cache) grow: a device's growth has no stack of
    // its own, and a leak of segments has only the call that found the cache exhausted.
    let grew_at = match &f.evidence {
        Some(Evidence::DeviceGrowth(e)) => Some((e.events, &e.python_lines)),
        Some(Evidence::Leak(e)) => Some((Events::Segments, &e.python_lines)),
        Some(Evidence::Fragmentation(e)) => Some((Events::Segments, &e.python_lines)),
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
    if let Some(Evidence::Fragmentation(e)) = &f.evidence {
        remedies_text(out, &e.remedies);
    }
    levers_text(out, &f.levers, "      ", "or");
    backward_text(out, f, "      ");
    if !f.stack.is_empty() {
        stack_text(out, &f.stack, "      ", frames, opts);
    }
}

/// A finding's or a device's levers (`oomtrace fit`), one line each after `what`.
pub fn levers_text(out: &mut String, levers: &[Lever], indent: &str, what: &str) {
    for (i, l) in levers.iter().enumerate() {
        let at_least = if l.lower_bound { "at least " } else { "" };
        let more = if i + 1 == levers.len() {
            " (`oomtrace fit` for more)"
        } else {
            ""
        };
        let fits = match (l.fits, l.capacity_bytes) {
            (Some(true), Some(c)) => format!(", fits {}", fmt_bytes(c)),
            (Some(false), Some(c)) => format!(", does not fit {}", fmt_bytes(c)),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{indent}{what}: {}: max_memory_reserved() {at_least}{}{fits}{more}",
            l.name,
            fmt_bytes(l.peak_reserved_bytes)
        );
    }
}

/// The `PYTORCH_CUDA_ALLOC_CONF` settings a fragmentation finding (or an OOM in pieces)
/// suggests, each with what the replay of this trace predicts.
pub fn remedies_text(out: &mut String, remedies: &[Remedy]) {
    if remedies.is_empty() {
        return;
    }
    let predicted = remedies
        .iter()
        .any(|r| r.predicted_peak_reserved_bytes.is_some());
    let _ = writeln!(
        out,
        "      try PYTORCH_CUDA_ALLOC_CONF={}",
        if predicted {
            "(predicted by replaying this trace through PyTorch's allocator; `oomtrace whatif`):"
        } else {
            "(not predicted: tensors were not traced):"
        }
    );
    for r in remedies {
        let effect = match (
            r.predicted_peak_reserved_bytes,
            r.baseline_peak_reserved_bytes,
        ) {
            (Some(p), Some(b)) => {
                let verdict = if (p as f64) < 0.9 * b as f64 {
                    "better"
                } else if (p as f64) > 1.1 * b as f64 {
                    "worse"
                } else {
                    "no better"
                };
                format!(
                    "peak reserve {} instead of {} ({verdict})",
                    fmt_bytes(p),
                    fmt_bytes(b)
                )
            }
            (Some(p), None) => format!("peak reserve {}", fmt_bytes(p)),
            _ => String::new(),
        };
        let oom = match r.oom_avoided {
            Some(true) => "; the failed request would have fit",
            Some(false) => "; the failed request would still fail",
            None => "",
        };
        let sep = if effect.is_empty() { "" } else { ": " };
        let _ = writeln!(
            out,
            "        {}{sep}{effect}{oom} ({})",
            r.alloc_conf, r.why
        );
    }
}

fn is_detected(f: &Finding) -> bool {
    f.kind.detected()
}

/// The whole text report with the default options.
pub fn full(r: &Report) -> String {
    full_with(r, &TextOptions::default())
}

/// The text of separate runs (`all`, the document of every trace; `runs`, each run's own
/// report): what was done with the traces, then each run's report in turn.
pub fn side_by_side(all: &Report, runs: &[Report], opts: &TextOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "oomtrace report: {}", all.trace.path);
    for s in &all.skipped {
        let _ = writeln!(out, "  (skipped {}: {})", s.path, s.reason);
    }
    if let Some(c) = &all.combined {
        let _ = writeln!(out, "  ({})", c.message);
    }
    for (i, r) in runs.iter().enumerate() {
        let _ = writeln!(out, "\n=== run {} of {} ===", i + 1, runs.len());
        out.push_str(&full_with(r, opts));
    }
    fit(&out, MAX_LINE)
}

/// The whole text report. OOMs open it: after a crash that is the first question.
pub fn full_with(r: &Report, opts: &TextOptions) -> String {
    let opts = &TextOptions {
        simulated: r.trace.simulated.is_some(),
        ..*opts
    };
    let mut out = String::new();
    let _ = writeln!(out, "oomtrace report: {}", r.trace.path);
    if let Some(sim) = &r.trace.simulated {
        let _ = writeln!(out, "  ({})", simulated_words(sim));
    }
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
    if let Some(c) = &r.combined {
        let _ = writeln!(out, "  ({})", c.message);
    }
    if let Some(ranks) = &r.ranks {
        ranks_text(&mut out, ranks);
    }
    // Refusals the program recovered from (PyTorch's allocator freed its cache and retried)
    // are not out-of-memory errors: counted in one line after those, each in the JSON.
    let (failed, retried): (Vec<&Finding>, Vec<&Finding>) = r
        .findings
        .iter()
        .filter(|f| f.kind == Kind::Oom)
        .partition(|f| f.cause != Cause::RetriedAfterFree);
    if !failed.is_empty() {
        let _ = writeln!(out, "\nOut of memory ({})", failed.len());
        for (i, f) in failed.iter().enumerate() {
            // The first failure tells the story; later ones are usually retries.
            oom_text(&mut out, f, i == 0, TEXT_FRAMES, opts);
            if i == 0 {
                let _ = writeln!(out, "      why: {}", f.hint);
            }
        }
    }
    if !retried.is_empty() {
        let _ = writeln!(
            out,
            "\n{} recovered: the allocator freed cached memory and retried (each a \
             `warning` oom finding in the JSON; see the fragmentation finding)",
            fmt_count(retried.len() as u64, "refused allocation")
        );
    }
    let detected: Vec<&Finding> = r.findings.iter().filter(|f| is_detected(f)).collect();
    if !detected.is_empty() {
        let _ = writeln!(out, "\nFindings ({})", detected.len());
        for f in detected {
            detected_text(&mut out, f, TEXT_FRAMES, opts);
        }
    }
    if !r.processes.is_empty() {
        let _ = writeln!(out, "\nProcesses ({})", r.processes.len());
        for p in &r.processes {
            process_text(&mut out, p, opts);
        }
    }
    anatomy::section(&mut out, &r.processes);
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
                "  {:>2}. {} in {}, {}, pid {}",
                i + 1,
                fmt_bytes(f.bytes),
                held_text(f),
                device_name(f.device),
                f.pid
            );
            backward_text(&mut out, f, "        ");
            stack_text(&mut out, &f.stack, "        ", TEXT_FRAMES, opts);
        }
    }
    for s in &r.sections {
        sections_text(&mut out, s);
    }
    fit(&out, MAX_LINE)
}

/// What a report says of a run on the simulated GPU.
pub fn simulated_words(sim: &SimulatedDevice) -> String {
    format!(
        "ran on a simulated {} GPU: no kernel ran, so times say nothing of a real GPU; \
         sizes, lifetimes and steps are real",
        sim.device_memory
    )
}

/// "40 tensors", "1 (cuMemAlloc_v2, outside PyTorch's allocator)", "6 (cudaMalloc)": how
/// many allocations a live call site holds, and what they are.
fn held_text(f: &Finding) -> String {
    let s = if f.count == 1 { "" } else { "s" };
    match f.held {
        Some(Held::Tensors) => format!("{} tensor{s}", f.count),
        Some(Held::TorchReserve) => {
            format!(
                "{} segment{s} of PyTorch's cache ({})",
                f.count,
                f.api_name()
            )
        }
        Some(Held::OutsideTorch) => {
            format!(
                "{} ({}, outside PyTorch's allocator)",
                f.count,
                f.api_name()
            )
        }
        None => format!("{} ({})", f.count, f.api_name()),
    }
}

/// `text` with every line at most `width` characters: a longer line is wrapped at spaces,
/// its continuation indented 4 more than it; a word longer than a line keeps its two ends.
pub fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if body.chars().count() <= width {
            out.push_str(line);
            continue;
        }
        let indent = body.len() - body.trim_start_matches(' ').len();
        let more = " ".repeat((indent + 4).min(width / 2));
        let mut current = " ".repeat(indent);
        let mut current_len = indent;
        let mut first = true;
        for word in body[indent..].split(' ') {
            let room = width.saturating_sub(if first { indent } else { more.len() });
            let word = ellipsize(word, room);
            let n = word.chars().count();
            let empty = current_len == if first { indent } else { more.len() };
            if !empty && current_len + 1 + n > width {
                out.push_str(&current);
                out.push('\n');
                first = false;
                current = more.clone();
                current_len = more.len();
            } else if !empty {
                current.push(' ');
                current_len += 1;
            }
            current.push_str(&word);
            current_len += n;
        }
        out.push_str(&current);
        out.push_str(newline);
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
        "    peak {:>10}  end {:>10}  {:>7} {}  {:>7} temporary  {:>16}  {}{}",
        fmt_bytes(r.peak_bytes),
        fmt_bytes(r.live_at_exit_bytes),
        r.allocations,
        if r.allocations == 1 {
            "alloc "
        } else {
            "allocs"
        },
        r.temporary,
        fmt_rate(r.growth_per_step, None),
        r.name,
        outside(r.held)
    );
}

/// The mark of a listed call site whose memory is outside PyTorch's allocator.
fn outside(held: Option<Held>) -> &'static str {
    if held == Some(Held::OutsideTorch) {
        "  (outside PyTorch's allocator)"
    } else {
        ""
    }
}

/// The heaptrack_print-like sections of one process and device (`oomtrace report`); where
/// PyTorch's tensors are traced, of its tensors (and the memory outside its allocator).
fn sections_text(out: &mut String, s: &DeviceSections) {
    let t = &s.totals;
    let tensors = s.lists_of == ListsOf::Tensors;
    let (noun, of) = if tensors {
        ("tensor", " (tensors; --segments lists PyTorch's segments)")
    } else {
        ("allocation", "")
    };
    // A count in a column: the noun keeps its width ("1 allocation ", "2 allocations").
    let column = |n: u64| {
        if n == 1 {
            format!("{noun} ")
        } else {
            format!("{noun}s")
        }
    };
    let _ = writeln!(
        out,
        "\nSections: pid {}, {}{of}",
        s.pid,
        device_name(s.device)
    );
    let _ = writeln!(
        out,
        "  totals: {}, {} ({} temporary), {} allocated in total, peak {} at \
         {}, {} in {} live at exit, {}",
        fmt_count(t.allocations, noun),
        fmt_count(t.frees, "free"),
        t.temporary,
        fmt_bytes(t.bytes_allocated),
        fmt_bytes(t.peak_bytes),
        fmt_duration(t.peak_time_s),
        fmt_bytes(t.live_at_exit_bytes),
        t.live_at_exit_count,
        fmt_count(t.steps, "step")
    );
    if let Some(o) = s.outside_torch.as_ref().filter(|o| o.allocations > 0) {
        let _ = writeln!(
            out,
            "  outside PyTorch's allocator: {}, {} allocated in total, {} in {} live \
             at exit",
            fmt_count(o.allocations, "allocation"),
            fmt_bytes(o.bytes_allocated),
            fmt_bytes(o.live_at_exit_bytes),
            o.live_at_exit_count
        );
    }
    if !s.peak_consumers.is_empty() {
        let _ = writeln!(
            out,
            "  peak consumers (held at the {}peak):",
            if tensors { "tensors' " } else { "" }
        );
        for c in &s.peak_consumers {
            let _ = writeln!(
                out,
                "    {:>10} in {:>5}  {}{}",
                fmt_bytes(c.bytes),
                c.count,
                c.name,
                outside(c.held)
            );
        }
    }
    if !s.most_allocations.is_empty() {
        let _ = writeln!(out, "  most allocations:");
        for r in &s.most_allocations {
            let _ = writeln!(
                out,
                "    {:>7} {:<12} {:>10} in total  {}{}",
                r.allocations,
                if r.allocations == 1 {
                    "allocation,"
                } else {
                    "allocations,"
                },
                fmt_bytes(r.bytes_allocated),
                r.name,
                outside(r.held)
            );
        }
    }
    if !s.most_temporary.is_empty() {
        let _ = writeln!(out, "  most temporary allocations (freed in their step):");
        for r in &s.most_temporary {
            let _ = writeln!(
                out,
                "    {:>7} of {:>7} allocation{}  {}{}",
                r.temporary,
                r.allocations,
                if r.allocations == 1 { " " } else { "s" },
                r.name,
                outside(r.held)
            );
        }
    }
    if !s.size_histogram.is_empty() {
        let _ = writeln!(
            out,
            "  {} sizes:",
            if tensors { "tensor" } else { "allocation" }
        );
        for b in &s.size_histogram {
            let _ = writeln!(
                out,
                "    {:>22}  {:>7} {}  {:>10}",
                bucket_text(b.min_bytes, b.max_bytes),
                b.count,
                column(b.count),
                fmt_bytes(b.bytes)
            );
        }
    }
    if !s.sites.is_empty() {
        let _ = writeln!(out, "  call sites (by {}):", s.sort);
        for r in &s.sites {
            site_row_text(out, r);
        }
    }
}

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

/// A few lines for the end of `oomtrace run`.
pub fn summary(r: &Report) -> String {
    let opts = &TextOptions {
        simulated: r.trace.simulated.is_some(),
        ..TextOptions::default()
    };
    let mut out = String::new();
    let _ = writeln!(out, "\noomtrace summary");
    if let Some(ranks) = &r.ranks {
        for v in &ranks.verdicts {
            let _ = writeln!(out, "  ranks: {}", v.message);
        }
    }
    for p in &r.processes {
        process_text(&mut out, p, opts);
    }
    anatomy::section(&mut out, &r.processes);
    // The first that was not recovered from; a recovered retry only when none failed.
    let first_oom = r
        .findings
        .iter()
        .filter(|f| f.kind == Kind::Oom)
        .min_by_key(|f| f.cause == Cause::RetriedAfterFree);
    if let Some(f) = first_oom {
        // As the report says it: what held the memory at that moment too.
        let _ = writeln!(out, "  first out-of-memory:");
        oom_text(&mut out, f, true, TEXT_FRAMES, opts);
    }
    for f in r
        .findings
        .iter()
        // Growth that stopped or slowed (a cache filling up) is in the full report only.
        .filter(|f| is_detected(f) && f.kind != Kind::Growth)
        .filter(|f| !(f.kind == Kind::DeviceGrowth && f.level == Level::INFO))
        .take(5)
    {
        detected_text(&mut out, f, 3, opts);
    }
    for f in r
        .findings
        .iter()
        .filter(|f| f.kind == Kind::LiveAtExit)
        .take(3)
    {
        let _ = writeln!(
            out,
            "  live at exit: {} in {}, {}, pid {}",
            fmt_bytes(f.bytes),
            held_text(f),
            device_name(f.device),
            f.pid
        );
        backward_text(&mut out, f, "      ");
        stack_text(&mut out, &f.stack, "      ", 3, opts);
    }
    // The summary is on stderr already: each changed module's line goes with it.
    for m in &r.stale_modules {
        let _ = writeln!(out, "  warning: {}", m.warning());
    }
    fit(&out, MAX_LINE)
}

/// One line per module whose file changed since the trace was taken (for stderr: the text
/// report itself stays the report).
pub fn stale_module_warnings(r: &Report) -> impl Iterator<Item = String> + '_ {
    r.stale_modules
        .iter()
        .map(|m| format!("oomtrace: warning: {}", m.warning()))
}

/// A change in bytes with its sign: `+1.00 MiB`, `-4.00 KiB`.
fn signed_bytes(d: i64) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(d.unsigned_abs()))
}

/// `oomtrace diff`'s text.
pub fn diff(d: &Diff) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "oomtrace diff: {} -> {}", d.before, d.after);
    for (side, work) in [("BEFORE", &d.before_work), ("AFTER", &d.after_work)] {
        if let Some(sim) = &work.simulated {
            let _ = writeln!(out, "  ({side} {})", simulated_words(sim));
        }
    }
    let _ = writeln!(out, "\nDevices");
    for v in &d.devices {
        let _ = writeln!(
            out,
            "  {}: peak {} -> {} ({}), live at exit {} -> {} ({}){}",
            device_name(v.device),
            fmt_bytes(v.before_peak_bytes),
            fmt_bytes(v.after_peak_bytes),
            signed_bytes(diff_delta(v.before_peak_bytes, v.after_peak_bytes)),
            fmt_bytes(v.before_live_at_exit_bytes),
            fmt_bytes(v.after_live_at_exit_bytes),
            signed_bytes(diff_delta(
                v.before_live_at_exit_bytes,
                v.after_live_at_exit_bytes
            )),
            if v.regression { "  REGRESSION" } else { "" }
        );
    }
    if let Some(why) = &d.not_compared {
        let _ = writeln!(out, "  {why}");
    }
    let _ = writeln!(
        out,
        "\nFindings: {} appeared, {} disappeared",
        d.findings.appeared.len(),
        d.findings.disappeared.len()
    );
    for f in &d.findings.appeared {
        let _ = writeln!(out, "  + {} {}", f.kind, f.place());
    }
    for f in &d.findings.disappeared {
        let _ = writeln!(out, "  - {} {}", f.kind, f.place());
    }
    for f in &d.findings.unmatched {
        let _ = writeln!(
            out,
            "  ? {} {}: in one trace only, in an unmatched module",
            f.kind,
            f.place()
        );
    }
    let _ = writeln!(
        out,
        "\nCall sites ({} compared, most changed first)",
        d.sites_compared
    );
    for m in &d.unmatched_modules {
        let _ = writeln!(
            out,
            "  {m} is not the same build in both traces and could not be symbolized in one: \
             its call sites are unmatched, neither gone nor new"
        );
    }
    for s in &d.sites {
        let side = |x: &Option<SideSite>| {
            x.as_ref().map_or("-".to_string(), |x| {
                format!(
                    "peak {} end {}",
                    fmt_bytes(x.peak_bytes),
                    fmt_bytes(x.live_at_exit_bytes)
                )
            })
        };
        let _ = writeln!(
            out,
            "  {:<7} {} ({}): {} -> {}; peak {}, end {}, growth {}{}",
            s.status,
            row_label(&s.name, s.held, s.tells_apart.as_deref()),
            device_name(s.device),
            side(&s.before),
            side(&s.after),
            signed_bytes(s.peak_delta_bytes),
            signed_bytes(s.live_at_exit_delta_bytes),
            fmt_rate(s.growth_per_step_delta, None),
            if s.regression { "  REGRESSION" } else { "" }
        );
    }
    if !d.improvements.is_empty() {
        let _ = writeln!(out, "\nImprovements ({})", d.improvements.len());
        for i in &d.improvements {
            let _ = writeln!(out, "  {i}");
        }
    }
    if d.regression {
        let _ = writeln!(out, "\nRegressions ({})", d.regressions.len());
        for r in &d.regressions {
            let _ = writeln!(out, "  {r}");
        }
    } else {
        let _ = writeln!(out, "\nNo regression.");
    }
    out
}

mod anatomy;

#[cfg(test)]
mod tests;
