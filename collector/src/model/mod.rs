//! The model: what the collector knows about one traced process: its live allocations, VMM
//! handles and mappings, call sites, and per-device totals. Fed one frame at a time, in
//! stream order.
//!
//! The bottom layer: it imports nothing else of the crate, so accounting can be read, tested
//! and replayed (`oomtrace export`) without the detectors. What the analysis needs to know
//! (an allocation, a free, a step, a failure) is told to an [`Observer`] passed to
//! [`Process::apply`]; the model neither owns nor knows who listens.
//!
//! - [`trace`]: replays a trace file into processes, each beside its observer.
//! - [`history`]: shows each event of such a replay to a visitor (exporters).
//!
//! Memory is O(live allocations + sites + modules), never O(events): events only update
//! counters and the live tables.
//!
//! Accounting rules:
//! - Plain allocations are keyed by pointer (unique per process under unified addressing).
//! - Tensors inside PyTorch's caching allocator (`MemoryClass::Tensor`, from oomtrace's trace
//!   tracker) live in their own table: the first tensor of a segment has the segment's
//!   address. Their bytes are counted apart (`tensor_bytes`), never in the device's
//!   `live_bytes`, which the segments that hold them already fill. The allocator's own
//!   segment events (`Segment`, `SegmentFree`) give its reserve (`torch_reserved_bytes`).
//! - VMM physical memory (`cuMemCreate`) is live while the handle has references (create and
//!   retain add one, release removes one) *or* is mapped: PyTorch and NCCL release while
//!   mapped. Handle values are reused by the driver, so a freed handle is forgotten at once.
//! - A free of an unknown pointer is counted as unmatched, never guessed at.
//!
//! Where each part is:
//! - `process.rs`: the process as a whole: made from its Hello, how its stream ended, what it
//!   made against what arrived; the records of its live tables.
//! - `sites.rs`: call-site identity (docs/sites.md): which stacks are one site.
//! - `frames.rs`: a site's frames, as kept and as the symbolizer reads them (`Stacks`).
//! - `device.rs`: per-device totals and peaks, per-(site, device) aggregates, and who holds
//!   a device's memory.
//! - `device_map.rs`: `DeviceMap`, what is kept per device ordinal, found without a tree walk.
//! - `apply/`: a stream applied, frame by frame and event by event, one file per event family.
//! - `observer.rs`: the one way out; `error.rs`.

use std::collections::BTreeMap;

use oomtrace_proto::launch::Launch;
use oomtrace_proto::python::CodeDef;
use oomtrace_proto::wire::{GoodbyeReason, Hello, Lost};
use oomtrace_proto::Api;
use rustc_hash::FxHashMap;

mod apply;
mod device;
mod device_map;
mod error;
mod frames;
pub mod history;
mod observer;
mod process;
mod sites;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod tests;
pub mod trace;

pub use apply::OUT_OF_MEMORY;
pub use device::{
    size_bucket, AllocFailures, DeviceState, SiteStats, Tally, HOST_DEVICE, PEAK_SITES,
};
pub use device_map::DeviceMap;
pub use error::Error;
pub use frames::{FrameInfo, Module, RawFrame, Stacks};
pub use observer::{Alloc, Free, MemInfo, Observer, OutOfMemory, TorchMemory};
pub use process::{EndState, LiveAlloc, Mapping, PhysHandle};
pub use sites::{
    is_interpreter_module, is_library_file, is_oomtrace_python_file, library_name, SiteId,
};

use sites::StackSites;

/// One traced process as the collector knows it: the model. Its parts are kept in the files
/// named above; the fields are here so that each part reads the tables it needs.
#[derive(Debug)]
pub struct Process {
    pub conn: u32,
    pub hello: Hello,
    /// Its rank in a distributed job, from the launcher's variables in `hello`.
    pub launch: Launch,
    pub end: EndState,
    pub devices: DeviceMap<DeviceState>,
    pub live: FxHashMap<u64, LiveAlloc>,
    /// Live tensors of PyTorch's caching allocator, by address (see the module doc).
    pub tensors: FxHashMap<u64, LiveAlloc>,
    pub handles: FxHashMap<u64, PhysHandle>,
    /// Mappings by VA start, ordered for range unmaps.
    pub mappings: BTreeMap<u64, Mapping>,
    pub reservations: FxHashMap<u64, (u64, i16)>,
    pub modules: Vec<Module>,
    /// Python code objects by the shim's code id (frames in `sites` refer to them).
    pub codes: FxHashMap<u32, CodeDef>,
    /// Native frames their producer named (a PyTorch snapshot's C++ frames), by address:
    /// (module path, function).
    pub named_frames: FxHashMap<u64, (String, String)>,
    module_index: FxHashMap<u32, usize>,
    /// Shim stack id -> site (the shim may send one stack under several ids).
    stack_sites: StackSites,
    /// A stack's identity (`site_key`: its frames less the interpreter's own) -> site.
    site_index: FxHashMap<Vec<RawFrame>, SiteId>,
    /// Frames of each site as first seen, interpreter frames included (the symbolizer places
    /// Python frames by them); index = SiteId (0 is the empty "no stack" site).
    pub sites: Vec<Vec<RawFrame>>,
    /// Per module (index as `modules`): whether it is the Python interpreter itself.
    interpreter_modules: Vec<bool>,
    /// Stacks the shim sent that joined a site whose first stack differs from theirs (inside
    /// the interpreter, or in the instruction of a Python line): sites that `site_key` kept
    /// from splitting.
    pub merged_stacks: u64,
    pub site_stats: FxHashMap<(SiteId, i16), SiteStats>,
    /// The sites of `site_stats` by device, in the order they first allocated there: what a
    /// per-device question reads, so that it costs that device's sites, not every site of
    /// every device.
    device_sites: FxHashMap<i16, Vec<SiteId>>,
    pub lost: Lost,
    pub events: u64,
    pub unmatched_frees: u64,
    pub failed_frees: u64,
    /// Failed allocations by (API, error code, device): the error is what tells a user "no
    /// driver" from "out of memory", so each kind is counted apart.
    pub alloc_failures: BTreeMap<(Api, i32, i16), AllocFailures>,
    pub unknown_stacks: u64,
    /// Events left out of the accounting because they name a device no process can have
    /// (`oomtrace_proto::MAX_DEVICES`), and the first such device: garbage, never a table
    /// entry or a loop.
    pub implausible_device_events: u64,
    pub implausible_device_first: i16,
    pub markers: u64,
    pub last_marker: Option<String>,
    /// When the current step began (the last marker; 0 before the first).
    pub step_start_ts_ns: u64,
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    pub last_seq: u64,
    pub cuda_initialized: bool,
    /// Step markers received as Marker frames (those inside Events frames count in `events`).
    pub marker_frames: u64,
    /// Events and markers the process made, delivered or not (its last `Made` frame); None
    /// from shims (or traces) that do not say.
    pub made: Option<u64>,
    /// How it began its end of stream, if its last `Made` frame says.
    pub ending: Option<GoodbyeReason>,
    /// PyTorch's own statistics, the last reading of each device (`TorchMemory` frames, sent
    /// by the Python step hook after each step marker).
    pub torch_memory: BTreeMap<i16, TorchMemory>,
    /// Readings that named a device no process can have (left out, like such events).
    pub implausible_torch_memory: u64,
}
