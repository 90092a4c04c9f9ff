//! The one recording API: what every way in (the hooks' recorders in `hooks/recorders.rs`,
//! `pluggable.rs`, `torch_tracker.rs`, `torch_allocator.rs`, the C entry points in `lib.rs`)
//! calls to turn what it saw into events, and which knows none of them (as heaptrack's
//! `libheaptrack.h` and memray's `Tracker` are the one interface under their ways in).
//!
//! Each call is in oomtrace's own words: an allocation, a release, a segment of PyTorch's
//! reserve taken or given back, what the device reports, a marker, launcher variables, a
//! tensor. A way in translates its own vocabulary (a hook's arguments, PyTorch's trace
//! actions) before it calls here.
//!
//! Order rule (as heaptrack does for malloc): the caller records anything that gives memory
//! back *before* the real call, anything that hands memory out *after* it returns. Then when
//! another thread gets the same address back, its event is queued after ours, and the
//! collector never sees an allocation of an address that is still live.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use oomtrace_proto::wire::TorchMemory;
use oomtrace_proto::{Api, Event, EventKind, MemoryClass, DEVICE_UNKNOWN};

use crate::driver_query;
use crate::stack;
use crate::transport::outbox::{self, Msg};

// Every function a hook's recorder calls is `#[inline]`: the recorders and what they call were
// one module before, and the hooks' cost must not grow with a move across codegen units.

/// Sends `ev` stamped with thread and time. Every event waits for room while the collector
/// reads (a lost free would become a phantom leak); one that cannot go is counted lost.
fn emit(mut ev: Event) {
    let Some(ob) = outbox::current() else { return };
    ev.tid = tid();
    ev.ts_ns = crate::clock::ticks();
    ob.send_event(ev);
}

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// Devices seen so far in this process (bit per device 0..63).
static SEEN_DEVICES: AtomicU64 = AtomicU64::new(0);

/// The kernel thread id, cached per thread.
#[inline]
pub fn tid() -> u32 {
    TID.try_with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        // SAFETY: gettid has no preconditions.
        let v = unsafe { libc::gettid() } as u32;
        t.set(v);
        v
    })
    // SAFETY: gettid has no preconditions (this thread's thread-locals are being destroyed).
    .unwrap_or_else(|_| unsafe { libc::gettid() } as u32)
}

