//! Tensor-level tracing through the methods of PyTorch's own caching allocator: the first way
//! in (`oomtrace_torch_attach`, called by the Python side right after PyTorch initialised
//! CUDA), with PyTorch's trace tracker (`torch_tracker.rs`) as the second.
//!
//! Why not the tracker first: PyTorch builds a `TraceEntry` (with a `std::string`) for each of
//! the three entries a tensor makes once any tracker is attached, which cost about as much as
//! all of oomtrace's own recording (measured: bench/2026-11-28-vtable.md). Here PyTorch
//! does nothing it would not do untraced.
//!
//! How: the native allocator (`NativeCachingAllocator`, checked by its type name) is one
//! object whose class's vtable has, among the `c10::Allocator` / `CUDAAllocator` methods,
//! `allocate`, `raw_alloc`, `raw_alloc_with_stream`, `raw_delete` and `raw_deleter` (slots
//! read as `torch_abi.rs` reads them: no slot number is compiled in). Those five slots are
//! pointed at the wrappers below (each a word store into the vtable's read-only page, made
//! writable for the store and given its protection back); the real methods are kept and
//! called. Every call goes on exactly as without oomtrace:
//!
//! - `allocate(n)` returns a `DataPtr` {data, deleter, context, device}. The wrapper records
//!   the tensor (data, n, device, the device's current stream: see `tensor_stream` for when
//!   it is known without asking) and puts its own deleter in
//!   place of the allocator's (`local_raw_delete`), only when the `DataPtr` holds exactly
//!   what the native allocator puts there (the context is the data pointer, the deleter is
//!   the one `raw_deleter()` returned): anything else is left untouched and not recorded.
//! - The deleter records the free, then calls the allocator's. `raw_deleter()` returns it too,
//!   so that PyTorch's own comparisons (`get_deleter() == raw_deleter()`, e.g. for CUDA graph
//!   pools) hold for every tensor as before.
//! - `raw_alloc`, `raw_alloc_with_stream`, `raw_delete` (cuDNN and Thrust workspaces,
//!   `caching_allocator_alloc`) are recorded as tensors are.
//! - While a method runs, the device memory the driver hands out is the allocator's reserve:
//!   the hooks tell this way in of every device allocation, mapping and release through its
//!   watcher (`device_watch.rs`, installed with the wrappers), and the watcher records the
//!   segments (`torch_reserve.rs` keeps the state). A method that unwinds (PyTorch
//!   raised) after the driver refused memory inside it, or after PyTorch's out-of-memory
//!   observer spoke inside it (`oomtrace_torch_out_of_memory`, which the Python package
//!   registers: the only word of an OOM under `set_per_process_memory_fraction`, where the
//!   allocator refuses before the driver does), is the allocator's OOM: recorded with the
//!   request as PyTorch rounds it, and what the observer said the allocator was allowed. An
//!   exception with neither inside (a CUDA error surfacing) is not called an OOM.
//!
//! Differences from the tracker, said in docs/pytorch.md: a free is recorded when PyTorch is
//! asked to free (the tracker said when the block was free again, later under
//! `record_stream`), and a free carries no size or stream (the collector has them from the
//! allocation). The wrappers are `C-unwind`: PyTorch's exceptions pass through them (Rust
//! runs the wrapper's drop on the way, which is how an OOM is seen); oomtrace's own code runs
//! inside `guard::catch` and never unwinds into PyTorch.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use oomtrace_proto::{Api, EventKind};

use crate::cuda::CUDA_ERROR_OUT_OF_MEMORY;
use crate::device_watch::{self, Watcher};
use crate::recording::SegmentChange;
use crate::torch_abi::{current_allocator, loaded, Pluggable, C10_CUDA};
use crate::transport::fd_guard;
use crate::{config, driver_query, guard, log, recording, symbols, torch_reserve, torch_tracker};

const ALLOCATE: [&CStr; 1] =
    [c"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator8allocateEm"];
const RAW_ALLOC: [&CStr; 1] =
    [c"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator9raw_allocEm"];
