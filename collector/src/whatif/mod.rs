//! What-if: a trace's tensor requests replayed through a model of PyTorch's CUDA caching
//! allocator under another setting (`PYTORCH_CUDA_ALLOC_CONF`), to tell before anyone tries it
//! on the GPU what the reserve would be and whether an OOM would still happen (docs/whatif.md).
//!
//! - [`conf`]: the setting string, parsed as torch 2.15 parses it, into [`AllocConf`];
//! - [`allocator`]: the model of one device's allocator under one setting;
//! - [`replay`]: a trace file through one model per setting and device, in one pass:
//!   [`predict`] and its [`Prediction`] (the `oomtrace whatif --json` document).
//!
//! Imports only the model layer (the trace) and units; the report may import this.

pub mod allocator;
pub mod conf;
pub mod replay;

use std::path::PathBuf;

pub use conf::{AllocConf, ConfError};
pub use replay::{
    predict, ConfSource, DevicePrediction, NewOom, OomPrediction, Past64Bits, Prediction,
    ProcessPrediction,
};

/// Why there is no prediction. One sentence per variant.
#[derive(Debug)]
pub enum Error {
    /// The trace could not be read.
    Trace(crate::model::Error),
    /// The trace has no tensor events: PyTorch's requests were not traced.
    NoTensors(PathBuf),
    /// A setting names something the model is not.
    Unmodelled(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Trace(e) => write!(f, "{e}"),
            Error::NoTensors(path) => write!(
                f,
                "{}: the trace has no tensor events, so there are no PyTorch requests to replay \
                 (it was traced with --segments, or without PyTorch's caching allocator); trace \
                 the program with `oomtrace run` (tensors are traced by default)",
                path.display()
            ),
            Error::Unmodelled(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::model::Error> for Error {
    fn from(e: crate::model::Error) -> Error {
        Error::Trace(e)
    }
}