/// In a fork child: its thread has a new id, and it has seen no device yet.
pub fn reset_after_fork() {
    let _ = TID.try_with(|t| t.set(0));
    SEEN_DEVICES.store(0, Ordering::Relaxed);
    crate::torch_reserve::deactivate_after_fork();
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

/// The device of an allocation through `api` that returned `rc`: none for pinned host memory;
/// a failure's is asked (the thread may have no context at all).
fn device_of(api: Api, rc: c_int) -> i16 {
    if api.memory_class() == MemoryClass::HostPinned {
        DEVICE_UNKNOWN
    } else if rc == 0 {
        driver_query::device_of_success()
    } else {
        driver_query::current_device()
    }
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
#[inline]
fn first_sight(device: i16) {
    // Seen already (every allocation but the first): one load, nothing called.
    if (0..64).contains(&device) && SEEN_DEVICES.load(Ordering::Relaxed) & (1u64 << device) != 0 {
        return;
    }
    if outbox::current().is_some() && first_sight_of_device(device) {
        device_memory_info(device);
    }
}

/// An allocation through `api` returned `rc` (and `ptr` on success), on the current device
/// (none for pinned host memory). Device memory taken inside a method of PyTorch's allocator
/// is also a segment of its reserve.
#[inline]
pub fn alloc(api: Api, rc: c_int, ptr: u64, size: u64, aux: u64, extra: u64) {
    let device = device_of(api, rc);
    alloc_on(api, rc, ptr, size, aux, extra, device);
    if api.memory_class() == MemoryClass::Device {
        segment_taken(rc, ptr, size, device);
    }
}

/// Device memory taken (or refused) inside a method of PyTorch's allocator is a segment of its
/// reserve (torch_reserve.rs): recorded as its trace tracker would have, after the allocation.
fn segment_taken(rc: c_int, ptr: u64, size: u64, device: i16) {
    if crate::torch_reserve::device_alloc(rc, ptr, size, device) {
        torch_segment(device, ptr, size, 0);
    }
}

/// A segment of PyTorch's reserve given back (freed or unmapped), before the real call.
fn segment_given_back(ptr: u64) {
    if let Some((size, device)) = crate::torch_reserve::device_free(ptr) {
        torch_segment_free(device, ptr, size, 0);
    }
}

/// An allocation (or its failure, `rc` != 0) on a known device, with the caller's stack.
fn alloc_on(api: Api, rc: c_int, ptr: u64, size: u64, aux: u64, extra: u64, device: i16) {
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
}

/// Memory or address space given back (`kind`: a free, an unmap, a handle released, address
/// space released), before the real call. A free or unmap of a segment of PyTorch's reserve is
/// recorded as that segment given back first.
#[inline]
pub fn release(api: Api, kind: EventKind, ptr: u64, size: u64, aux: u64) {
    // cudaFree(NULL) is how programs initialise the runtime; nothing is freed.
    if ptr == 0 {
        return;
    }
    if matches!(kind, EventKind::Free | EventKind::Unmap) {
        segment_given_back(ptr);
    }
    let mut ev = Event::new(kind, api);
    ev.ptr = ptr;
    ev.size = size;
    ev.aux = aux;
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
pub fn phys_create(api: Api, rc: c_int, handle: u64, size: u64, device: i16) {
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
        // After the event, as for an allocation (`alloc_on`).
        first_sight(device);
    } else {
        device_memory_info(device);
        // Expandable segments: the physical memory PyTorch's allocator could not get.
        crate::torch_reserve::device_alloc(rc, 0, size, device);
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
    // Expandable segments grow by mapping: each mapping is reserve, as a segment.
    if crate::torch_reserve::inside_method() {
        segment_taken(0, va, size, driver_query::current_device());
    }
}

/// Address space reserved at `va` on the current device: not memory, kept so that mappings
/// can be explained.
#[inline]
pub fn va_reserved(api: Api, va: u64, size: u64, alignment: u64) {
    let mut ev = Event::new(EventKind::VaReserve, api);
    ev.ptr = va;
    ev.size = size;
    ev.extra = alignment;
    ev.device = driver_query::current_device();
    emit(ev);
}

/// Free and total memory of the current device, as the program itself asked and saw them.
#[inline]
pub fn memory_info(api: Api, free: u64, total: u64) {
    let mut ev = Event::new(EventKind::MemInfo, api);
    ev.ptr = free;
    ev.size = total;
    ev.device = driver_query::current_device();
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
    ev.tid = tid();
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

/// A tensor-level allocation through `oomtrace_malloc` (or its failure, `rc` != 0), on the
/// device PyTorch named.
pub fn tensor_alloc(rc: c_int, ptr: u64, size: u64, device: i16, stream: u64) {
    alloc_on(Api::oomtrace_malloc, rc, ptr, size, stream, 0, device);
}

/// A tensor-level free through `oomtrace_free`, before the real free.
pub fn tensor_free(ptr: u64, size: u64, device: i16, stream: u64) {
    let mut ev = Event::new(EventKind::Free, Api::oomtrace_free);
    ev.ptr = ptr;
    ev.size = size;
    ev.aux = stream;
    ev.device = device;
    emit(ev);
}

/// A tensor-level free whose real call failed.
pub fn tensor_free_failed(ptr: u64, rc: c_int) {
    let mut ev = Event::new(EventKind::FreeFailed, Api::oomtrace_free);
    ev.ptr = ptr;
    ev.result = rc;
    emit(ev);
}

// PyTorch's caching allocator, seen through its methods (`torch_allocator.rs`) or from
// oomtrace's trace tracker (`torch_tracker.rs`, which decodes its trace actions into these):
// tensors (with their stacks), segments (the allocator's reserve), and the allocator's own OOM.

/// A tensor PyTorch's allocator handed out.
pub fn torch_alloc(device: i16, addr: u64, size: u64, stream: u64) {
    alloc_on(Api::oomtrace_torch_alloc, 0, addr, size, stream, 0, device);
}

/// A tensor's block given back to PyTorch's allocator (the free completed, after the streams
/// that used it are done).
pub fn torch_free(device: i16, addr: u64, size: u64, stream: u64) {
    let mut ev = Event::new(EventKind::Free, Api::oomtrace_torch_free);
    ev.ptr = addr;
    ev.size = size;
    ev.aux = stream;
    ev.device = device;
    emit(ev);
}

/// A segment PyTorch's allocator took from CUDA (allocated or mapped): its reserve grew.
pub fn torch_segment(device: i16, addr: u64, size: u64, stream: u64) {
    torch_segment_event(EventKind::Segment, device, addr, size, stream);
}

/// A segment PyTorch's allocator gave back to CUDA (freed or unmapped).
pub fn torch_segment_free(device: i16, addr: u64, size: u64, stream: u64) {
    torch_segment_event(EventKind::SegmentFree, device, addr, size, stream);
}

fn torch_segment_event(kind: EventKind, device: i16, addr: u64, size: u64, stream: u64) {
    let mut ev = Event::new(kind, Api::oomtrace_torch_segment);
    ev.ptr = addr;
    ev.size = size;
    ev.aux = stream;
    ev.device = device;
    emit(ev);
}

/// PyTorch's allocator could not give a tensor of `size` bytes (what was asked).
/// `allowed`: what the allocator may reserve on the device as PyTorch's out-of-memory observer
/// said (its memory-fraction cap, or the device's total), 0 when not said.
pub fn torch_oom(device: i16, size: u64, stream: u64, allowed: u64) {
    alloc_on(
        Api::oomtrace_torch_alloc,
        OUT_OF_MEMORY,
        0,
        size,
        stream,
        allowed,
        device,
    );
}

/// CUDA_ERROR_OUT_OF_MEMORY (and cudaErrorMemoryAllocation).
const OUT_OF_MEMORY: c_int = 2;
