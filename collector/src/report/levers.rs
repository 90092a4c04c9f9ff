//! The levers at the end of a report's out-of-memory and fragmentation findings and of its
//! anatomy section: `fit` run on the trace (docs/fit.md), with each process's own allocator
//! setting (the settings are the findings' remedies already), and the one or two levers that
//! would make the job fit, or take the most off its peak, kept per device.
//!
//! A trace with more events on PyTorch's devices than [`MAX_EVENTS`] is left to `oomtrace
//! fit`: the largest batch takes a dozen whole replays, which a report should not pay for a
//! huge trace (the report says so in one line).

use std::path::Path;

use crate::analysis::refusal::Lever;
use crate::analysis::Kind;
use crate::fit::{self, DeviceFit, LeverFit, LeverKind, Options};

use super::symbolize::StackSymbolizer;
use super::Report;

/// The most events on devices with PyTorch's tensors (every process) a report replays for its
/// levers.
pub const MAX_EVENTS: u64 = 1_000_000;
/// A checkpointing lever is shown when it takes at least this share off the peak reserve.
const WORTH: f64 = 0.05;

/// Fills in the levers of `report` (built from the trace at `path`, its stacks read with
/// `sym`) and its `fit` object. Returns a sentence when they are not predicted for a reason a
/// reader should know.
pub fn attach(report: &mut Report, path: &Path, sym: &mut StackSymbolizer) -> Option<String> {
    let events: u64 = report
        .processes
        .iter()
        .flat_map(|p| &p.devices)
        .filter(|d| d.anatomy.is_some())
        .map(|d| d.events)
        .sum();
    if events == 0 {
        return None;
    }
    if events > MAX_EVENTS {
        return Some(format!(
            "the levers that would make the job fit are not predicted for a report of a trace \
             of {events} events on PyTorch's devices (more than {MAX_EVENTS}): `oomtrace fit` predicts them"
        ));
    }
    let opts = Options {
        brief: true,
        ..Options::default()
    };
    let fit = match super::fit::fit_with(path, &opts, sym) {
        Ok(f) => f,
        Err(fit::Error::NoTensors(_) | fit::Error::NoSteps(_)) => return None,
        Err(e) => return Some(format!("the levers could not be predicted: {e}")),
    };
    let device_fit = |pid: u32, device: i16| {
        fit.processes
            .iter()
            .filter(|p| p.pid == pid)
            .flat_map(|p| &p.devices)
            .find(|d| d.device == device)
    };
    for p in &mut report.processes {
        for d in &mut p.devices {
            if let Some(df) = device_fit(p.pid, d.device) {
                d.levers = chosen(df, false);
            }
        }
    }
    for f in &mut report.findings {
        if matches!(f.kind, Kind::Oom | Kind::Fragmentation) {
            if let Some(df) = device_fit(f.pid, f.device) {
                f.levers = chosen(df, f.kind == Kind::Oom);
            }
        }
    }
    report.fit = Some(fit);
    None
}

/// The one or two levers for a device: the checkpointing that takes the most off the peak
/// (when it takes at least [`WORTH`]) and the largest batch that fits; after an out-of-memory,
/// only what fits, checkpointing first (it keeps the batch).
fn chosen(d: &DeviceFit, oom: bool) -> Vec<Lever> {
    let base = d.replayed_peak_reserved_bytes as f64;
    let checkpoint = d
        .levers
        .iter()
        .filter(|l| l.kind == LeverKind::Checkpoint)
        .filter(|l| (l.peak_reserved_bytes as f64) <= base * (1.0 - WORTH))
        .filter(|l| !oom || l.fits == Some(true))
        .min_by_key(|l| l.peak_reserved_bytes);
    let largest = d
        .levers
        .iter()
        .find(|l| l.kind == LeverKind::LargestBatch && l.fits == Some(true));
    let order = if oom {
        [checkpoint, largest]
    } else {
        [largest, checkpoint]
    };
    order.into_iter().flatten().map(|l| lever(l, d)).collect()
}

fn lever(l: &LeverFit, d: &DeviceFit) -> Lever {
    Lever {
        kind: l.kind.name(),
        name: match l.kind {
            // After an out-of-memory in its first steps, the rest of the step is not in the
            // trace: a batch that fits what was traced is the most that could.
            LeverKind::LargestBatch if l.lower_bound => format!(
                "batch x{:.2} at most (the largest that fits what the trace holds)",
                l.batch_factor
            ),
            LeverKind::LargestBatch => {
                format!("batch x{:.2} (the largest that fits)", l.batch_factor)
            }
            _ => l.name.clone(),
        },
        peak_reserved_bytes: l.peak_reserved_bytes,
        fits: l.fits,
        capacity_bytes: d.capacity_bytes,
        lower_bound: l.lower_bound,
    }
}
