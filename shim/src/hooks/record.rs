//! Recorders: turn a hooked call's arguments and result into events.
//!
//! Order rule (as heaptrack does for malloc): anything that gives memory back is recorded
//! *before* the real call, anything that hands memory out *after* it returns. Then when another
//! thread gets the same address back, its event is queued after ours, and the collector never
//! sees an allocation of an address that is still live.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use oomtrace_proto::wire::TorchMemory;
use oomtrace_proto::{Api, Event, EventKind, MemoryClass, DEVICE_UNKNOWN};

use crate::cuda::{CUmemAllocationProp, CU_MEM_LOCATION_TYPE_DEVICE};
use crate::driver_query;
use crate::guard::Recorder;
use crate::stack;
use crate::transport::outbox::{self, Msg};

/// An out-parameter holding a pointer-sized value (CUdeviceptr or void*).
pub trait OutPtr: Copy {
    /// The value the real call stored, or 0 if the pointer is NULL.
    ///
    /// # Safety
    /// Only after the real call succeeded: it then wrote this out-parameter.
    unsafe fn get(self) -> u64;
}
impl OutPtr for *mut u64 {
    unsafe fn get(self) -> u64 {
        if self.is_null() {
            0
        } else {
            // SAFETY: per the trait contract.
            unsafe { self.read() }
        }
    }
}
impl OutPtr for *mut *mut c_void {
    unsafe fn get(self) -> u64 {
        if self.is_null() {
            0
        } else {
            // SAFETY: per the trait contract.
            unsafe { self.read() as u64 }
        }
    }
}

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

fn device_of(api: Api) -> i16 {
    if api.memory_class() == MemoryClass::HostPinned {
        DEVICE_UNKNOWN
    } else {
        driver_query::current_device()
    }
}

