//! The text report: `full` for `oomtrace report` and the demo, `summary` for the end of `run`.

use std::fmt::Write;

use oomtrace_collector::report::{fmt_bytes, Finding, ProcessReport, Report};
use oomtrace_collector::symbolize::{culprit, FrameInfo};

/// Frames shown per stack in text (the JSON has them all).
const TEXT_FRAMES: usize = 8;

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

fn stack_text(out: &mut String, stack: &[FrameInfo], indent: &str) {
    if stack.is_empty() {
        let _ = writeln!(out, "{indent}(no stack recorded)");
        return;
    }
    // With Python frames, the Python stack is what the user wrote: show it, from the user's
    // own innermost frame, and the native frames that led to CUDA on one line.
    let python_from = culprit(stack)
        .filter(|f| f.python)
        .and_then(|c| stack.iter().position(|f| std::ptr::eq(f, c)));
    let shown: Vec<&FrameInfo> = match python_from {
        Some(i) => stack[i..].iter().filter(|f| f.python).collect(),
        None => stack.iter().filter(|f| !is_runtime_start(f)).collect(),
    };
    for (i, f) in shown.iter().take(TEXT_FRAMES).enumerate() {
        let lead = if i == 0 { "at " } else { "   " };
        let _ = writeln!(out, "{indent}{lead}{}", frame_text(f));
    }
    if shown.len() > TEXT_FRAMES {
        let _ = writeln!(
            out,
            "{indent}   ... {} more frames",
            shown.len() - TEXT_FRAMES
        );
    }
    if python_from.is_some() {
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
    }
}

fn duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else if secs < 120.0 {
        format!("{secs:.2} s")
    } else {
        format!("{:.0} min {:.0} s", (secs / 60.0).floor(), secs % 60.0)
    }
}

fn device_name(d: i16) -> String {
    if d < 0 {
        "host (pinned)".into()
    } else {
        format!("device {d}")
    }
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
    let _ = writeln!(
        out,
        "  pid {}  {}\n      {}, {}{steps}, {} events{lost}",
        p.pid,
        p.command,
        p.status,
        duration(p.duration_s),
        p.events
    );
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
    }
    for f in &p.failed_allocations {
        let error = match (f.error, f.meaning) {
            ("", _) => format!("error {}", f.error_code),
            (name, "") => format!("{} {name}", f.error_code),
            (name, meaning) => format!("{} {name} ({meaning})", f.error_code),
        };
        let place = match f.device {
            d if d >= 0 => format!(" on device {d}"),
            _ => String::new(),
        };
        let at = culprit(&f.stack)
            .map(|fr| format!(" at {}", frame_text(fr)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "      {} failed {}{place}: {error}; last asked for {}{at}",
            f.count,
            f.api,
            fmt_bytes(f.last_size)
        );
    }
    if p.unmatched_frees > 0 {
        let _ = writeln!(
            out,
            "      {} frees of pointers never seen allocated (allocated before tracing, or lost)",
            p.unmatched_frees
        );
    }
}

fn oom_text(out: &mut String, f: &Finding, with_holders: bool) {
    let _ = writeln!(out, "  pid {}: {}", f.pid, f.message);
    stack_text(out, &f.stack, "      ");
    if let (true, Some(o)) = (with_holders, &f.oom) {
        if !o.top_sites.is_empty() {
            let _ = writeln!(out, "    memory held at that moment by:");
            for s in &o.top_sites {
                let top = culprit(&s.stack)
                    .map(frame_text)
                    .unwrap_or_else(|| "(no stack)".into());
                let _ = writeln!(
                    out,
                    "      {:>11} in {:>5}  {top}",
                    fmt_bytes(s.bytes),
                    s.count
                );
            }
        }
    }
}

/// A detector's finding: what, the rate, the likely cause, where.
fn detected_text(out: &mut String, f: &Finding, frames: usize) {
    let tag = match f.kind {
        "leak" => format!("{} leak", f.level),
        "growth" => "bounded growth".to_string(),
        kind => format!("{kind} {}", f.level),
    };
    let _ = writeln!(out, "  [{tag}] pid {}: {}", f.pid, f.message);
    if let Some(t) = f
        .evidence
        .as_ref()
        .and_then(|e| serde_json::to_value(e).ok())
        .filter(|e| !e["trend"].is_null())
    {
        let tr = &t["trend"];
        let _ = writeln!(
            out,
            "      evidence: {} steps, Mann-Kendall p = {:.1e}, slope 95 % CI [{}, {}]/step, \
             surviving from {} steps, onset step {}",
            tr["window"],
            tr["p_value"].as_f64().unwrap_or(1.0),
            fmt_bytes(tr["slope_ci"][0].as_f64().unwrap_or(0.0).max(0.0) as u64),
            fmt_bytes(tr["slope_ci"][1].as_f64().unwrap_or(0.0).max(0.0) as u64),
            t["surviving_epochs"],
            t["onset_step"],
        );
        if let Some(s) = t["time_to_oom_s"].as_f64() {
            let _ = writeln!(
                out,
                "      at this rate the device is full in {}",
                duration(s)
            );
        }
    }
    let _ = writeln!(out, "      why: {}", f.hint);
    if !f.stack.is_empty() {
        stack_text(out, &f.stack[..f.stack.len().min(frames)], "      ");
    }
}

fn is_detected(f: &Finding) -> bool {
    matches!(f.kind, "leak" | "fragmentation" | "threshold" | "growth")
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
    let ooms: Vec<&Finding> = r.findings.iter().filter(|f| f.kind == "oom").collect();
    if !ooms.is_empty() {
        let _ = writeln!(out, "\nOut of memory ({})", ooms.len());
        for (i, f) in ooms.iter().enumerate() {
            // The first failure tells the story; later ones are usually retries.
            oom_text(&mut out, f, i == 0);
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
        .filter(|f| f.kind == "live_at_exit")
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
                f.api,
                device_name(f.device),
                f.pid
            );
            stack_text(&mut out, &f.stack, "        ");
        }
    }
    out
}

/// A few lines for the end of `oomtrace run`.
pub fn summary(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\noomtrace summary");
    for p in &r.processes {
        process_text(&mut out, p);
    }
    if let Some(f) = r.findings.iter().find(|f| f.kind == "oom") {
        let _ = writeln!(out, "  first out-of-memory:");
        oom_text(&mut out, f, false);
    }
    for f in r
        .findings
        .iter()
        .filter(|f| is_detected(f) && f.kind != "growth")
        .take(5)
    {
        detected_text(&mut out, f, 3);
    }
    for f in r
        .findings
        .iter()
        .filter(|f| f.kind == "live_at_exit")
        .take(3)
    {
        let _ = writeln!(
            out,
            "  live at exit: {} in {} ({}), {}, pid {}",
            fmt_bytes(f.bytes),
            f.count,
            f.api,
            device_name(f.device),
            f.pid
        );
        stack_text(&mut out, &f.stack[..f.stack.len().min(3)], "      ");
    }
    out
}