const RAW_ALLOC_WITH_STREAM: [&CStr; 1] = [
    c"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator21raw_alloc_with_streamEmP11CUstream_st",
];
const RAW_DELETE: [&CStr; 1] =
    [c"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator10raw_deleteEPv"];
const RAW_DELETER: [&CStr; 1] =
    [c"_ZNK5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator11raw_deleterEv"];
/// `c10::cuda::getCurrentCUDAStream(DeviceIndex)`.
const CURRENT_STREAM: &CStr = c"_ZN3c104cuda20getCurrentCUDAStreamEa";
/// The type name (`std::type_info::name()`) of the one class whose vtable is changed.
const NATIVE_CLASS: &[u8] = b"N3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocatorE";
/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: u8 = 1;

/// `c10::DataPtr` (32 bytes): the data pointer; the context's `std::unique_ptr<void,
/// DeleterFnPtr>` (libstdc++ keeps the deleter first, the pointer second: both orders are
/// accepted, by value); the `c10::Device` (type, index) in the low bytes of the last word.
#[repr(C)]
struct DataPtr([usize; 4]);

/// `c10::cuda::CUDAStream`: trivially copyable, 16 bytes, returned in two registers: its
/// device, then its `StreamId` (which encodes the stream's kind and index).
#[repr(C)]
#[derive(Clone, Copy)]
struct CudaStream {
    _device: u64,
    id: u64,
}

type Deleter = unsafe extern "C-unwind" fn(*mut c_void);
type AllocateFn = unsafe extern "C-unwind" fn(*mut DataPtr, *mut c_void, usize) -> *mut DataPtr;
type RawAllocFn = unsafe extern "C-unwind" fn(*mut c_void, usize) -> *mut c_void;
type RawAllocWithStreamFn =
    unsafe extern "C-unwind" fn(*mut c_void, usize, *mut c_void) -> *mut c_void;
type RawDeleteFn = unsafe extern "C-unwind" fn(*mut c_void, *mut c_void);
type RawDeleterFn = unsafe extern "C-unwind" fn(*const c_void) -> Option<Deleter>;
type CurrentStreamFn = unsafe extern "C-unwind" fn(i8) -> CudaStream;

/// The real methods and helpers, stored before any slot points at a wrapper, never changed
/// after.
static REAL_ALLOCATE: AtomicUsize = AtomicUsize::new(0);
static REAL_RAW_ALLOC: AtomicUsize = AtomicUsize::new(0);
static REAL_RAW_ALLOC_WITH_STREAM: AtomicUsize = AtomicUsize::new(0);
static REAL_RAW_DELETE: AtomicUsize = AtomicUsize::new(0);
/// The allocator's own deleter (`local_raw_delete`), as `raw_deleter()` returned it.
static REAL_DELETER: AtomicUsize = AtomicUsize::new(0);
static CURRENT_STREAM_FN: AtomicUsize = AtomicUsize::new(0);

static STATE: AtomicU8 = AtomicU8::new(IDLE);
const IDLE: u8 = 0;
const INSTALLING: u8 = 1;
const INSTALLED: u8 = 2;

/// Inside one of the allocator's methods on this thread. Dropped without `returned` (the
/// method unwound: PyTorch raised), it records the OOM when the driver refused memory inside.
struct Inside {
    /// The bytes the program asked for.
    request: usize,
    returned: bool,
}

impl Inside {
    fn enter(request: usize) -> Inside {
        torch_reserve::enter();
        Inside {
            request,
            returned: false,
        }
    }

    fn returned(mut self) {
        self.returned = true;
        torch_reserve::leave();
    }

    /// The method unwound (out of line: every tensor's `allocate` drops an `Inside`).
    #[cold]
    #[inline(never)]
    fn unwound(&self) {
        let refused = torch_reserve::leave();
        if let Some(f) = refused.filter(|f| f.rc == CUDA_ERROR_OUT_OF_MEMORY) {
            // What PyTorch's OOM entry says: the request rounded as its allocator rounds
            // (whole 512-byte blocks; a `roundup_power2_divisions` setting rounds further,
            // which `oomtrace whatif` applies itself).
            record_oom(
                f.device,
                rounded(self.request),
                torch_reserve::take_observed(),
            );
        }
    }
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        if !self.returned {
            self.unwound();
        }
    }
}