/// After a device is first seen in this process, and after every failed allocation, record
/// what the device itself reports: capacity for the report, free memory for OOM forensics.
fn record_mem_info(device: i16) {
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

fn first_sight(device: i16) {
    if outbox::current().is_some() && first_sight_of_device(device) {
        record_mem_info(device);
    }
}

fn alloc_done(api: Api, rc: c_int, ptr: u64, size: u64, aux: u64, extra: u64) {
    let device = device_of(api);
    alloc_event(api, rc, ptr, size, aux, extra, device);
    if api.memory_class() == MemoryClass::Device {
        segment_taken(rc, ptr, size, device);
    }
}

/// Device memory taken (or refused) inside a method of PyTorch's allocator is a segment of its
/// reserve (torch_reserve.rs): recorded as its trace tracker would have, after the allocation.
fn segment_taken(rc: c_int, ptr: u64, size: u64, device: i16) {
    if crate::torch_reserve::device_alloc(rc, ptr, size, device) {
        torch_trace(
            crate::torch_abi::action::SEGMENT_ALLOC,
            device,
            ptr,
            size,
            0,
        );
    }
}

/// A segment of PyTorch's reserve given back (freed or unmapped), before the real call.
fn segment_given_back(ptr: u64) {
    if let Some((size, device)) = crate::torch_reserve::device_free(ptr) {
        torch_trace(crate::torch_abi::action::SEGMENT_FREE, device, ptr, size, 0);
    }
}

fn alloc_event(api: Api, rc: c_int, ptr: u64, size: u64, aux: u64, extra: u64, device: i16) {
    if rc == 0 {
        // cudaMalloc(&p, 0) succeeds with p = NULL: nothing was allocated.
        if ptr == 0 {
            return;
        }
        first_sight(device);
        let mut ev = Event::new(EventKind::Alloc, api);
        ev.ptr = ptr;
        ev.size = size;
        ev.aux = aux;
        ev.extra = extra;
        ev.device = device;
        ev.stack = stack::capture();
        emit(ev);
    } else {
        let mut ev = Event::new(EventKind::AllocFailed, api);
        ev.size = size;
        ev.aux = aux;
        ev.extra = extra;
        ev.device = device;
        ev.result = rc;
        ev.stack = stack::capture();
        emit(ev);
        record_mem_info(device);
    }
}

/// Allocations that return the pointer through an out-parameter.
pub struct AllocOut<P: OutPtr> {
    api: Api,
    out: P,
    size: u64,
    aux: u64,
    extra: u64,
}

impl<P: OutPtr> AllocOut<P> {
    pub fn new(api: Api, out: P, size: u64, aux: u64, extra: u64) -> Self {
        AllocOut {
            api,
            out,
            size,
            aux,
            extra,
        }
    }
}

impl<P: OutPtr> Recorder for AllocOut<P> {
    fn after(&mut self, rc: c_int) {
        let ptr = if rc == 0 {
            // SAFETY: read only after success: the real call then wrote the out-parameter.
            unsafe { self.out.get() }
        } else {
            0
        };
        alloc_done(self.api, rc, ptr, self.size, self.aux, self.extra);
    }
}

/// Pitched allocations: the size is pitch x height, known only afterwards.
pub struct AllocPitch<P: OutPtr> {
    api: Api,
    out: P,
    pitch: *mut usize,
    height: usize,
}

impl<P: OutPtr> AllocPitch<P> {
    pub fn new(api: Api, out: P, pitch: *mut usize, height: usize) -> Self {
        AllocPitch {
            api,
            out,
            pitch,
            height,
        }
    }
}

impl<P: OutPtr> Recorder for AllocPitch<P> {
    fn after(&mut self, rc: c_int) {
        let pitch = if rc == 0 && !self.pitch.is_null() {
            // SAFETY: written by the successful real call.
            unsafe { self.pitch.read() }
        } else {
            0
        };
        let ptr = if rc == 0 {
            // SAFETY: read only after success: the real call then wrote the out-parameter.
            unsafe { self.out.get() }
        } else {
            0
        };
        let size = (pitch as u64).saturating_mul(self.height as u64);
        alloc_done(self.api, rc, ptr, size, 0, 0);
    }
}

/// Anything that gives memory or address space back: recorded before the real call.
pub struct Release {
    api: Api,
    kind: EventKind,
    ptr: u64,
    size: u64,
    aux: u64,
}

impl Release {
    pub fn new(api: Api, kind: EventKind, ptr: u64, size: u64, aux: u64) -> Self {
        Release {
            api,
            kind,
            ptr,
            size,
            aux,
        }
    }
}

impl Recorder for Release {
    fn before(&mut self) {
        // cudaFree(NULL) is how programs initialise the runtime; nothing is freed.
        if self.ptr == 0 {
            return;
        }
        if matches!(self.kind, EventKind::Free | EventKind::Unmap) {
            segment_given_back(self.ptr);
        }
        let mut ev = Event::new(self.kind, self.api);
        ev.ptr = self.ptr;
        ev.size = self.size;
        ev.aux = self.aux;
        emit(ev);
    }

    fn after(&mut self, rc: c_int) {
        if rc != 0 && self.ptr != 0 {
            let mut ev = Event::new(EventKind::FreeFailed, self.api);
            ev.ptr = self.ptr;
            ev.result = rc;
            emit(ev);
        }
    }
}

/// `cuMemCreate`: physical memory on the device named in `prop`.
pub struct PhysCreate {
    api: Api,
    out: *mut u64,
    size: u64,
    prop: *const CUmemAllocationProp,
}

impl PhysCreate {
    pub fn new(api: Api, out: *mut u64, size: u64, prop: *const CUmemAllocationProp) -> Self {
        PhysCreate {
            api,
            out,
            size,
            prop,
        }
    }
}

impl Recorder for PhysCreate {
    fn after(&mut self, rc: c_int) {
        let device = if self.prop.is_null() {
            DEVICE_UNKNOWN
        } else {
            // SAFETY: the caller passed a valid prop (the real call read it too).
            let loc = unsafe { (*self.prop).location };
            if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
                loc.id as i16
            } else {
                DEVICE_UNKNOWN
            }
        };
        let mut ev = if rc == 0 {
            first_sight(device);
            let mut ev = Event::new(EventKind::PhysCreate, self.api);
            // SAFETY: the call succeeded.
            ev.ptr = unsafe { self.out.get() };
            ev
        } else {
            let mut ev = Event::new(EventKind::AllocFailed, self.api);
            ev.result = rc;
            ev
        };
        ev.size = self.size;
        ev.device = device;
        ev.stack = stack::capture();
        emit(ev);
        if rc != 0 {
            record_mem_info(device);
            // Expandable segments: the physical memory PyTorch's allocator could not get.
            crate::torch_reserve::device_alloc(rc, 0, self.size, device);
        }
    }
}

/// `cuMemRetainAllocationHandle`: one more reference to the handle mapped at `addr`.
pub struct Retain {
    api: Api,
    out: *mut u64,
    addr: *mut c_void,
}

impl Retain {
    pub fn new(api: Api, out: *mut u64, addr: *mut c_void) -> Self {
        Retain { api, out, addr }
    }
}

impl Recorder for Retain {
    fn after(&mut self, rc: c_int) {
        if rc == 0 {
            let mut ev = Event::new(EventKind::PhysRetain, self.api);
            // SAFETY: the call succeeded.
            ev.ptr = unsafe { self.out.get() };
            ev.aux = self.addr as u64;
            emit(ev);
        }
    }
}

/// `cuMemMap`: a VA range now backed by (part of) a handle.
pub struct Mapped {
    api: Api,
    va: u64,
    size: u64,
    handle: u64,
    offset: u64,
}

