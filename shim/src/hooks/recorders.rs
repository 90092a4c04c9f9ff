//! The hooks' recorders: each reads one hooked call's arguments and result and tells the
//! recording API (`crate::recording`) what happened, in its words.
//!
//! Order rule (as heaptrack does for malloc): anything that gives memory back is recorded
//! *before* the real call, anything that hands memory out *after* it returns. Then when another
//! thread gets the same address back, its event is queued after ours, and the collector never
//! sees an allocation of an address that is still live.

use std::ffi::{c_int, c_void};

use oomtrace_proto::{Api, EventKind, MemoryClass, DEVICE_UNKNOWN};

use crate::cuda::{CUmemAllocationProp, CU_MEM_LOCATION_TYPE_DEVICE};
use crate::guard::Recorder;
use crate::{device_watch, driver_query, recording};

/// The device of an allocation through `api` that returned `rc`: none for pinned host memory;
/// a failure's is asked (the thread may have no context at all).
#[inline]
fn device_of(api: Api, rc: c_int) -> i16 {
    if api.memory_class() == MemoryClass::HostPinned {
        DEVICE_UNKNOWN
    } else if rc == 0 {
        driver_query::device_of_success()
    } else {
        driver_query::current_device()
    }
}

/// An allocation through `api` recorded; device memory is also told to the watcher (the
/// PyTorch way in: taken inside its allocator's methods, it is a segment of its reserve).
/// Always inlined, as every recorder's methods are: each hook's copy knows its api, so its
/// memory class and the event's tail word are constants (see `guard::before`).
#[inline(always)]
fn allocated(api: Api, rc: c_int, ptr: u64, size: u64, aux: u64, extra: u64) {
    let device = device_of(api, rc);
    recording::alloc(api, device, rc, ptr, size, aux, extra);
    if api.memory_class() == MemoryClass::Device {
        device_watch::taken(rc, ptr, size, device);
    }
}

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
    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        let ptr = if rc == 0 {
            // SAFETY: read only after success: the real call then wrote the out-parameter.
            unsafe { self.out.get() }
        } else {
            0
        };
        allocated(self.api, rc, ptr, self.size, self.aux, self.extra);
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
    #[inline(always)]
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
        allocated(self.api, rc, ptr, size, 0, 0);
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
    // `after` records only a release that failed.
    const AFTER_ON_SUCCESS: bool = false;

    #[inline(always)]
    fn before(&mut self) {
        // A free or unmap of a segment of PyTorch's reserve: the watcher records the segment
        // given back first. cudaFree(NULL) gives nothing back.
        if matches!(self.kind, EventKind::Free | EventKind::Unmap) && self.ptr != 0 {
            device_watch::giving_back(self.ptr);
        }
        recording::release(
            self.api,
            self.kind,
            DEVICE_UNKNOWN,
            self.ptr,
            self.size,
            self.aux,
        );
    }

    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        recording::release_failed(self.api, self.ptr, rc);
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
    #[inline(always)]
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
        let handle = if rc == 0 {
            // SAFETY: the call succeeded.
            unsafe { self.out.get() }
        } else {
            0
        };
        recording::phys_create(self.api, device, rc, handle, self.size);
        if rc != 0 {
            // Expandable segments: the physical memory PyTorch's allocator could not get.
            device_watch::taken(rc, 0, self.size, device);
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
    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        if rc == 0 {
            // SAFETY: the call succeeded.
            let handle = unsafe { self.out.get() };
            recording::phys_retain(self.api, handle, self.addr as u64);
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
    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        if rc == 0 {
            recording::mapped(self.api, self.va, self.size, self.handle, self.offset);
            // Expandable segments grow by mapping.
            device_watch::mapped(self.va, self.size);
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
    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        if rc == 0 {
            // SAFETY: the call succeeded.
            let va = unsafe { self.out.get() };
            let device = driver_query::current_device();
            recording::va_reserved(self.api, device, va, self.size, self.alignment);
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
    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        if rc != 0 || self.free.is_null() || self.total.is_null() {
            return;
        }
        // SAFETY: both out-parameters were written by the successful real call.
        let free = unsafe { self.free.read() } as u64;
        // SAFETY: as above.
        let total = unsafe { self.total.read() } as u64;
        recording::memory_info(self.api, driver_query::current_device(), free, total);
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
    #[inline(always)]
    fn after(&mut self, rc: c_int) {
        recording::init(self.api, rc);
    }
}
