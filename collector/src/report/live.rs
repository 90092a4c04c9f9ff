//! Live output: one line per new finding, upgrade, downgrade or resolution, as the detectors
//! raise them (`oomtrace run`, `oomtrace collect`; the server hands it to its console).
//! Concise on purpose: the report has the stacks and the evidence.

use super::backward::Lookup;
use super::hints::{fmt_python_lines, resolve_device_growth, torch_segments, traces_tensors};
use super::symbolize::{culprit, StackSymbolizer};
use crate::analysis::device_growth::{DeviceGrowthEvidence, Events};
use crate::analysis::fragmentation::is_tensor_level;
use crate::analysis::{together, Alert, Cause, Change, Evidence, Finding, Kind};
use crate::model::{FrameInfo, Process};
use crate::units::{fmt_bytes, fmt_rate};

/// "history_append (leak_history.c:12)", or the module and offset without symbols; in
/// PyTorch's backward pass, as every list names it: "backward of addmm at train.py:25" (the
/// report adds the node and what the forward lines allocated).
fn place(
    p: &Process,
    frames: &[FrameInfo],
    sym: &mut StackSymbolizer,
    backward: &mut Lookup,
) -> Option<String> {
    if let Some(b) = backward.backward(p, frames, &mut |s| sym.site(p, s)) {
        return Some(b.to_string());
    }
    let f = culprit(frames)?;
    let file = f.file.rsplit('/').next().unwrap_or("");
    Some(match (f.function.is_empty(), file.is_empty()) {
        (false, false) if f.line > 0 => format!("{} ({file}:{})", f.function, f.line),
        (false, _) => f.function.clone(),
        _ => format!(
            "{}+{}",
            f.module.rsplit('/').next().unwrap_or("?"),
            f.offset
        ),
    })
}

/// The largest allocation a growth finding's site made in its last step (its evidence's last
/// sample: what the site held then).
fn largest_in_last_step(f: &crate::analysis::Finding) -> u64 {
    match &f.evidence {
        Some(Evidence::Leak(e)) => e.samples.last().copied().unwrap_or(f.bytes),
        _ => f.bytes,
    }
}

/// The line for alert `a` of process `p`.
pub fn line(p: &Process, a: &Alert, sym: &mut StackSymbolizer) -> String {
    let f = &a.finding;
    // Read from the process's other sites, and only for a backward-pass site.
    let mut backward = Lookup::new();
    let working_set = f.cause == Cause::WorkingSetGrowing;
    let tag = match (a.change, f.kind) {
        (Change::Resolved, _) => "resolved".to_string(),
        (Change::Downgraded, _) if working_set => "downgraded: working set growth".to_string(),
        (Change::Downgraded, _) => "downgraded: bounded growth".to_string(),
        (_, Kind::Growth) if working_set => format!("working set growth {}", f.level.name()),
        (_, Kind::Leak) => format!("{} leak", f.level.name()),
        (_, Kind::DeviceGrowth) => format!("{} device growth", f.level.name()),
        (_, kind) => format!("{} {}", kind.name(), f.level.name()),
    };
    let mut text = format!("oomtrace: [{tag}] pid {} ", p.pid());
    if let Some(rank) = p.launch.rank {
        text.push_str(&format!("(rank {rank}) "));
    }
    if f.device >= 0 {
        text.push_str(&format!("device {}, step {}: ", f.device, a.epoch));
    } else {
        text.push_str(&format!("pinned host, step {}: ", a.epoch));
    }
    match (f.kind, f.growth_bytes_per_step, &f.evidence) {
        (Kind::Leak, Some(rate), _) => text.push_str(&format!(
            "{}, {} held",
            fmt_rate(rate, f.growth_bytes_per_s),
            fmt_bytes(f.bytes)
        )),
        (Kind::DeviceGrowth, _, Some(Evidence::DeviceGrowth(e))) => {
            // The device is already named before the colon.
            let device = format!("device {}: ", f.device);
            let message = f.message.strip_prefix(&device).unwrap_or(&f.message);
            // Leak findings that account for the growth have live lines of their own, which
            // name their lines: said in a few words, and nothing more (the report has it all).
            let explained = e.leaks_on_device.as_ref().filter(|l| l.explained);
            match (explained, message.split_once("; the ")) {
                (Some(l), Some((growth, _))) => {
                    let s = if l.leaks == 1 { "" } else { "s" };
                    text.push_str(growth);
                    text.push_str(&format!("; explained by {} leak finding{s}", l.leaks));
                }
                _ => {
                    text.push_str(message);
                    if a.change != Change::Resolved && a.change != Change::Downgraded {
                        device_growth_tail(&mut text, p, e, sym, &mut backward);
                    }
                }
            }
        }
        // The cause in a few words: the message says more than a line has room for.
        (Kind::Growth, Some(rate), _) if working_set => text.push_str(&format!(
            "the working set grows {}, freed step by step, {} at the last step",
            fmt_rate(rate, f.growth_bytes_per_s),
            fmt_bytes(largest_in_last_step(f))
        )),
        (Kind::Fragmentation, _, _) => {
            let device = format!("device {}: ", f.device);
            text.push_str(f.message.strip_prefix(&device).unwrap_or(&f.message));
        }
        _ => text.push_str(&f.message),
    }
    if f.site.0 != 0 {
        let frames = sym.site(p, f.site);
        if let Some(at) = place(p, &frames, sym, &mut backward) {
            text.push_str(" at ");
            text.push_str(&at);
        }
    }
    if f.kind == Kind::Leak {
        leak_tail(&mut text, p, f, sym);
    }
    text
}

