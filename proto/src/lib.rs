//! oomtrace-proto: the bytes that cross the shim -> collector socket and land in `.oomt` files.
//!
//! - [`event`]: the fixed 64-byte [`Event`] and its pinned enums.
//! - [`counter_page`]: the page of shared memory in which the shim counts the events it made,
//!   handed to the collector so that what a cut stream lost is still counted.
//! - [`cuda_error`]: names of the CUDA error codes an allocation fails with.
//! - [`launch`]: a process's rank in a distributed job, from its launcher's variables.
//! - [`wire`]: length-framed records on the socket (`Hello`, `Events`, `StackDef`, ...).
//! - [`python`]: Python frames inside stacks and the code objects they name.
//! - [`trace_file`]: the `.oomt` file, which stores each connection's frames in checked,
//!   optionally compressed chunks and tolerates a truncated tail.
//! - [`host`]: not the format but what every part must do alike on the host (the cache and
//!   its Python files, starting a collector, private and socket directories, the peer of a
//!   socket, the words for a refused path).
//!
//! Decoders never panic on any input: garbage is an [`Error`].

pub mod counter_page;
pub mod cuda_error;
pub mod event;
pub mod host;
pub mod launch;
pub mod python;
pub mod trace_file;
pub mod wire;

pub use event::{
    plausible_device, Api, Event, EventKind, MemoryClass, ModuleId, StackId, DEVICE_UNKNOWN,
    EVENT_SIZE, MAX_DEVICES,
};

/// What can be wrong with bytes that claim to be oomtrace data. One sentence per variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The bytes do not start with the oomtrace magic.
    BadMagic,
    /// Written by a newer or older oomtrace whose format this build cannot read: it reads
    /// versions `oldest..=supported`.
    UnsupportedVersion {
        found: u16,
        oldest: u16,
        supported: u16,
    },
    /// A frame claims a length no writer produces.
    FrameTooLarge { len: u64, max: u64 },
    /// The data ends before a header or frame is complete.
    Truncated,
    /// A field is inconsistent with its frame.
    Malformed(&'static str),
    /// A trace-file record at `offset` is damaged.
    Corrupt { offset: u64, what: String },
    /// Reading failed.
    Io(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::BadMagic => write!(f, "not an oomtrace trace (bad magic)"),
            Error::UnsupportedVersion {
                found,
                oldest,
                supported,
            } if oldest < supported => write!(
                f,
                "format version {found} is not supported (this oomtrace reads versions {oldest} to {supported})"
            ),
            Error::UnsupportedVersion {
                found, supported, ..
            } => write!(
                f,
                "format version {found} is not supported (this oomtrace reads version {supported})"
            ),
            Error::FrameTooLarge { len, max } => {
                write!(f, "frame length {len} is out of range (max {max})")
            }
            Error::Truncated => write!(f, "data ends in the middle of a header or frame"),
            Error::Malformed(what) => write!(f, "malformed data: {what}"),
            Error::Corrupt { offset, what } => write!(f, "corrupt record at byte {offset}: {what}"),
            Error::Io(e) => write!(f, "read error: {e}"),
        }
    }
}

impl std::error::Error for Error {}