/// PyTorch's `round_size` without `roundup_power2_divisions`: at least 512 bytes, whole
/// 512-byte blocks.
fn rounded(n: usize) -> u64 {
    (n.max(1) as u64).div_ceil(512) * 512
}

/// Records the allocator's OOM as every hook records: only when recording, once, never
/// unwinding.
fn record_oom(device: i16, size: u64, allowed: u64) {
    if !guard::enter() {
        return;
    }
    guard::catch(|| {
        recording::alloc(
            Api::oomtrace_torch_alloc,
            device,
            CUDA_ERROR_OUT_OF_MEMORY,
            0,
            size,
            0,
            allowed,
        )
    });
    guard::leave();
}

/// Set while every tensor is known to be on its device's default stream without asking
/// (`tensor_stream`): at install, when every segment PyTorch's allocator makes from then on
/// passes through the hooks and it has made none yet; cleared for good by the first segment
/// made on another stream, or the first raw allocation on one.
static DEFAULT_STREAM_ONLY: AtomicBool = AtomicBool::new(false);

/// Whether the hooks will see every segment PyTorch's allocator makes from now on, all of
/// them: this library's `cudaMalloc` and `dlsym` are the ones the process binds (it was
/// preloaded, as `oomtrace run` does; opened late, the program's calls reach the real ones),
/// and no device memory was allocated yet.
fn reserve_seen_from_empty() -> bool {
    let bound =
        |name: &CStr| symbols::is_ours(symbols::real_dlsym(libc::RTLD_DEFAULT, name) as usize);
    !recording::any_device_seen() && bound(c"cudaMalloc") && bound(c"dlsym")
}

/// The stream of a tensor `allocate` just made on `device`. The caching allocator keeps a pool
/// per stream and makes each segment for one stream: a tensor on a stream other than the
/// default lies in a segment made for that stream, made inside one of the wrapped methods,
/// where `stream_of_segment` saw it before the tensor is recorded. So while no such segment
/// was seen (and all were), the answer is the default stream's 0, without PyTorch's
/// `getCurrentCUDAStream` (about 105 instructions a tensor, with its thread-local lookups).
#[inline]
fn tensor_stream(device: i8) -> u64 {
    // Relaxed: the flag is cleared inside the method that made the segment, under the
    // allocator's lock, which any later allocation from that segment takes too.
    if DEFAULT_STREAM_ONLY.load(Ordering::Relaxed) {
        0
    } else {
        current_stream(device)
    }
}

/// A segment made on `device` inside one of the allocator's methods: if on a stream other
/// than the default, tensors' streams must be asked from now on.
fn stream_of_segment(device: i16) {
    if DEFAULT_STREAM_ONLY.load(Ordering::Relaxed)
        && (0..=i16::from(i8::MAX)).contains(&device)
        && current_stream(device as i8) != 0
    {
        DEFAULT_STREAM_ONLY.store(false, Ordering::Relaxed);
    }
}

/// The current stream of `device` (PyTorch's, per thread) by its `StreamId`: what tells the
/// allocator's per-stream pools apart, 0 for the default stream (whose `cudaStream_t` is 0
/// too), at a third of the cost of asking for the `cudaStream_t` as well.
fn current_stream(device: i8) -> u64 {
    let get = CURRENT_STREAM_FN.load(Ordering::Relaxed);
    if get == 0 {
        return 0;
    }
    // SAFETY: looked up by its mangled name in libc10_cuda at install, with this signature;
    // the device is one the allocator just allocated on.
    unsafe { std::mem::transmute::<usize, CurrentStreamFn>(get)(device).id }
}

