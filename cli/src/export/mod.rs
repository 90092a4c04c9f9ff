//! `oomtrace export`: a trace's event history in other tools' formats, one file per format.
//!
//! Every exporter reads the trace through [`view`] only: a replay that shows each event with
//! its process's state just before it, a few per-process totals, and call sites symbolized by
//! [`view::Symbolizer`]. `view` is the one module here that names the collector's types, so
//! the exporters stay what they are (mappings of events to a format) while the collector
//! changes. A first, quiet replay validates the file and picks the processes before any
//! output is written, so bad input never leaves half a file behind.
//!
//! - [`memory_viz`]: a pickle (protocol 4, [`pickle`]) that pytorch.org/memory_viz opens.
//! - [`chrome`]: Chrome trace-event JSON (Perfetto, chrome://tracing): live-bytes counters
//!   per device and per top call site, OOM and step-marker instants.
//! - [`folded`]: flamegraph folded stacks weighted by bytes, one root per kind of memory, at
//!   a chosen moment ([`folded::Moment`]).
//! - [`json`]: every event as JSON lines, with symbolized sites.
//!
//! This file: the format list, which processes to export, and display helpers the formats
//! share (frame names, process names, device labels).

pub mod chrome;
pub mod folded;
pub mod json;
pub mod memory_viz;
pub mod pickle;
pub mod view;

use std::path::Path;

use crate::Failure;
use view::{Frame, ProcessView, Trace};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Pickle for pytorch.org/memory_viz (one process).
    MemoryViz,
    /// Chrome trace-event JSON for Perfetto / chrome://tracing.
    Chrome,
    /// The same trace-event JSON as chrome, its default name ending in .perfetto.json (an
    /// export in each format has a name of its own beside the trace).
    Perfetto,
    /// Flamegraph folded stacks (`frame;frame bytes`).
    Folded,
    /// Every event as JSON lines.
    Json,
}

impl Format {
    pub fn binary(self) -> bool {
        self == Format::MemoryViz
    }

    /// The format written: perfetto is chrome's JSON under another name.
    pub fn written(self) -> Format {
        match self {
            Format::Perfetto => Format::Chrome,
            f => f,
        }
    }

    /// The end of the default output's name, after the trace's name without `.oomt`.
    pub fn default_suffix(self) -> &'static str {
        match self {
            Format::MemoryViz => ".pickle",
            Format::Chrome => ".chrome.json",
            Format::Perfetto => ".perfetto.json",
            Format::Folded => ".folded",
            Format::Json => ".jsonl",
        }
    }
}

/// Whether `p` has events on a GPU (not only pinned host memory or none at all).
pub fn has_device_events(p: ProcessView<'_>) -> bool {
    p.devices().any(|(d, s)| d >= 0 && s.events > 0)
}

/// The processes to export (their connections, in the trace's order): those with `pid` when
/// given (an error if there are none), else all of them.
pub fn select(trace: &Trace, pid: Option<u32>, path: &Path) -> Result<Vec<u32>, Failure> {
    let chosen: Vec<u32> = trace
        .processes()
        .filter(|&p| has_pid(p, pid))
        .map(|p| p.conn())
        .collect();
    let Some(pid) = pid else { return Ok(chosen) };
    if chosen.is_empty() {
        return Err(Failure::new(format!(
            "no process {pid} in {} (it has: {})",
            path.display(),
            pid_list(trace)
        )));
    }
    Ok(chosen)
}

/// One process for a format that shows one (memory-viz), by its connection: the first with
/// device memory events among those [`select`] picks; says on stderr which one when there
/// was a choice.
pub fn select_one(trace: &Trace, pid: Option<u32>, path: &Path) -> Result<u32, Failure> {
    select(trace, pid, path)?; // says when there is no process `pid`
    let with_device: Vec<ProcessView<'_>> = trace
        .processes()
        .filter(|&p| has_pid(p, pid) && has_device_events(p))
        .collect();
    let Some(first) = with_device.first().copied() else {
        return Err(Failure::new(match pid {
            Some(pid) => format!(
                "process {pid} in {} has no GPU memory events",
                path.display()
            ),
            None => format!("no process in {} has GPU memory events", path.display()),
        }));
    };
    if with_device.len() > 1 && pid.is_none() {
        let pids: Vec<String> = with_device.iter().map(|p| p.pid().to_string()).collect();
        eprintln!(
            "oomtrace: exporting process {} (the first of {} with GPU memory: {}); choose \
             another with --pid",
            first.pid(),
            with_device.len(),
            pids.join(", ")
        );
    }
    Ok(first.conn())
}

/// Whether `p` is process `pid` (any process when `pid` is `None`).
fn has_pid(p: ProcessView<'_>, pid: Option<u32>) -> bool {
    pid.is_none_or(|pid| p.pid() == pid)
}

fn pid_list(trace: &Trace) -> String {
    let mut pids: Vec<String> = trace.processes().map(|p| p.pid().to_string()).collect();
    if pids.is_empty() {
        return "no processes".into();
    }
    pids.dedup();
    pids.join(", ")
}

/// An error writing the output.
pub fn write_failed(e: impl std::fmt::Display) -> Failure {
    Failure::new(format!("cannot write the output: {e}"))
}

/// A frame's name for display: the function, else `module+offset`, else the address.
pub fn frame_name(f: &Frame) -> String {
    if !f.function.is_empty() {
        f.function.clone()
    } else if !f.module.is_empty() && !f.offset.is_empty() {
        format!("{}+{}", f.module, f.offset)
    } else if !f.address.is_empty() {
        f.address.clone()
    } else {
        "??".into()
    }
}

/// A frame's file for display: the source file, else the module, else "".
pub fn frame_file(f: &Frame) -> String {
    if !f.file.is_empty() {
        f.file.clone()
    } else {
        f.module.clone()
    }
}

/// A process's short name: the executable's file name (or `argv[0]`'s).
pub fn short_name(p: ProcessView<'_>) -> String {
    let exe = if p.exe().is_empty() {
        p.argv0().unwrap_or_default().to_string()
    } else {
        p.exe().to_string()
    };
    Path::new(&exe)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or(exe)
}

/// A device's label: `cuda:N`, or `pinned host` for pinned host memory.
pub fn device_label(device: i16) -> String {
    if device < 0 {
        "pinned host".into()
    } else {
        format!("cuda:{device}")
    }
}
