//! What can go wrong reading or serving traces.

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
    /// A file that starts as a pickle and is not a PyTorch memory snapshot this reader takes.
    BadSnapshot { path: PathBuf, source: String },
    /// A window asked for (`report --since-mark LABEL`) whose step marker no process made.
    NoMark { path: PathBuf, label: String },
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
            Error::BadSnapshot { path, source } => write!(f, "{}: {source}", path.display()),
            Error::NoMark { path, label } => write!(
                f,
                "{}: no step marker labelled '{label}' (--since-mark names the label of a marker \
                 the program made: oomtrace.trace() labels its blocks oomtrace.trace:PID:N)",
                path.display()
            ),
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
