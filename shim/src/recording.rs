//! The one recording API: what every way in (the hooks' recorders in `hooks/recorders.rs`,
//! `pluggable.rs`, `torch_tracker.rs`, `torch_allocator.rs`, the C entry points in `lib.rs`)
//! calls to turn what it saw into events, and which knows none of them (as heaptrack's
//! `libheaptrack.h` and memray's `Tracker` are the one interface under their ways in).
//!
//! Each call is in oomtrace's own words: an allocation or a release through an api on a device
//! (memray's `trackAllocation(ptr, size, allocator)` shape: a tensor is an allocation through
//! PyTorch's api), a segment of PyTorch's reserve taken or given back, what the device
//! reports, a marker, launcher variables. A way in translates its own vocabulary (a hook's
//! arguments, PyTorch's trace actions) and finds the device before it calls here; this module
//! decides nothing about what an allocation is (which CUDA allocations are PyTorch's segments
//! is the PyTorch way in's to say, told by the hooks through `device_watch.rs`).
//!
//! Order rule (as heaptrack does for malloc): the caller records anything that gives memory
//! back *before* the real call, anything that hands memory out *after* it returns. Then when
//! another thread gets the same address back, its event is queued after ours, and the
//! collector never sees an allocation of an address that is still live.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use oomtrace_proto::wire::TorchMemory;
use oomtrace_proto::{Api, Event, EventKind};

use crate::driver_query;
use crate::stack;
use crate::this_thread;
use crate::transport::outbox::{self, Msg};

// Every function a hook's recorder calls is `#[inline]`: the recorders and what they call were
// one module before, and the hooks' cost must not grow with a move across codegen units.

/// Sends `ev`; the outbox stamps its thread and time. Every event waits for room while the
/// collector reads (a lost free would become a phantom leak); one that cannot go is counted
/// lost. Always inlined, and the refused allocation and a device's first sight kept out of
/// line: the compiler then inlines the whole success path into each recorder, and the event
/// reaches the outbox in registers ([`outbox::send_event`]), never built on the stack.
#[inline(always)]
fn emit(ev: Event) {
    outbox::send_event(&ev);
}

/// Devices seen so far in this process (bit per device 0..63).
static SEEN_DEVICES: AtomicU64 = AtomicU64::new(0);

/// In a fork child: its thread has a new id, and it has seen no device yet.
pub fn reset_after_fork() {
    this_thread::forget_tid();
    SEEN_DEVICES.store(0, Ordering::Relaxed);
}

/// Whether any device allocation was recorded in this process (since its start, or since the
/// fork that made it).
pub fn any_device_seen() -> bool {
    SEEN_DEVICES.load(Ordering::Relaxed) != 0
}

/// True the first time `device` is seen in this process.
fn first_sight_of_device(device: i16) -> bool {
    if !(0..64).contains(&device) {
        return false;
    }
    let bit = 1u64 << device;
    // A load first: a read-modify-write on every allocation would own the line each time.
    SEEN_DEVICES.load(Ordering::Relaxed) & bit == 0
        && SEEN_DEVICES.fetch_or(bit, Ordering::Relaxed) & bit == 0
}

/// After a device is first seen in this process, and after every failed allocation, record
/// what the device itself reports: capacity for the report, free memory for OOM forensics.
fn device_memory_info(device: i16) {
    if device < 0 {
        return;
    }
    if let Some((free, total)) = driver_query::mem_get_info() {
        let mut ev = Event::new(EventKind::MemInfo, Api::cuMemGetInfo_v2);
        ev.ptr = free;
        ev.size = total;
        ev.device = device;
        emit(ev);
    }
}

/// The first sight of `device` in this process records what the device reports.
#[inline(always)]
fn first_sight(device: i16) {
    // Seen already (every allocation but the first): one load, nothing called.
    if (0..64).contains(&device) && SEEN_DEVICES.load(Ordering::Relaxed) & (1u64 << device) != 0 {
        return;
    }
    first_sight_slow(device);
}

#[cold]
#[inline(never)]
fn first_sight_slow(device: i16) {
    if outbox::current().is_some() && first_sight_of_device(device) {
        device_memory_info(device);
    }
}

/// An allocation through `api` on `device` returned `rc` (`ptr` on success), with the
/// caller's stack. `aux` and `extra` are the api's own words (a stream, flags, what PyTorch
/// said the allocator was allowed: proto's event table says which).
#[inline]
pub fn alloc(api: Api, device: i16, rc: c_int, ptr: u64, size: u64, aux: u64, extra: u64) {
    if rc == 0 {
        // cudaMalloc(&p, 0) succeeds with p = NULL: nothing was allocated.
        if ptr == 0 {
            return;
        }
        let mut ev = Event::new(EventKind::Alloc, api);
        ev.ptr = ptr;
        ev.size = size;
        ev.aux = aux;
        ev.extra = extra;
        ev.device = device;
        ev.stack = stack::capture();
        emit(ev);
        // After the allocation's event: the driver's reading already counts it, and a reader
        // takes what the reading holds beyond the tracked allocations for the context and
        // other processes (it took the first allocation twice when the reading came first).
        first_sight(device);
    } else {
        alloc_failed(api, device, rc, size, aux, extra);
    }
}

/// [`alloc`]'s refusal, out of line: the hot path is the success.
#[cold]
#[inline(never)]
fn alloc_failed(api: Api, device: i16, rc: c_int, size: u64, aux: u64, extra: u64) {
    let mut ev = Event::new(EventKind::AllocFailed, api);
    ev.size = size;
    ev.aux = aux;
    ev.extra = extra;
    ev.device = device;
    ev.result = rc;
    ev.stack = stack::capture();
    emit(ev);
    device_memory_info(device);
}

