//! PyTorch's pluggable allocator entry points: `oomtrace_malloc` / `oomtrace_free`, with the
//! ABI `torch.cuda.memory.CUDAPluggableAllocator` calls.
//!
//! PyTorch then asks us for every tensor, so these events are tensor-level (API
//! `oomtrace_malloc`) and their stacks name the Python line that made the tensor. Memory comes
//! from the stream-ordered allocator (`cuMemAllocAsync` on the stream PyTorch passes, freed
//! on the same stream), whose pool keeps speed close to PyTorch's own caching.
//!
//! Rules:
//! - Inside CUDA-graph capture the call runs in relaxed capture mode (as PyTorch's own
//!   allocator does), so it never invalidates the user's capture.
//! - PyTorch does not check for NULL; a NULL from here is always explained by one line on
//!   stderr (out of memory, no driver), and size 0 returns NULL as PyTorch's allocator does.
//! - Where the stream-ordered allocator is not supported, `cuMemAlloc` / `cuMemFree` are used
//!   for the rest of the process (`cuMemFree` may free memory from either).
//! - The driver is called directly (real functions, never our wrappers), so one tensor is one
//!   event. Recording failures never change what the caller gets.
//! - The entry points load the driver themselves when nothing has yet (PyTorch may ask for
//!   its first tensor before anything in the process loaded `libcuda.so.1`); a NULL then
//!   means there is no driver to load.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::cuda::{CUcontext, CUdevice, CUdeviceptr, CUresult, CUstream, CUDA_SUCCESS};
use crate::driver_query::{current_device, driver_fn};
use crate::hooks::record;
use crate::symbols::load_libcuda;
use crate::{guard, log};

type AllocAsyncFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
type FreeAsyncFn = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
type AllocFn = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
type FreeFn = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
type ExchangeModeFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
type InitFn = unsafe extern "C" fn(u32) -> CUresult;
type PrimaryRetainFn = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult;
type PushFn = unsafe extern "C" fn(CUcontext) -> CUresult;
type PopFn = unsafe extern "C" fn(*mut CUcontext) -> CUresult;

const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
/// What we return through the driver's codes when the driver itself is missing.
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;

static ALLOC_ASYNC: AtomicUsize = AtomicUsize::new(0);
static FREE_ASYNC: AtomicUsize = AtomicUsize::new(0);
static ALLOC: AtomicUsize = AtomicUsize::new(0);
static FREE: AtomicUsize = AtomicUsize::new(0);
static EXCHANGE_MODE: AtomicUsize = AtomicUsize::new(0);
static INIT: AtomicUsize = AtomicUsize::new(0);
static PRIMARY_RETAIN: AtomicUsize = AtomicUsize::new(0);
static PUSH: AtomicUsize = AtomicUsize::new(0);
static POP: AtomicUsize = AtomicUsize::new(0);

/// Set once the stream-ordered allocator said "not supported".
static SYNC_ONLY: AtomicBool = AtomicBool::new(false);
/// NULL returns explained so far (the first few are each explained, then every 1000th).
static NULLS: AtomicU64 = AtomicU64::new(0);

macro_rules! driver {
    ($slot:ident, $name:literal, $ty:ty) => {{
        let p = driver_fn(&$slot, $name);
        // SAFETY: the driver's own function of that name, with the cuda.h signature.
        (p != 0).then(|| unsafe { std::mem::transmute::<usize, $ty>(p) })
    }};
}

