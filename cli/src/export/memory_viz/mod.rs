//! A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`'s format) of one process,
//! as a protocol-4 pickle that pytorch.org/memory_viz opens in all three classic views
//! (PyTorch's `torch/cuda/_memory_viz.py` and the viewer read it).
//!
//! Mapping (decisions where the format leaves a choice):
//! - A driver-level allocation (cudaMalloc, cuMemAlloc, pools, managed memory) is a segment
//!   and one block of the same address and size: `segment_alloc` + `alloc`; its free is
//!   `free_requested` + `free_completed` + `segment_free`. So non-PyTorch memory shows in the
//!   Active Memory Timeline too.
//! - A VMM mapping (`cuMemMap` of a `cuMemCreate` handle) is `segment_map` + `alloc` of the
//!   mapped range (block frames: the handle's `cuMemCreate` site), its unmap
//!   `free_requested` + `free_completed` + `segment_unmap`, as PyTorch's expandable segments
//!   do. Physical memory that is not mapped has no address and is not shown; the Cached
//!   Segment Timeline ignores `segment_map` (the viewer's choice).
//! - Tensor-level events (`oomtrace_malloc`/`oomtrace_free`, and the trace tracker's
//!   `oomtrace_torch_alloc`/`oomtrace_torch_free`) are blocks: `alloc` /
//!   `free_requested` + `free_completed`. A driver segment that ever holds a tensor block
//!   loses its whole-segment block (in the trace and in `segments`): the tensors are its blocks,
//!   as with PyTorch's caching allocator. A tensor block inside no traced segment gets a
//!   synthetic segment of its own size (`segment_alloc`/`segment_free` around it). A block may
//!   span adjacent mappings of one stream (the viewer merges those into one segment).
//! - `oom` for each out-of-memory failure on a device: `size` = requested bytes,
//!   `device_free` = the driver's free memory read right after the failure (else the last
//!   reading), `addr` = 0.
//! - `segments` is the state at the end of the trace: every live segment (adjacent live
//!   mappings of one stream merged into one, `is_expandable`), blocks tiling it in address
//!   order with `inactive` fillers.
//! - `device_traces[d]` for every ordinal from 0 to the highest device seen. `time_us`:
//!   the process's start time (Unix) plus the monotonic time since its first event.
//!   `stream`: the CUDA stream as int64 (0 for non-stream-ordered APIs); every entry about an
//!   allocation carries the stream it was allocated on. Frames: `{filename, line, name}`,
//!   innermost first (PyTorch's order); a free's frames are its allocation's.
//! - `allocator_settings`: the keys PyTorch 2.15 writes (the viewer's Allocator Settings
//!   tab). The trace does not record the caching allocator's configuration: PyTorch's
//!   defaults, except `expandable_segments` (true when the process mapped VMM memory), and
//!   `PYTORCH_CUDA_ALLOC_CONF` says it is unknown. `external_annotations`, `host_segments`,
//!   `host_traces`: empty lists, as in PyTorch's snapshots without profiler annotations.
//! - Left out: pinned host memory (not device memory), allocations of 0 bytes, frees of
//!   addresses the trace never saw allocated, step markers.
//! - `device_traces[d]` keeps the most recent `max_entries` entries of each device (`export
//!   --max-entries`, default [`DEFAULT_MAX_ENTRIES`]; 0 keeps all), like PyTorch's
//!   `_record_memory_history(max_entries=...)` ring buffer; the viewer draws blocks freed in
//!   the window but allocated before it as allocated from the start, as for PyTorch's own
//!   snapshots. When entries were left out, the snapshot has an extra key the viewer ignores,
//!   `oomtrace`: `{"max_entries": N, "dropped_entries": [per device], "note": "..."}`.
//!
//! Memory: the live segments and blocks (they are the snapshot) and at most `max_entries`
//! entries per device, never anything per event: entries of a whole-segment block whose
//! segment later holds tensors are hidden in place (found by their index in the ring), and
//! the final `segments` are written one at a time.
//!
//! Parts: `model` rebuilds the caching allocator's view (segments, blocks, trace entries)
//! from our events and knows nothing of pickles; `writer` turns a finished model into the
//! snapshot dict, symbolizing frames as it writes; this file replays the trace into the
//! model and hands it to the writer.

mod model;
mod writer;

use std::io::Write;
use std::path::Path;

use super::view::{self, ProcessView, Seen, Site};
use crate::progress::Progress;
use crate::Failure;
use model::Model;

/// Entries kept per device unless `--max-entries` says otherwise: enough for many steps of a
/// training loop, and a pickle of some tens of MB that the viewer opens in seconds.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// What [`write()`] left out.
pub struct Written {
    /// Entries that fell out of the per-device ring (all devices).
    pub dropped_entries: u64,
}

/// What the model asks of the process, answered from its state before each event.
impl model::Context for ProcessView<'_> {
    fn last_free(&self, device: i16) -> Option<u64> {
        self.device(device).and_then(|d| d.last_free)
    }

    fn handle(&self, handle: u64) -> Option<(i16, Site)> {
        ProcessView::handle(*self, handle).map(|h| (h.device, h.site))
    }
}

/// Writes the snapshot of the process on connection `conn` of the trace file at `path`,
/// keeping the most recent `max_entries` entries per device (0: all).
pub fn write(
    path: &Path,
    conn: u32,
    max_entries: usize,
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<Written, Failure> {
    let mut model = Model::new(max_entries);
    let mut anchor: Option<u64> = None;
    let trace = view::replay(
        path,
        &mut |done, total| progress.update(done, total),
        |p, seen| {
            if p.conn() != conn {
                return;
            }
            if let Seen::Event { event, site } = seen {
                anchor.get_or_insert(event.ts_ns);
                model.on_event(&p, event, site);
            }
        },
    )?;
    progress.end_pass();
    let process = trace.by_conn(conn)?;
    let clock = writer::Clock {
        anchor_ns: anchor.unwrap_or(0),
        start_unix_ns: process.start_unix_ns(),
    };
    writer::write(&model, process, clock, out)?;
    Ok(Written {
        dropped_entries: model.dropped_entries(),
    })
}