/// Memory or address space given back through `api` (`kind`: a free, an unmap, a handle
/// released, address space released) on `device` (unknown for a bare pointer: the collector
/// has it from the allocation), before the real call.
#[inline]
pub fn release(api: Api, kind: EventKind, device: i16, ptr: u64, size: u64, aux: u64) {
    // cudaFree(NULL) is how programs initialise the runtime; nothing is freed.
    if ptr == 0 {
        return;
    }
    let mut ev = Event::new(kind, api);
    ev.ptr = ptr;
    ev.size = size;
    ev.aux = aux;
    ev.device = device;
    emit(ev);
}

/// A release whose real call failed with `rc`.
#[inline]
pub fn release_failed(api: Api, ptr: u64, rc: c_int) {
    if rc != 0 && ptr != 0 {
        let mut ev = Event::new(EventKind::FreeFailed, api);
        ev.ptr = ptr;
        ev.result = rc;
        emit(ev);
    }
}

/// Physical memory created on `device` (`handle` on success), or refused with `rc`.
#[inline]
pub fn phys_create(api: Api, device: i16, rc: c_int, handle: u64, size: u64) {
    let mut ev = if rc == 0 {
        let mut ev = Event::new(EventKind::PhysCreate, api);
        ev.ptr = handle;
        ev
    } else {
        let mut ev = Event::new(EventKind::AllocFailed, api);
        ev.result = rc;
        ev
    };
    ev.size = size;
    ev.device = device;
    ev.stack = stack::capture();
    emit(ev);
    if rc == 0 {
        // After the event, as for an allocation (`alloc`).
        first_sight(device);
    } else {
        device_memory_info(device);
    }
}

/// One more reference to `handle`, found mapped at `addr`.
#[inline]
pub fn phys_retain(api: Api, handle: u64, addr: u64) {
    let mut ev = Event::new(EventKind::PhysRetain, api);
    ev.ptr = handle;
    ev.aux = addr;
    emit(ev);
}

/// A VA range now backed by (part of) a handle.
#[inline]
pub fn mapped(api: Api, va: u64, size: u64, handle: u64, offset: u64) {
    let mut ev = Event::new(EventKind::Map, api);
    ev.ptr = va;
    ev.size = size;
    ev.aux = handle;
    ev.extra = offset;
    emit(ev);
}

/// Address space reserved at `va` on `device`: not memory, kept so that mappings can be
/// explained.
#[inline]
pub fn va_reserved(api: Api, device: i16, va: u64, size: u64, alignment: u64) {
    let mut ev = Event::new(EventKind::VaReserve, api);
    ev.ptr = va;
    ev.size = size;
    ev.extra = alignment;
    ev.device = device;
    emit(ev);
}

/// Free and total memory of `device`, as the program itself asked and saw them.
#[inline]
pub fn memory_info(api: Api, device: i16, free: u64, total: u64) {
    let mut ev = Event::new(EventKind::MemInfo, api);
    ev.ptr = free;
    ev.size = total;
    ev.device = device;
    emit(ev);
}

/// CUDA came up (or failed to, `rc` != 0).
#[inline]
pub fn init(api: Api, rc: c_int) {
    let mut ev = Event::new(EventKind::Init, api);
    ev.result = rc;
    emit(ev);
}

/// `oomtrace_mark`: a step boundary with its label and call site.
pub fn marker(label: &str) {
    let Some(ob) = outbox::current() else { return };
    let mut ev = Event::new(EventKind::Marker, Api::oomtrace_mark);
    ev.tid = this_thread::tid();
    ev.ts_ns = crate::clock::ticks();
    ev.stack = stack::capture();
    ob.send_marker(ev, label);
}

/// Launcher variables learnt after the Hello (`oomtrace_set_rank`); false when tracing is
/// off or the message could not be queued.
pub fn launch(vars: Vec<(String, String)>) -> bool {
    let Some(ob) = outbox::current() else {
        return false;
    };
    ob.send_reliable(Msg::Launch(vars.into_boxed_slice()))
}

/// PyTorch's own statistics of one device (`oomtrace_torch_memory`), stamped now; false when
/// tracing is off or the message could not be queued. Like a step marker it waits for room
/// while the collector reads; it is no event, so it is not counted in what the process made.
pub fn torch_memory(device: i16, allocated: u64, max_allocated: u64, reserved: u64) -> bool {
    let Some(ob) = outbox::current() else {
        return false;
    };
    ob.send_reliable(Msg::TorchMemory(TorchMemory {
        ts_ns: crate::clock::ticks(),
        device,
        allocated,
        max_allocated,
        reserved,
    }))
}

/// A segment of PyTorch's caching allocator: its reserve grew (taken from CUDA: allocated or
/// mapped) or shrank (given back: freed or unmapped), as its trace tracker said or as the
/// PyTorch way in inferred from the CUDA calls made inside the allocator's methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentChange {
    Taken,
    GivenBack,
}

/// A segment of PyTorch's reserve taken or given back, `size` bytes at `addr` on `device`
/// (`stream`: the pool's, 0 when not known).
pub fn segment(change: SegmentChange, device: i16, addr: u64, size: u64, stream: u64) {
    let kind = match change {
        SegmentChange::Taken => EventKind::Segment,
        SegmentChange::GivenBack => EventKind::SegmentFree,
    };
    let mut ev = Event::new(kind, Api::oomtrace_torch_segment);
    ev.ptr = addr;
    ev.size = size;
    ev.aux = stream;
    ev.device = device;
    emit(ev);
}