/// What a leak's live line adds after its place: the parts kept with the output (named by
/// their lines), or how small a small steady leak is.
fn leak_tail(text: &mut String, p: &Process, f: &Finding, sym: &mut StackSymbolizer) {
    if f.parts.len() > 1 {
        let mut parts = f.parts.clone();
        for part in &mut parts {
            if let Some(c) = culprit(&sym.site(p, part.site)) {
                (part.file, part.line) = (c.file.clone(), c.line);
            }
        }
        text.push_str(&format!(
            ", each step's output with its graph: {}",
            together::parts_clause(&parts, false, false)
        ));
    } else if let Some(Evidence::Leak(e)) = &f.evidence {
        if let Some(small) = e.small {
            let unit = if f.api.is_some_and(is_tensor_level) {
                "tensor"
            } else {
                "allocation"
            };
            text.push_str(&format!("; {}", small.words(unit)));
        }
    }
}

/// What a device growth's live line adds to its message: the lines that made the device grow
/// and, for PyTorch's segments, how to see the tensors: all a user gets while the job runs.
fn device_growth_tail(
    text: &mut String,
    p: &Process,
    e: &DeviceGrowthEvidence,
    sym: &mut StackSymbolizer,
    backward: &mut Lookup,
) {
    let mut e = e.clone();
    resolve_device_growth(p.stacks(), &mut e, |site| {
        let frames = sym.site(p, site);
        backward.native_place(p, &frames, &mut |s| sym.site(p, s))
    });
    if !e.python_lines.is_empty() {
        text.push_str(&format!(
            "; {}: {}",
            e.events.grew_at(),
            fmt_python_lines(&e.python_lines, e.events.unit(), 2)
        ));
    }
    if e.events == Events::Segments && (e.tensors_traced || traces_tensors(p)) {
        // The tensors are traced: no advice to trace them, only what the segments are.
        text.push_str("; PyTorch's cache (its reserve); its tensors are traced on their own");
    } else if e.events == Events::Segments {
        // Short: the report has the whole advice (TRACE_TENSORS).
        text.push_str(match torch_segments(p.stacks(), &e.grew_at) {
            Some(true) => "; PyTorch's cache segments, not tensors: ",
            _ => "; if PyTorch, its cache segments, not tensors: ",
        });
        text.push_str("`oomtrace run` traces each tensor by default (not with --segments)");
    }
}
