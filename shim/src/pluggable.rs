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
//! - The entry points do what the CUDA runtime does on a program's first call, since PyTorch
//!   may ask for its first tensor before anything in the process touched CUDA: they load
//!   `libcuda.so.1` if nothing has, call `cuInit(0)`, and, on a thread with no current
//!   context, make the device's primary context current and leave it so (as the runtime's
//!   implicit initialisation does). On a thread where another device's context is current,
//!   the device's primary context is pushed for the call and popped after it, so the
//!   program's current device never changes.
//! - A NULL names the driver call that failed and its `CUresult` (`cuInit failed:
//!   CUDA_ERROR_NO_DEVICE`); "no CUDA driver" only when `libcuda.so.1` cannot be loaded.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use oomtrace_proto::{Api, EventKind};

use crate::cuda::{
    CUcontext, CUdevice, CUdeviceptr, CUresult, CUstream, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    ERROR_SYMBOL_NOT_FOUND,
};
use crate::driver_query::{current_device, driver_fn};
use crate::recording;
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
type GetCurrentFn = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type SetCurrentFn = unsafe extern "C" fn(CUcontext) -> CUresult;
type ErrorNameFn = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;

const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

static ALLOC_ASYNC: AtomicUsize = AtomicUsize::new(0);
static FREE_ASYNC: AtomicUsize = AtomicUsize::new(0);
static ALLOC: AtomicUsize = AtomicUsize::new(0);
static FREE: AtomicUsize = AtomicUsize::new(0);
static EXCHANGE_MODE: AtomicUsize = AtomicUsize::new(0);
static INIT: AtomicUsize = AtomicUsize::new(0);
static PRIMARY_RETAIN: AtomicUsize = AtomicUsize::new(0);
static PUSH: AtomicUsize = AtomicUsize::new(0);
static POP: AtomicUsize = AtomicUsize::new(0);
static GET_CURRENT: AtomicUsize = AtomicUsize::new(0);
static SET_CURRENT: AtomicUsize = AtomicUsize::new(0);
static ERROR_NAME: AtomicUsize = AtomicUsize::new(0);

/// Set once `cuInit(0)` succeeded (it is never undone).
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// Devices whose primary context is kept here once retained (retained once, never released:
/// PyTorch keeps it for the life of the process too); others are retained on each use.
const KEPT_DEVICES: usize = 64;
static PRIMARY: [AtomicUsize; KEPT_DEVICES] = [const { AtomicUsize::new(0) }; KEPT_DEVICES];

/// Set once the stream-ordered allocator said "not supported".
static SYNC_ONLY: AtomicBool = AtomicBool::new(false);
/// NULL returns explained so far (the first few are each explained, then every 1000th).
static NULLS: AtomicU64 = AtomicU64::new(0);