impl Mapped {
    pub fn new(api: Api, va: u64, size: u64, handle: u64, offset: u64) -> Self {
        Mapped {
            api,
            va,
            size,
            handle,
            offset,
        }
    }
}

impl Recorder for Mapped {
    fn after(&mut self, rc: c_int) {
        if rc == 0 {
            let mut ev = Event::new(EventKind::Map, self.api);
            ev.ptr = self.va;
            ev.size = self.size;
            ev.aux = self.handle;
            ev.extra = self.offset;
            emit(ev);
            // Expandable segments grow by mapping: each mapping is reserve, as a segment.
            if crate::torch_reserve::inside_method() {
                segment_taken(0, self.va, self.size, driver_query::current_device());
            }
        }
    }
}

/// `cuMemAddressReserve`: address space, not memory; kept so mappings can be explained.
pub struct Reserve {
    api: Api,
    out: *mut u64,
    size: u64,
    alignment: u64,
}

impl Reserve {
    pub fn new(api: Api, out: *mut u64, size: u64, alignment: u64) -> Self {
        Reserve {
            api,
            out,
            size,
            alignment,
        }
    }
}

impl Recorder for Reserve {
    fn after(&mut self, rc: c_int) {
        if rc == 0 {
            let mut ev = Event::new(EventKind::VaReserve, self.api);
            // SAFETY: the call succeeded.
            ev.ptr = unsafe { self.out.get() };
            ev.size = self.size;
            ev.extra = self.alignment;
            ev.device = driver_query::current_device();
            emit(ev);
        }
    }
}

/// `cuMemGetInfo_v2` (read only): what the program itself saw.
pub struct MemInfo {
    api: Api,
    free: *mut usize,
    total: *mut usize,
}

impl MemInfo {
    pub fn new(api: Api, free: *mut usize, total: *mut usize) -> Self {
        MemInfo { api, free, total }
    }
}

impl Recorder for MemInfo {
    fn after(&mut self, rc: c_int) {
        if rc != 0 || self.free.is_null() || self.total.is_null() {
            return;
        }
        let mut ev = Event::new(EventKind::MemInfo, self.api);
        // SAFETY: both out-parameters were written by the successful real call.
        ev.ptr = unsafe { self.free.read() } as u64;
        // SAFETY: as above.
        ev.size = unsafe { self.total.read() } as u64;
        ev.device = driver_query::current_device();
        emit(ev);
    }
}

/// `cuInit`: marks when CUDA came up, and whether it worked.
pub struct Init {
    api: Api,
}

impl Init {
    pub fn new(api: Api) -> Self {
        Init { api }
    }
}

impl Recorder for Init {
    fn after(&mut self, rc: c_int) {
        let mut ev = Event::new(EventKind::Init, self.api);
        ev.result = rc;
        emit(ev);
    }
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
    alloc_event(Api::oomtrace_malloc, rc, ptr, size, stream, 0, device);
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

/// One entry of PyTorch's caching allocator, seen through its methods (`torch_allocator.rs`)
/// or from oomtrace's trace tracker (`torch_tracker.rs`): tensors (with their stacks),
/// segments (the allocator's reserve), and the allocator's own OOM. The tracker's frees that
/// are only requested are not recorded: the block stays the tensor's until the free completes
/// (after the streams that used it are done).
pub fn torch_trace(action: u32, device: i16, addr: u64, size: u64, stream: u64) {
    use crate::torch_abi::action as a;
    match action {
        a::ALLOC => alloc_event(Api::oomtrace_torch_alloc, 0, addr, size, stream, 0, device),
        a::FREE_COMPLETED => {
            let mut ev = Event::new(EventKind::Free, Api::oomtrace_torch_free);
            ev.ptr = addr;
            ev.size = size;
            ev.aux = stream;
            ev.device = device;
            emit(ev);
        }
        a::SEGMENT_ALLOC | a::SEGMENT_MAP | a::SEGMENT_FREE | a::SEGMENT_UNMAP => {
            let kind = if matches!(action, a::SEGMENT_ALLOC | a::SEGMENT_MAP) {
                EventKind::Segment
            } else {
                EventKind::SegmentFree
            };
            let mut ev = Event::new(kind, Api::oomtrace_torch_segment);
            ev.ptr = addr;
            ev.size = size;
            ev.aux = stream;
            ev.device = device;
            emit(ev);
        }
        // `addr` is the free bytes the driver reported; the tensor's size is what was asked.
        a::OOM => alloc_event(
            Api::oomtrace_torch_alloc,
            OUT_OF_MEMORY,
            0,
            size,
            stream,
            0,
            device,
        ),
        _ => {}
    }
}

/// CUDA_ERROR_OUT_OF_MEMORY (and cudaErrorMemoryAllocation).
const OUT_OF_MEMORY: c_int = 2;
