//! The one way out of the model: what happened, as typed observations, told to whoever
//! listens (the analysis, or nobody). Each call also gets the process as it stands, read-only.

use oomtrace_proto::wire::Frame;
use oomtrace_proto::Api;

use super::{Process, SiteId};

/// An allocation, told *before* it counts in the process's totals (an epoch that ends with it
/// ends before it).
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
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
}

/// The driver's free and total memory of a device, as thread `tid` read it.
#[derive(Clone, Copy, Debug)]
pub struct MemInfo {
    pub device: i16,
    pub tid: u32,
    pub free: u64,
    pub total: u64,
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