/// `DataPtr CUDAAllocator::allocate(size_t)`: the `DataPtr` is returned through `ret`.
unsafe extern "C-unwind" fn allocate(
    ret: *mut DataPtr,
    this: *mut c_void,
    n: usize,
) -> *mut DataPtr {
    // SAFETY: stored at install from the slot this wrapper replaced, before the replacement.
    let real =
        unsafe { std::mem::transmute::<usize, AllocateFn>(REAL_ALLOCATE.load(Ordering::Relaxed)) };
    let inside = Inside::enter(n);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { real(ret, this, n) };
    inside.returned();
    // SAFETY: the real method constructed the DataPtr at `ret`.
    guard::catch(|| unsafe { allocated(&mut *ret, n) });
    r
}

/// A `DataPtr` the native allocator made: its deleter swapped for ours and the tensor recorded,
/// when it holds exactly what that allocator puts there.
fn allocated(p: &mut DataPtr, n: usize) {
    let data = p.0[0];
    let real = REAL_DELETER.load(Ordering::Relaxed);
    if data == 0 || real == 0 {
        return;
    }
    let word = match (p.0[1], p.0[2]) {
        (d, c) if d == real && c == data => 1,
        (c, d) if d == real && c == data => 2,
        _ => return,
    };
    let device_word = p.0[3];
    if device_word as u8 != DEVICE_TYPE_CUDA {
        return;
    }
    let device = (device_word >> 8) as u8 as i8;
    if !guard::enter() {
        return;
    }
    p.0[word] = delete as Deleter as usize;
    torch_reserve::tensor_device(device as i16);
    let stream = tensor_stream(device);
    guard::catch(|| tensor(device as i16, data as u64, n as u64, stream));
    guard::leave();
}

/// The deleter of every tensor the wrapper saw: records the free, then frees as PyTorch does.
unsafe extern "C-unwind" fn delete(ctx: *mut c_void) {
    if !ctx.is_null() {
        freed(ctx as u64);
    }
    // SAFETY: stored at install from `raw_deleter()`, never changed; it takes the context.
    unsafe { std::mem::transmute::<usize, Deleter>(REAL_DELETER.load(Ordering::Relaxed))(ctx) }
}

/// Inlined into the deleter: its call and its frame's saves were a tenth of the free's cost.
#[inline(always)]
fn freed(ptr: u64) {
    if !guard::enter() {
        return;
    }
    guard::catch(|| {
        let device = torch_reserve::device_of(ptr);
        recording::release(Api::oomtrace_torch_free, EventKind::Free, device, ptr, 0, 0)
    });
    guard::leave();
}

/// A tensor PyTorch's allocator handed out.
fn tensor(device: i16, addr: u64, size: u64, stream: u64) {
    recording::alloc(Api::oomtrace_torch_alloc, device, 0, addr, size, stream, 0);
}

/// The hooks' word on device memory: what is taken inside one of the allocator's methods on
/// this thread is a segment of PyTorch's reserve (as its trace tracker would have said it,
/// after the allocation); a free or unmap of a segment's base address, from any thread
/// (`empty_cache()` is not wrapped), gives it back, before the real call.
static SEGMENTS: Watcher = Watcher {
    taken: segment_taken,
    mapped: segment_mapped,
    giving_back: segment_given_back,
};

fn segment_taken(rc: i32, ptr: u64, size: u64, device: i16) {
    if torch_reserve::device_alloc(rc, ptr, size, device) {
        stream_of_segment(device);
        recording::segment(SegmentChange::Taken, device, ptr, size, 0);
    }
}

/// Expandable segments grow by mapping: each mapping made inside a method is reserve, as a
/// segment, on the current device.
fn segment_mapped(va: u64, size: u64) {
    if torch_reserve::inside_method() {
        segment_taken(0, va, size, driver_query::current_device());
    }
}

fn segment_given_back(ptr: u64) {
    if let Some((size, device)) = torch_reserve::device_free(ptr) {
        recording::segment(SegmentChange::GivenBack, device, ptr, size, 0);
    }
}

/// A raw allocation (no tensor), recorded as one, on the current device.
fn raw_allocated(ptr: *mut c_void, n: usize, stream: Option<u64>) {
    if ptr.is_null() || !guard::enter() {
        return;
    }
    guard::catch(|| {
        let device = driver_query::current_device();
        torch_reserve::tensor_device(device);
        if stream.is_some_and(|s| s != 0) {
            // Its segment may have been made for that stream while the current one is the
            // default: later tensors on it would lie there.
            DEFAULT_STREAM_ONLY.store(false, Ordering::Relaxed);
        }
        let stream = stream.unwrap_or_else(|| current_stream(device as i8));
        tensor(device, ptr as u64, n as u64, stream)
    });
    guard::leave();
}