/// Why an entry point could not do its work.
#[derive(Clone, Copy, Debug)]
enum Failed {
    /// `libcuda.so.1` cannot be loaded, or has no function of this name.
    NoDriver { function: &'static str },
    /// The driver's `call` returned `rc`.
    Driver { call: &'static str, rc: CUresult },
    /// The allocation succeeded with address 0 (no driver does this; said rather than hidden).
    NoAddress,
}

impl Failed {
    /// The code recorded in the trace: the driver's own, or "symbol not found" when there is
    /// no driver function to call.
    fn code(self) -> CUresult {
        match self {
            Failed::NoDriver { .. } => ERROR_SYMBOL_NOT_FOUND,
            Failed::Driver { rc, .. } => rc,
            Failed::NoAddress => CUDA_SUCCESS,
        }
    }
}

/// The driver's function `$name` (looked up once into `$slot`), or `None` if it has none.
macro_rules! driver {
    ($slot:ident, $name:literal, $ty:ty) => {{
        let p = driver_fn(&$slot, $name);
        // SAFETY: the driver's own function of that name, with the cuda.h signature.
        (p != 0).then(|| unsafe { std::mem::transmute::<usize, $ty>(p) })
    }};
}

/// A driver function that must exist, or `Failed::NoDriver` naming it.
macro_rules! required {
    ($slot:ident, $name:literal, $ty:ty) => {
        driver!($slot, $name, $ty).ok_or(Failed::NoDriver {
            function: strip_nul($name),
        })
    };
}

/// A C-string literal's text, for messages.
const fn strip_nul(name: &'static CStr) -> &'static str {
    match name.to_str() {
        Ok(s) => s,
        Err(_) => "?",
    }
}

/// `rc` of `call` as a `Result`.
fn check(call: &'static str, rc: CUresult) -> Result<(), Failed> {
    if rc == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Failed::Driver { call, rc })
    }
}

/// `cuInit(0)`, as the runtime calls it before its first driver call; once it succeeded, a
/// load.
fn initialize() -> Result<(), Failed> {
    if INITIALIZED.load(Ordering::Acquire) {
        return Ok(());
    }
    let init = required!(INIT, c"cuInit", InitFn)?;
    // SAFETY: the driver's cuInit; calling it again after a success does nothing.
    check("cuInit", unsafe { init(0) })?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// `device`'s primary context, retained (once per device for the first [`KEPT_DEVICES`]).
fn primary_context(device: c_int) -> Result<CUcontext, Failed> {
    let kept = usize::try_from(device).ok().and_then(|d| PRIMARY.get(d));
    if let Some(p) = kept.map(|k| k.load(Ordering::Acquire)).filter(|&p| p != 0) {
        return Ok(p as CUcontext);
    }
    let retain = required!(PRIMARY_RETAIN, c"cuDevicePrimaryCtxRetain", PrimaryRetainFn)?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the driver's cuDevicePrimaryCtxRetain writing one handle. The primary context
    // stays retained: PyTorch keeps it for the life of the process too. Two threads racing
    // here both retain, which only raises a count that is never released.
    check("cuDevicePrimaryCtxRetain", unsafe {
        retain(&mut ctx, device)
    })?;
    if let Some(k) = kept {
        k.store(ctx as usize, Ordering::Release);
    }
    Ok(ctx)
}

/// What [`make_current`] did, to be undone after the call.
enum Made {
    /// `device`'s context was current already, or was made current for good.
    Current,
    /// Pushed over another device's context: popped after the call.
    Pushed,
}

/// Makes `device`'s primary context current on this thread as the runtime would: nothing when
/// it is already; on a thread with no context, it becomes current and stays (the runtime's
/// implicit initialisation); over another device's context, it is pushed for the call.
fn make_current(device: c_int) -> Result<Made, Failed> {
    if i32::from(current_device()) == device {
        return Ok(Made::Current);
    }
    initialize()?;
    let ctx = primary_context(device)?;
    let get_current = required!(GET_CURRENT, c"cuCtxGetCurrent", GetCurrentFn)?;
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: the driver's cuCtxGetCurrent writing one handle.
    check("cuCtxGetCurrent", unsafe { get_current(&mut current) })?;
    if current.is_null() {
        let set = required!(SET_CURRENT, c"cuCtxSetCurrent", SetCurrentFn)?;
        // SAFETY: the driver's cuCtxSetCurrent on a retained primary context.
        check("cuCtxSetCurrent", unsafe { set(ctx) })?;
        return Ok(Made::Current);
    }
    let push = required!(PUSH, c"cuCtxPushCurrent_v2", PushFn)?;
    // SAFETY: the driver's cuCtxPushCurrent_v2 on a retained primary context; popped by
    // `on_device`.
    check("cuCtxPushCurrent", unsafe { push(ctx) })?;
    Ok(Made::Pushed)
}

/// Runs `f` with `device`'s primary context current (see [`make_current`]), in relaxed
/// capture mode.
fn on_device<T>(device: c_int, f: impl FnOnce() -> Result<T, Failed>) -> Result<T, Failed> {
    let made = make_current(device)?;
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
    if let Made::Pushed = made {
        if let Some(pop) = driver!(POP, c"cuCtxPopCurrent_v2", PopFn) {
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed by `make_current`.
            unsafe { pop(&mut ctx) };
        }
    }
    out
}

fn allocate(size: usize, stream: CUstream) -> Result<CUdeviceptr, Failed> {
    let mut p: CUdeviceptr = 0;
    if !SYNC_ONLY.load(Ordering::Relaxed) {
        if let Some(alloc) = driver!(ALLOC_ASYNC, c"cuMemAllocAsync", AllocAsyncFn) {
            // SAFETY: the driver's cuMemAllocAsync.
            let rc = unsafe { alloc(&mut p, size, stream) };
            if rc != CUDA_ERROR_NOT_SUPPORTED {
                return check("cuMemAllocAsync", rc).map(|()| p);
            }
            SYNC_ONLY.store(true, Ordering::Relaxed);
            log::warn("oomtrace_malloc: this device has no stream-ordered allocator; using cuMemAlloc (slower, synchronizing)");
        }
    }
    let alloc = required!(ALLOC, c"cuMemAlloc_v2", AllocFn)?;
    // SAFETY: the driver's cuMemAlloc_v2.
    check("cuMemAlloc", unsafe { alloc(&mut p, size) }).map(|()| p)
}

/// The driver's name for `rc` (`CUDA_ERROR_NO_DEVICE`), or its number when it has none.
fn error_name(rc: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    let named = driver!(ERROR_NAME, c"cuGetErrorName", ErrorNameFn)
        // SAFETY: the driver's cuGetErrorName writing a pointer to a static string.
        .is_some_and(|f| unsafe { f(rc, &mut name) } == CUDA_SUCCESS && !name.is_null());
    if named {
        // SAFETY: cuGetErrorName's string is NUL-terminated and static.
        let text = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        format!("{text}, error {rc}")
    } else {
        format!("CUDA error {rc}")
    }
}

/// Why, in the words of the message: what failed, with the driver's own code.
fn why(failed: Failed) -> String {
    match failed {
        Failed::Driver {
            rc: CUDA_ERROR_OUT_OF_MEMORY,
            call: "cuMemAllocAsync" | "cuMemAlloc",
        } => "out of memory".to_string(),
        Failed::Driver { call, rc } => format!("{call} failed: {}", error_name(rc)),
        Failed::NoDriver { function } if load_libcuda().is_null() => {
            format!("no CUDA driver: libcuda.so.1 cannot be loaded (looking for {function})")
        }
        Failed::NoDriver { function } => {
            format!("the CUDA driver libcuda.so.1 has no {function}")
        }
        Failed::NoAddress => "the driver returned success and address 0".to_string(),
    }
}

fn explain_null(size: usize, device: c_int, failed: Failed) {
    let n = NULLS.fetch_add(1, Ordering::Relaxed);
    if n >= 8 && !n.is_multiple_of(1000) {
        return;
    }
    log::warn(&format!(
        "oomtrace_malloc: {size} bytes on device {device} failed ({}); returning NULL, which \
         PyTorch's pluggable allocator does not turn into an OutOfMemoryError: the tensor has \
         no memory and the program goes on (without --torch, PyTorch raises its own error){}",
        why(failed),
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
    let allocated = on_device(device, || allocate(size, stream));
    if recording {
        // A failure to make the device current is recorded as the allocation's failure, with
        // the driver's code: the trace says why the tensor got no memory.
        let (rc, p) = match allocated {
            Ok(p) => (CUDA_SUCCESS, p),
            Err(f) => (f.code(), 0),
        };
        guard::catch(|| {
            recording::alloc(
                Api::oomtrace_malloc,
                device as i16,
                rc,
                p,
                size as u64,
                stream as u64,
                0,
            )
        });
        guard::leave();
    }
    match allocated {
        Ok(p) if p != 0 => p as *mut c_void,
        Ok(_) => {
            explain_null(size, device, Failed::NoAddress);
            std::ptr::null_mut()
        }
        Err(f) => {
            explain_null(size, device, f);
            std::ptr::null_mut()
        }
    }
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
        guard::catch(|| {
            recording::release(
                Api::oomtrace_free,
                EventKind::Free,
                device as i16,
                ptr as u64,
                size as u64,
                stream as u64,
            )
        });
    }
    let freed = on_device(device, || {
        let dptr = ptr as CUdeviceptr;
        if !SYNC_ONLY.load(Ordering::Relaxed) {
            if let Some(free) = driver!(FREE_ASYNC, c"cuMemFreeAsync", FreeAsyncFn) {
                // SAFETY: the driver's cuMemFreeAsync, on the stream the memory was made on.
                return check("cuMemFreeAsync", unsafe { free(dptr, stream) });
            }
        }
        let free = required!(FREE, c"cuMemFree_v2", FreeFn)?;
        // SAFETY: the driver's cuMemFree_v2.
        check("cuMemFree", unsafe { free(dptr) })
    });
    if recording {
        if let Err(f) = freed {
            guard::catch(|| recording::release_failed(Api::oomtrace_free, ptr as u64, f.code()));
        }
        guard::leave();
    }
}
