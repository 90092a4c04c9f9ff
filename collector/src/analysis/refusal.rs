//! What the OOM and fragmentation detectors both speak of: an allocation the driver refused
//! (with the state at that instant, and its retry) and a `PYTORCH_CUDA_ALLOC_CONF` remedy. A
//! file of its own so that neither detector names the other (`tests/layers.rs`).

use serde::Serialize;

use crate::model::SiteId;
use oomtrace_proto::Api;

/// An allocation the driver refused, with the state at that instant.
#[derive(Clone, Debug)]
pub struct OomRecord {
    pub seq: u64,
    pub ts_ns: u64,
    pub epoch: u32,
    pub api: Api,
    pub result: i32,
    pub device: i16,
    pub size: u64,
    pub site: SiteId,
    pub tid: u32,
    /// What the driver reported right after the failure.
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Tracked live bytes on the device at the failure.
    pub live_bytes: u64,
    /// PyTorch's reserve and its tensors at the failure (tensors traced only): the allocator
    /// had already given back what it could, so reserve minus tensors is memory it held in
    /// pieces too small for the request.
    pub torch_reserved_bytes: Option<u64>,
    pub tensor_bytes: Option<u64>,
    /// What PyTorch's allocator was allowed to reserve, as its out-of-memory observer said (the
    /// `set_per_process_memory_fraction` cap, or the device's total; see [`OomRecord::cap`]).
    pub allowed_bytes: Option<u64>,
    /// The device's total memory as the driver last reported it before the failure (the
    /// reading right after it, `total_bytes`, comes later: the live line cannot wait).
    pub capacity_bytes: Option<u64>,
    /// The largest holders on that device at the failure: (site, live bytes, live count).
    pub top_sites: Vec<(SiteId, u64, u64)>,
    /// Set when a free-then-retry of the same size succeeded.
    pub recovered: Option<Retry>,
}

/// A failed allocation followed by frees and a successful allocation of the same size.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    pub device: i16,
    pub size: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    pub after_ns: u64,
}

/// A `PYTORCH_CUDA_ALLOC_CONF` setting that may help, and (filled in by the report from a
/// replay of the trace through a model of PyTorch's allocator) what it would do.
#[derive(Clone, Debug, Serialize)]
pub struct Remedy {
    /// The setting as it would be written in `PYTORCH_CUDA_ALLOC_CONF`.
    pub alloc_conf: String,
    /// Why it may help, one sentence.
    pub why: String,
    /// The predicted peak reserve with it (None: not predicted, e.g. no tensors traced).
    pub predicted_peak_reserved_bytes: Option<u64>,
    /// The recorded run's peak reserve as the same replay reproduces it (the baseline).
    pub baseline_peak_reserved_bytes: Option<u64>,
    /// For an out-of-memory: whether the failed request would have fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_avoided: Option<bool>,
}

/// A lever a user pulls to make a job fit (a batch, checkpointing a module, a setting), with
/// what a replay of the trace predicts (filled in by the report from `fit`: docs/fit.md).
#[derive(Clone, Debug, Serialize)]
pub struct Lever {
    /// `batch`, `largest_batch`, `checkpoint`, `checkpoint_largest_batch`, or `setting`.
    pub kind: &'static str,
    /// As the text says it (`largest batch that fits: x0.62`, `checkpoint Block at
    /// model.py:30`, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`).
    pub name: String,
    /// `torch.cuda.max_memory_reserved()` with it.
    pub peak_reserved_bytes: u64,
    /// It fits the device (null: its size unknown).
    pub fits: Option<bool>,
    /// The device's size it was judged against.
    pub capacity_bytes: Option<u64>,
    /// The peak is at least this (the run ended in the step that ran out of memory).
    pub lower_bound: bool,
}