unsafe extern "C-unwind" fn raw_alloc(this: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: as in `allocate`.
    let real =
        unsafe { std::mem::transmute::<usize, RawAllocFn>(REAL_RAW_ALLOC.load(Ordering::Relaxed)) };
    let inside = Inside::enter(n);
    // SAFETY: the caller's arguments, passed on unchanged.
    let p = unsafe { real(this, n) };
    inside.returned();
    raw_allocated(p, n, None);
    p
}

unsafe extern "C-unwind" fn raw_alloc_with_stream(
    this: *mut c_void,
    n: usize,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: as in `allocate`.
    let real = unsafe {
        std::mem::transmute::<usize, RawAllocWithStreamFn>(
            REAL_RAW_ALLOC_WITH_STREAM.load(Ordering::Relaxed),
        )
    };
    let inside = Inside::enter(n);
    // SAFETY: the caller's arguments, passed on unchanged.
    let p = unsafe { real(this, n, stream) };
    inside.returned();
    raw_allocated(p, n, Some(stream as u64));
    p
}

unsafe extern "C-unwind" fn raw_delete(this: *mut c_void, ptr: *mut c_void) {
    if !ptr.is_null() {
        freed(ptr as u64);
    }
    // SAFETY: as in `allocate`.
    let real = unsafe {
        std::mem::transmute::<usize, RawDeleteFn>(REAL_RAW_DELETE.load(Ordering::Relaxed))
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real(this, ptr) }
}

unsafe extern "C-unwind" fn raw_deleter(_this: *const c_void) -> Option<Deleter> {
    Some(delete)
}

/// The protection of the mapping that holds `addr` (`/proc/self/maps`, read in a window in
/// which the program's close calls wait: the descriptor read and closed is the shim's own).
fn protection_of(addr: usize) -> Option<c_int> {
    let maps = fd_guard::read_own(std::path::Path::new("/proc/self/maps"))?.ok()?;
    let maps = String::from_utf8(maps).ok()?;
    maps.lines().find_map(|line| {
        let (range, rest) = line.split_once(' ')?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        if !(lo..hi).contains(&addr) {
            return None;
        }
        let perms = rest.as_bytes();
        let mut prot = 0;
        if perms.first() == Some(&b'r') {
            prot |= libc::PROT_READ;
        }
        if perms.get(1) == Some(&b'w') {
            prot |= libc::PROT_WRITE;
        }
        if perms.get(2) == Some(&b'x') {
            prot |= libc::PROT_EXEC;
        }
        Some(prot)
    })
}

/// Stores `value` in the vtable word at `at`: its page made writable for the store (a vtable
/// lives in read-only relocated data), then given its protection back.
///
/// # Safety
/// `at` is a slot of a live vtable, and `value` a function with that slot's signature.
unsafe fn patch(at: *mut usize, value: usize) -> Result<(), &'static CStr> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = (at as usize) & !(page - 1);
    let Some(prot) = protection_of(at as usize) else {
        return Err(c"the allocator's vtable is in no mapping");
    };
    let writable = prot & libc::PROT_WRITE != 0;
    if !writable {
        // SAFETY: changes the protection of the page holding the slot only, adding write.
        let rc = unsafe { libc::mprotect(start as *mut c_void, page, prot | libc::PROT_WRITE) };
        if rc != 0 {
            return Err(c"the allocator's vtable cannot be made writable");
        }
    }
    // SAFETY: an aligned word of a now writable page; other threads reading the slot see the
    // old method or the wrapper, both valid.
    unsafe { (*(at as *const AtomicUsize)).store(value, Ordering::Release) };
    // SAFETY: gives the page the protection it had.
    if !writable && unsafe { libc::mprotect(start as *mut c_void, page, prot) } != 0 {
        log::warn("the page of PyTorch's allocator vtable stays writable");
    }
    Ok(())
}