/// Runs `f` with `device`'s primary context current (pushing it if another or none is),
/// in relaxed capture mode.
fn on_device<T>(device: c_int, f: impl FnOnce() -> T) -> T {
    let mut pushed = false;
    if current_device() != device as i16 {
        if let (Some(init), Some(retain), Some(push)) = (
            driver!(INIT, c"cuInit", InitFn),
            driver!(PRIMARY_RETAIN, c"cuDevicePrimaryCtxRetain", PrimaryRetainFn),
            driver!(PUSH, c"cuCtxPushCurrent_v2", PushFn),
        ) {
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: plain driver calls; the primary context stays retained (PyTorch keeps
            // it for the life of the process too).
            unsafe {
                if init(0) == CUDA_SUCCESS
                    && retain(&mut ctx, device) == CUDA_SUCCESS
                    && push(ctx) == CUDA_SUCCESS
                {
                    pushed = true;
                }
            }
        }
    }
    let exchange = driver!(
        EXCHANGE_MODE,
        c"cuThreadExchangeStreamCaptureMode",
        ExchangeModeFn
    );
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: swaps this thread's capture mode; restored below.
    let relaxed = exchange.is_some_and(|x| unsafe { x(&mut mode) } == CUDA_SUCCESS);
    let out = f();
    if relaxed {
        if let Some(x) = exchange {
            // SAFETY: puts back the mode we found.
            unsafe { x(&mut mode) };
        }
    }
    if pushed {
        if let Some(pop) = driver!(POP, c"cuCtxPopCurrent_v2", PopFn) {
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed above.
            unsafe { pop(&mut ctx) };
        }
    }
    out
}

fn allocate(size: usize, stream: CUstream) -> (CUresult, CUdeviceptr) {
    let mut p: CUdeviceptr = 0;
    if !SYNC_ONLY.load(Ordering::Relaxed) {
        if let Some(alloc) = driver!(ALLOC_ASYNC, c"cuMemAllocAsync", AllocAsyncFn) {
            // SAFETY: the driver's cuMemAllocAsync.
            let rc = unsafe { alloc(&mut p, size, stream) };
            if rc != CUDA_ERROR_NOT_SUPPORTED {
                return (rc, p);
            }
            SYNC_ONLY.store(true, Ordering::Relaxed);
            log::warn("oomtrace_malloc: this device has no stream-ordered allocator; using cuMemAlloc (slower, synchronizing)");
        }
    }
    match driver!(ALLOC, c"cuMemAlloc_v2", AllocFn) {
        // SAFETY: the driver's cuMemAlloc_v2.
        Some(alloc) => (unsafe { alloc(&mut p, size) }, p),
        None => (CUDA_ERROR_NOT_INITIALIZED, 0),
    }
}

fn explain_null(size: usize, device: c_int, rc: CUresult) {
    let n = NULLS.fetch_add(1, Ordering::Relaxed);
    if n >= 8 && !n.is_multiple_of(1000) {
        return;
    }
    let why = match rc {
        2 => "out of memory".to_string(),
        CUDA_ERROR_NOT_INITIALIZED => "no CUDA driver: libcuda.so.1 cannot be loaded".to_string(),
        rc => format!("CUDA error {rc}"),
    };
    log::warn(&format!(
        "oomtrace_malloc: {size} bytes on device {device} failed ({why}); returning NULL, which \
         PyTorch's pluggable allocator does not turn into an OutOfMemoryError: the tensor has \
         no memory and the program goes on (without --torch, PyTorch raises its own error){}",
        if n >= 8 { " [repeated]" } else { "" }
    ));
}

/// `void* alloc_fn(size_t size, int device, cudaStream_t stream)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oomtrace_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    load_libcuda();
    let recording = guard::enter();
    let (rc, p) = on_device(device, || {
        let (rc, p) = allocate(size, stream);
        if recording {
            guard::catch(|| record::tensor_alloc(rc, p, size as u64, device as i16, stream as u64));
        }
        (rc, p)
    });
    if recording {
        guard::leave();
    }
    if rc != CUDA_SUCCESS || p == 0 {
        explain_null(size, device, rc);
        return std::ptr::null_mut();
    }
    p as *mut c_void
}

/// `void free_fn(void* ptr, size_t size, int device, cudaStream_t stream)`: the size, device
/// and stream PyTorch recorded at allocation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oomtrace_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    if ptr.is_null() {
        return;
    }
    load_libcuda();
    let recording = guard::enter();
    if recording {
        guard::catch(|| record::tensor_free(ptr as u64, size as u64, device as i16, stream as u64));
    }
    let rc = on_device(device, || {
        let dptr = ptr as CUdeviceptr;
        if !SYNC_ONLY.load(Ordering::Relaxed) {
            if let Some(free) = driver!(FREE_ASYNC, c"cuMemFreeAsync", FreeAsyncFn) {
                // SAFETY: the driver's cuMemFreeAsync, on the stream the memory was made on.
                return unsafe { free(dptr, stream) };
            }
        }
        match driver!(FREE, c"cuMemFree_v2", FreeFn) {
            // SAFETY: the driver's cuMemFree_v2.
            Some(free) => unsafe { free(dptr) },
            None => CUDA_ERROR_NOT_INITIALIZED,
        }
    });
    if recording {
        if rc != CUDA_SUCCESS {
            guard::catch(|| record::tensor_free_failed(ptr as u64, rc));
        }
        guard::leave();
    }
}
