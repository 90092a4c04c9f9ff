//! Advice more than one finding gives word for word (and the report repeats), kept in one
//! place so that it reads the same everywhere. This file names no detector.

/// How to see tensors instead of segments, said wherever a finding is about PyTorch's cache
/// (a macro so that the detectors' hints can `concat!` it).
macro_rules! trace_tensors {
    () => {
        "`oomtrace run` traces each tensor by default on PyTorch 2.4 to 2.15 (not with \
         `--segments`; `--torch=swap` on other releases) and names the line that keeps it; \
         torch.cuda.memory._record_memory_history() also names the tensors."
    };
}
pub(crate) use trace_tensors;

/// The same advice as a constant, for whoever does not `concat!` it.
pub const TRACE_TENSORS: &str = trace_tensors!();

/// A call site's growth whose memory was all freed while the program still ran its steps (the
/// leak and site-growth detectors say it alike).
pub const DRAINED_HINT: &str = "All the memory allocated here was freed while the program \
    still ran its steps: it piled up for a while (a queue or backlog, results kept for a phase, \
    a pool trimmed at the end of an epoch) and was given back, not a leak. If the peak it \
    reached is too high, free it sooner.";