/// The name of the class whose vtable `vptr` points into (Itanium ABI: the typeinfo pointer
/// precedes the address point, its second word is the name).
///
/// # Safety
/// `vptr` is the vtable pointer of a live polymorphic object.
unsafe fn class_name(vptr: *const usize) -> &'static [u8] {
    // SAFETY: per the contract; typeinfo objects and their names live as long as the library.
    unsafe {
        let ti = vptr.sub(1).read() as *const *const c_char;
        if ti.is_null() {
            return b"";
        }
        let name = ti.add(1).read();
        if name.is_null() {
            return b"";
        }
        let name = CStr::from_ptr(name).to_bytes();
        name.strip_prefix(b"*").unwrap_or(name)
    }
}

/// Points the native allocator's five methods at the wrappers. Returns why not, or `None`.
fn install_now() -> Result<Vec<usize>, &'static CStr> {
    let pluggable = Pluggable::find()?;
    let (object, vptr) = current_allocator(&pluggable)?;
    // SAFETY: the live allocator object's vtable pointer.
    if unsafe { class_name(vptr) } != NATIVE_CLASS {
        return Err(c"PyTorch's allocator is not its native caching allocator");
    }
    let c10 = loaded(C10_CUDA);
    let get_stream = symbols::real_dlsym(c10, CURRENT_STREAM) as usize;
    if get_stream == 0 {
        return Err(c"this PyTorch does not export the allocator symbols oomtrace needs");
    }
    let wrappers: [(&[&CStr], &AtomicUsize, usize); 5] = [
        (&ALLOCATE, &REAL_ALLOCATE, allocate as AllocateFn as usize),
        (
            &RAW_ALLOC,
            &REAL_RAW_ALLOC,
            raw_alloc as RawAllocFn as usize,
        ),
        (
            &RAW_ALLOC_WITH_STREAM,
            &REAL_RAW_ALLOC_WITH_STREAM,
            raw_alloc_with_stream as RawAllocWithStreamFn as usize,
        ),
        (
            &RAW_DELETE,
            &REAL_RAW_DELETE,
            raw_delete as RawDeleteFn as usize,
        ),
        (
            &RAW_DELETER,
            &REAL_DELETER,
            raw_deleter as RawDeleterFn as usize,
        ),
    ];
    let mut slots = Vec::with_capacity(wrappers.len());
    for (names, _, _) in &wrappers {
        let Some(slot) = pluggable.slot(names) else {
            return Err(c"an allocator method is not in the allocator's vtable once");
        };
        // SAFETY: the native vtable has the base class's slots.
        if unsafe { vptr.add(slot).read() } == 0 {
            return Err(c"an allocator method's slot is empty");
        }
        slots.push(slot);
    }
    // SAFETY: `DeleterFnPtr raw_deleter() const`: `this` only, cannot throw.
    let deleter = unsafe {
        let real = std::mem::transmute::<usize, RawDeleterFn>(vptr.add(slots[4]).read());
        real(object as *const c_void)
    };
    let Some(deleter) = deleter else {
        return Err(c"PyTorch's allocator has no deleter");
    };
    for (i, (_, real, _)) in wrappers.iter().enumerate() {
        // SAFETY: as above.
        real.store(unsafe { vptr.add(slots[i]).read() }, Ordering::Relaxed);
    }
    REAL_DELETER.store(deleter as usize, Ordering::Relaxed);
    CURRENT_STREAM_FN.store(get_stream, Ordering::Relaxed);
    DEFAULT_STREAM_ONLY.store(reserve_seen_from_empty(), Ordering::Relaxed);
    torch_reserve::activate();
    device_watch::install(&SEGMENTS);
    for (i, (_, _, wrapper)) in wrappers.iter().enumerate() {
        // SAFETY: the slot of the method the wrapper has the signature of.
        if let Err(why) = unsafe { patch(vptr.add(slots[i]) as *mut usize, *wrapper) } {
            // Put back what was changed: the wrappers only forward, so either state is sound.
            for (j, (_, real, _)) in wrappers.iter().enumerate().take(i) {
                // SAFETY: as above, with the real method.
                let _ = unsafe {
                    patch(
                        vptr.add(slots[j]) as *mut usize,
                        real.load(Ordering::Relaxed),
                    )
                };
            }
            return Err(why);
        }
    }
    Ok(slots)
}

