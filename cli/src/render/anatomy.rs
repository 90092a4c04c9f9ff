//! "What the memory is": a device's bytes at its peak (or an out-of-memory) split into the
//! tensors' roles, the cache's reserve gap and the memory outside PyTorch
//! (`report::AnatomyMoment`, docs/anatomy.md).

use std::fmt::Write;

use oomtrace_collector::report::{AnatomyMoment, DeviceReport, ProcessReport};
use oomtrace_collector::units::{device_name, fmt_bytes, fmt_duration};

/// Activation lines named in text.
const LINES: usize = 3;

/// The anatomy at each device's peak, one block per device that has one.
pub(super) fn section(out: &mut String, processes: &[ProcessReport]) {
    let with: Vec<(&ProcessReport, &DeviceReport, &AnatomyMoment)> = processes
        .iter()
        .flat_map(|p| p.devices.iter().map(move |d| (p, d)))
        .filter_map(|(p, d)| Some((p, d, d.anatomy.as_ref()?.at_peak.as_ref()?)))
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nWhat the memory is, at the peak");
    for (p, d, m) in with {
        let _ = writeln!(
            out,
            "  pid {} {}: {} at step {}, {} into the run",
            p.pid,
            device_name(d.device),
            fmt_bytes(m.device_bytes),
            m.step,
            fmt_duration(m.at_s)
        );
        moment(out, m, "    ");
        super::levers_text(out, &d.levers, "    ", "to hold more");
    }
}

/// One moment's parts, a line each, the largest activations and libraries named.
pub(super) fn moment(out: &mut String, m: &AnatomyMoment, indent: &str) {
    let share = |b: u64| {
        if m.device_bytes == 0 {
            0.0
        } else {
            b as f64 * 100.0 / m.device_bytes as f64
        }
    };
    let mut row = |what: &str, bytes: u64, more: String| {
        let _ = writeln!(
            out,
            "{indent}{what:<38} {:>11} {:>5.1} %{more}",
            fmt_bytes(bytes),
            share(bytes)
        );
    };
    for (what, bytes) in m.roles.parts() {
        if bytes == 0 {
            continue;
        }
        let more = if what == "activations" && !m.activations.is_empty() {
            // Lines that hold a visible share (a scalar's 4 B beside megabytes is noise).
            let lines: Vec<String> = m
                .activations
                .iter()
                .filter(|l| l.bytes.saturating_mul(100) >= bytes)
                .take(LINES)
                .map(|l| {
                    let file = l.file.rsplit('/').next().unwrap_or(&l.file);
                    if l.line > 0 {
                        format!("{file}:{} {}", l.line, fmt_bytes(l.bytes))
                    } else {
                        format!("{} {}", l.function, fmt_bytes(l.bytes))
                    }
                })
                .collect();
            format!("   made at {}", lines.join(", "))
        } else {
            String::new()
        };
        row(&format!("PyTorch's tensors: {what}"), bytes, more);
    }
    if m.reserve_gap_bytes > 0 {
        row(
            "PyTorch's cache, not in tensors",
            m.reserve_gap_bytes,
            String::new(),
        );
    }
    if m.outside_pytorch_bytes > 0 {
        let libs: Vec<String> = m
            .outside_pytorch
            .iter()
            .take(LINES)
            .map(|l| format!("{} {}", l.library, fmt_bytes(l.bytes)))
            .collect();
        row(
            "outside PyTorch's allocator",
            m.outside_pytorch_bytes,
            if libs.is_empty() {
                String::new()
            } else {
                format!("   {}", libs.join(", "))
            },
        );
    }
}
