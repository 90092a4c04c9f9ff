//! The one way out of the model: what happened, as typed observations, told to whoever
//! listens (the analysis, or nobody). Each call also gets the process as it stands, read-only.

use oomtrace_proto::wire::Frame;
use oomtrace_proto::Api;

use super::{Process, SiteId};

/// An allocation, told *before* it counts in the process's totals (an epoch that ends with it
/// ends before it).
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    /// Its address (a VMM handle for `cuMemCreate`): with `device` and its kind, what tells
    /// one live allocation from another.
    pub ptr: u64,
    pub device: i16,
    pub site: SiteId,
    pub size: u64,
    pub api: Api,
    pub ts_ns: u64,
    /// The thread that allocated (the epoch clock follows each thread's own loop).
    pub tid: u32,
    /// Tracked live bytes on the device before it.
    pub device_live_before: u64,
    /// The device's capacity as last reported by the driver.
    pub capacity: Option<u64>,
}

/// A live allocation gone (freed, released, or its address reused), told after the totals
/// dropped it.
#[derive(Clone, Copy, Debug)]
pub struct Free {
    /// As [`Alloc::ptr`].
    pub ptr: u64,
    pub device: i16,
    pub site: SiteId,
    pub size: u64,
    pub api: Api,
    pub ts_ns: u64,
    /// What [`Observer::alloc`] returned when it was born.
    pub birth: u32,
    /// Tracked live bytes on the device after it.
    pub device_live: u64,
    pub capacity: Option<u64>,
    /// It was PyTorch's allocator's reserve when it went (see [`Observer::reserve`]).
    pub reserve: bool,
}

/// An allocation the driver refused with out-of-memory.
#[derive(Clone, Copy, Debug)]
pub struct OutOfMemory {
    pub seq: u64,
    pub ts_ns: u64,
    pub api: Api,
    pub result: i32,
    pub device: i16,
    pub size: u64,
    pub site: SiteId,
    pub tid: u32,
    /// Tracked live bytes on the device at the failure.
    pub live_bytes: u64,
    /// For PyTorch's out-of-memory error: what its allocator was allowed to reserve, as its
    /// out-of-memory observer said (the `set_per_process_memory_fraction` cap, or the device's
    /// total); None when not said.
    pub allowed_bytes: Option<u64>,
}

/// The driver's free and total memory of a device, as thread `tid` read it.
#[derive(Clone, Copy, Debug)]
pub struct MemInfo {
    pub device: i16,
    pub tid: u32,
    pub free: u64,
    pub total: u64,
}

/// PyTorch's own statistics of one device, as the program read them right after a step marker
/// (the `oomtrace` Python package's step hook: `torch.cuda.memory_allocated(device)`,
/// `max_memory_allocated(device)`, `memory_reserved(device)`). Known in every mode, also when
/// tensors are not traced (`--segments`, a PyTorch the tracker cannot attach to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TorchMemory {
    pub device: i16,
    /// When it was read (the events' clock), just after the marker.
    pub ts_ns: u64,
    /// Step markers counted before it (the marker it follows included).
    pub step: u64,
    /// Bytes of live tensors.
    pub allocated: u64,
    /// The most bytes of live tensors since the program started, or since it last reset
    /// PyTorch's peak statistics (oomtrace never does).
    pub max_allocated: u64,
    /// Bytes of segments PyTorch's caching allocator holds (its reserve).
    pub reserved: u64,
}

/// What listens to a process's model. Every method has a do-nothing default; `()` listens to
/// nothing (accounting only, as `oomtrace export` replays).
pub trait Observer {
    /// An allocation is born. The returned stamp is kept with it and handed back in
    /// [`Free::birth`] (the analysis stamps its epoch).
    fn alloc(&mut self, _p: &Process, _a: &Alloc) -> u32 {
        0
    }
    fn free(&mut self, _p: &Process, _f: &Free) {}
    /// A live allocation, told at its birth, turned out to be a segment of PyTorch's caching
    /// allocator (reserve): it stays live, but no line of code holds it.
    fn reserve(&mut self, _p: &Process, _f: &Free) {}
    /// A step marker (`oomtrace_mark`), after it was counted.
    fn step(&mut self, _p: &Process, _ts_ns: u64) {}
    fn out_of_memory(&mut self, _p: &Process, _o: &OutOfMemory) {}
    fn mem_info(&mut self, _p: &Process, _m: &MemInfo) {}
    /// PyTorch's own statistics of one device, told after the step marker they follow (and
    /// after [`Process::torch_memory`] took them).
    fn torch_memory(&mut self, _p: &Process, _m: &TorchMemory) {}

    /// Applies one frame to `p`, telling this observer. An observer that must survive its
    /// own bugs (the analysis) wraps this.
    fn apply_frame(&mut self, p: &mut Process, frame: &Frame<'_>)
    where
        Self: Sized,
    {
        p.apply(frame, self);
    }
}

impl Observer for () {}