/// Hooks the allocator's methods once. Returns why not, or `None` (hooked now or before).
fn install() -> Option<&'static CStr> {
    match STATE.compare_exchange(IDLE, INSTALLING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(INSTALLED) => return None,
        Err(_) => return Some(c"another thread is hooking PyTorch's allocator"),
    }
    let result = install_now();
    STATE.store(
        if result.is_ok() { INSTALLED } else { IDLE },
        Ordering::Release,
    );
    match result {
        Ok(slots) => {
            log::info(&format!(
                "tracing PyTorch's tensors through its allocator's methods (vtable slots {slots:?})"
            ));
            None
        }
        Err(why) => Some(why),
    }
}

fn attach() -> Option<&'static CStr> {
    if config::torch_entry_is_tracker() || torch_tracker::attached() {
        return torch_tracker::attach();
    }
    let why = install()?;
    log::info(&format!(
        "PyTorch's allocator methods not hooked ({}): attaching its trace tracker",
        why.to_string_lossy()
    ));
    torch_tracker::attach()
}

/// Traces PyTorch's tensors in its CUDA caching allocator: through its methods, else through
/// an allocator trace tracker. Call it after PyTorch initialised CUDA
/// (`torch.cuda.is_initialized()`, or from `torch.cuda._lazy_call` as `oomtrace.install()`
/// does). Returns NULL once tracing (or already), otherwise why not (a static C string).
#[unsafe(no_mangle)]
pub extern "C" fn oomtrace_torch_attach() -> *const c_char {
    match guard::catch(attach) {
        Some(None) => std::ptr::null(),
        Some(Some(why)) => {
            log::info(&format!(
                "PyTorch's tensors are not traced: {}",
                why.to_string_lossy()
            ));
            why.as_ptr()
        }
        None => c"internal error".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protection_of_this_code_is_read_from_the_maps() {
        let here = protection_of(protection_of as fn(usize) -> Option<c_int> as usize);
        assert_eq!(here, Some(libc::PROT_READ | libc::PROT_EXEC));
        let stack = 0u64;
        assert_eq!(
            protection_of(&stack as *const u64 as usize),
            Some(libc::PROT_READ | libc::PROT_WRITE)
        );
    }

    #[test]
    fn a_read_only_word_is_patched_and_stays_read_only() {
        // SAFETY: an anonymous page of our own, made read-only like a vtable's.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            let p = libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let slot = (p as *mut usize).add(3);
            slot.write(7);
            assert_eq!(libc::mprotect(p, page, libc::PROT_READ), 0);
            assert_eq!(patch(slot, 42), Ok(()));
            assert_eq!(slot.read(), 42);
            assert_eq!(protection_of(slot as usize), Some(libc::PROT_READ));
            libc::munmap(p, page);
        }
    }

    #[test]
    fn requests_are_rounded_as_pytorch_rounds_them() {
        assert_eq!(rounded(0), 512);
        assert_eq!(rounded(1), 512);
        assert_eq!(rounded(512), 512);
        assert_eq!(rounded(513), 1024);
        assert_eq!(rounded(7 << 20), 7 << 20);
    }

    #[test]
    fn a_data_ptr_that_is_not_the_native_allocators_is_left_alone() {
        REAL_DELETER.store(0x5000, Ordering::Relaxed);
        // Context not the data pointer: someone else's DataPtr.
        let mut p = DataPtr([0x1000, 0x5000, 0x2000, 0x0001]);
        allocated(&mut p, 16);
        assert_eq!(p.0, [0x1000, 0x5000, 0x2000, 0x0001]);
        // Not a CUDA device.
        let mut p = DataPtr([0x1000, 0x5000, 0x1000, 0x0000]);
        allocated(&mut p, 16);
        assert_eq!(p.0[1], 0x5000);
    }
}
