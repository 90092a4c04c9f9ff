//! oomtrace-collector: the out-of-process half of oomtrace.
//!
//! - [`server`]: the collector process (`oomtrace collect`): many traced processes at once
//!   over a Unix socket, one thread each, every frame written to a `.oomt` trace file.
//! - [`state`]: what is known about one process: live allocations, VMM handles and mappings,
//!   call sites, device totals, OOMs. O(live + sites) memory, never O(events).
//! - [`trace_writer`]: the collector's trace file: regular files only, created when the
//!   first process connects, whole records, and a last word when the disk fills up.
//! - [`trace`]: replays a trace file into per-process state; [`history`] shows each event of
//!   that replay to a visitor (`oomtrace export`).
//! - [`report`]: the `--json` report contract; [`symbolize`]: addresses to lines.
//!
//! Never links CUDA. Symbolization happens here (or in the CLI), never in the traced process.

pub mod detect;
pub mod epoch;
pub mod history;
pub mod live;
pub mod report;
pub mod server;
pub mod state;
pub mod symbolize;
pub mod trace;
pub mod trace_writer;

use std::path::PathBuf;

/// What can go wrong in the collector. One sentence per variant.
#[derive(Debug)]
pub enum Error {
    /// A trace file could not be opened.
    Open { path: PathBuf, source: String },
    /// A trace file is not readable as oomtrace data.
    BadTrace {
        path: PathBuf,
        source: oomtrace_proto::Error,
    },
    /// Bytes that are not oomtrace data.
    Format(oomtrace_proto::Error),
    /// The collector socket could not be set up.
    Socket { path: PathBuf, source: String },
    /// The trace file could not be written.
    Output { path: PathBuf, source: String },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Open { path, source } => write!(f, "cannot open {}: {source}", path.display()),
            Error::BadTrace { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Format(e) => write!(f, "{e}"),
            Error::Socket { path, source } => {
                write!(f, "cannot listen on {}: {source}", path.display())
            }
            Error::Output { path, source } => {
                write!(f, "cannot write the trace {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<oomtrace_proto::Error> for Error {
    fn from(e: oomtrace_proto::Error) -> Error {
        Error::Format(e)
    }
}
