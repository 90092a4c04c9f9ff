//! Questions oomtrace asks the driver itself (never through our wrappers): the current
//! device, and its free and total memory.

use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::cuda::{CUdevice, CuCtxGetDeviceFn, CuDeviceGetCountFn, CuMemGetInfoFn, CUDA_SUCCESS};
use crate::symbols::{is_ours, libcuda_handle, real_dlsym};

/// A driver function by name (the real one, never our wrapper), cached in `slot`; 0 if absent.
pub fn driver_fn(slot: &AtomicUsize, name: &CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    let h = libcuda_handle();
    let mut p = if h.is_null() {
        std::ptr::null_mut()
    } else {
        real_dlsym(h, name)
    };
    if p.is_null() {
        p = real_dlsym(libc::RTLD_NEXT, name);
    }
    if p.is_null() || is_ours(p as usize) {
        return 0;
    }
    slot.store(p as usize, Ordering::Release);
    p as usize
}

static CTX_GET_DEVICE: AtomicUsize = AtomicUsize::new(0);
static MEM_GET_INFO: AtomicUsize = AtomicUsize::new(0);
static DEVICE_GET_COUNT: AtomicUsize = AtomicUsize::new(0);

/// How many devices the process sees, once the driver said (0: not asked yet, or it could
/// not say). Fixed for the process's life: the driver reads `CUDA_VISIBLE_DEVICES` once, at
/// `cuInit`.
static DEVICE_COUNT: AtomicI32 = AtomicI32::new(0);

/// The device an allocation that just succeeded on the calling thread was made on. In a
/// process that sees one device, that device (ordinal 0) without asking: `cuCtxGetDevice` is
/// the dearest part of recording an allocation (a call into the driver, which takes its lock),
/// and a successful allocation proves a context, so the answer could only be 0. Otherwise,
/// [`current_device`].
#[inline]
pub fn device_of_success() -> i16 {
    let mut n = DEVICE_COUNT.load(Ordering::Relaxed);
    if n == 0 {
        n = device_count();
    }
    if n == 1 {
        0
    } else {
        current_device()
    }
}

/// Asks the driver how many devices there are and keeps the answer; 0 when it cannot say
/// (before `cuInit`: asked again next time).
#[cold]
fn device_count() -> i32 {
    let p = driver_fn(&DEVICE_GET_COUNT, c"cuDeviceGetCount");
    if p == 0 {
        return 0;
    }
    let mut n: i32 = 0;
    // SAFETY: p is the driver's cuDeviceGetCount, which writes one int.
    let rc = unsafe { std::mem::transmute::<usize, CuDeviceGetCountFn>(p)(&mut n) };
    if rc != CUDA_SUCCESS || n <= 0 {
        return 0;
    }
    DEVICE_COUNT.store(n, Ordering::Relaxed);
    n
}

/// The device of the calling thread's current context, or -1.
pub fn current_device() -> i16 {
    let p = driver_fn(&CTX_GET_DEVICE, c"cuCtxGetDevice");
    if p == 0 {
        return oomtrace_proto::DEVICE_UNKNOWN;
    }
    let mut dev: CUdevice = -1;
    // SAFETY: p is the driver's cuCtxGetDevice.
    let rc = unsafe { std::mem::transmute::<usize, CuCtxGetDeviceFn>(p)(&mut dev) };
    if rc == CUDA_SUCCESS && (0..i16::MAX as i32).contains(&dev) {
        dev as i16
    } else {
        oomtrace_proto::DEVICE_UNKNOWN
    }
}

/// (free, total) bytes of the current device, as the driver reports them.
pub fn mem_get_info() -> Option<(u64, u64)> {
    let p = driver_fn(&MEM_GET_INFO, c"cuMemGetInfo_v2");
    if p == 0 {
        return None;
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: p is the driver's cuMemGetInfo_v2.
    let rc = unsafe { std::mem::transmute::<usize, CuMemGetInfoFn>(p)(&mut free, &mut total) };
    (rc == CUDA_SUCCESS).then_some((free as u64, total as u64))
}
