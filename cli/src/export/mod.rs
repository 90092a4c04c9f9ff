//! `oomtrace export`: a trace's event history in other tools' formats, one file per format.
//!
//! Every exporter replays the trace with `oomtrace_collector::model::history` (events with the
//! process state just before each) and symbolizes call sites with `StackSymbolizer` only.
//! A first, quiet replay validates the file and picks the processes before any output is
//! written, so bad input never leaves half a file behind.
//!
//! - [`memory_viz`]: a pickle (protocol 4, [`pickle`]) that pytorch.org/memory_viz opens.
//! - [`chrome`]: Chrome trace-event JSON (Perfetto, chrome://tracing): live-bytes counters.
//! - [`folded`]: flamegraph folded stacks weighted by bytes.
//! - [`json`]: every event as JSON lines, with symbolized sites.

pub mod chrome;
pub mod folded;
pub mod json;
pub mod memory_viz;
pub mod pickle;

use std::path::Path;

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::model::Process;
use oomtrace_collector::report::symbolize::FrameInfo;

use crate::Failure;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Pickle for pytorch.org/memory_viz (one process).
    MemoryViz,
    /// Chrome trace-event JSON for Perfetto / chrome://tracing.
    Chrome,
    /// Flamegraph folded stacks (`frame;frame bytes`).
    Folded,
    /// Every event as JSON lines.
    Json,
}

impl Format {
    pub fn binary(self) -> bool {
        self == Format::MemoryViz
    }
}

/// Whether `p` has events on a GPU (not only pinned host memory or none at all).
pub fn has_device_events(p: &Process) -> bool {
    p.devices.iter().any(|(&d, s)| d >= 0 && s.events > 0)
}

/// The processes to export (indices into `trace.processes`): those with `pid` when given
/// (an error if there are none), else all of them.
pub fn select(trace: &Trace, pid: Option<u32>, path: &Path) -> Result<Vec<usize>, Failure> {
    let all: Vec<usize> = (0..trace.processes.len()).collect();
    let Some(pid) = pid else { return Ok(all) };
    let chosen: Vec<usize> = all
        .into_iter()
        .filter(|&i| trace.processes[i].pid() == pid)
        .collect();
    if chosen.is_empty() {
        return Err(Failure::new(format!(
            "no process {pid} in {} (it has: {})",
            path.display(),
            pid_list(trace)
        )));
    }
    Ok(chosen)
}

/// One process for a format that shows one (memory-viz): the first with device memory
/// events among `candidates`; says on stderr which one when there was a choice.
pub fn select_one(trace: &Trace, pid: Option<u32>, path: &Path) -> Result<usize, Failure> {
    let candidates = select(trace, pid, path)?;
    let with_device: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&i| has_device_events(&trace.processes[i]))
        .collect();
    let Some(&first) = with_device.first() else {
        return Err(Failure::new(match pid {
            Some(pid) => format!(
                "process {pid} in {} has no GPU memory events",
                path.display()
            ),
            None => format!("no process in {} has GPU memory events", path.display()),
        }));
    };
    if with_device.len() > 1 && pid.is_none() {
        let pids: Vec<String> = with_device
            .iter()
            .map(|&i| trace.processes[i].pid().to_string())
            .collect();
        eprintln!(
            "oomtrace: exporting process {} (the first of {} with GPU memory: {}); choose \
             another with --pid",
            trace.processes[first].pid(),
            with_device.len(),
            pids.join(", ")
        );
    }
    Ok(first)
}

fn pid_list(trace: &Trace) -> String {
    if trace.processes.is_empty() {
        return "no processes".into();
    }
    let mut pids: Vec<String> = trace
        .processes
        .iter()
        .map(|p| p.pid().to_string())
        .collect();
    pids.dedup();
    pids.join(", ")
}

/// The process on connection `conn` of a replayed trace.
pub fn by_conn(trace: &Trace, conn: u32) -> Result<&Process, Failure> {
    trace
        .processes
        .iter()
        .find(|p| p.conn == conn)
        .ok_or_else(|| Failure::new("the trace file changed while it was exported"))
}

/// An error writing the output.
pub fn write_failed(e: impl std::fmt::Display) -> Failure {
    Failure::new(format!("cannot write the output: {e}"))
}

/// A frame's name for display: the function, else `module+offset`, else the address.
pub fn frame_name(f: &FrameInfo) -> String {
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
pub fn frame_file(f: &FrameInfo) -> String {
    if !f.file.is_empty() {
        f.file.clone()
    } else {
        f.module.clone()
    }
}

/// A process's short name: the executable's file name (or argv[0]'s).
pub fn short_name(p: &Process) -> String {
    let exe = if p.hello.exe.is_empty() {
        p.hello.argv.first().cloned().unwrap_or_default()
    } else {
        p.hello.exe.clone()
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
