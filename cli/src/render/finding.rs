//! A finding as text: the OOM, a detector's finding (its trend, levers, remedies), what
//! a live call site holds.

use super::*;

/// " (rank N)" for a finding of a ranked process, "" otherwise.
pub(super) fn rank_text(f: &Finding) -> String {
    f.rank.map_or_else(String::new, |r| format!(" (rank {r})"))
}

pub(super) fn oom_text(
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
pub(super) fn headline(out: &mut String, head: &str, message: &str) {
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
pub(super) fn finite_or(x: f64, otherwise: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        otherwise
    }
}

/// A detector's finding: what, the rate, the likely cause, where.
pub(super) fn detected_text(out: &mut String, f: &Finding, frames: usize, opts: &TextOptions) {
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

pub(super) fn is_detected(f: &Finding) -> bool {
    f.kind.detected()
}

/// "40 tensors", "1 (cuMemAlloc_v2, outside PyTorch's allocator)", "6 (cudaMalloc)": how
/// many allocations a live call site holds, and what they are.
pub(super) fn held_text(f: &Finding) -> String {
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
