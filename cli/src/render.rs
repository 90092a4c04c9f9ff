//! The text report: `full` for `oomtrace report` and the demo, `summary` for the end of `run`.
//!
//! Text is for reading: C++ names are shortened (`report::names`), PyTorch's own C++ frames
//! are folded into one line unless `--native`, and no line is wider than [`MAX_LINE`]
//! characters. The JSON keeps everything whole.

use std::fmt::Write;

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
use oomtrace_collector::report::{is_tensor_level, Cause, Events, Evidence, Remedy, Trend};
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

mod anatomy;
mod diff;
mod finding;
mod ranks;
mod sections;
mod stack;

pub use diff::diff;
use finding::*;
use ranks::*;
use sections::*;
use stack::*;

#[cfg(test)]
mod tests;
