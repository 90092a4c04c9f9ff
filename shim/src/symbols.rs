//! Plain symbol lookup, used by every part of the shim: glibc's own `dlsym` (never our
//! export), the driver library, a loaded libcudart found by name, and whether an address is
//! liboomtrace's own. Nothing here knows the hook table.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::once::OneShot;
use crate::{log, modules};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`. Read by the trampoline's tail jump; filled by `dlsym_filter` on the first
/// call (before the jump), so it is never 0 when jumped through.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

pub fn init_real_dlsym() -> usize {
    let cur = REAL_DLSYM.load(Ordering::Acquire);
    if cur != 0 {
        return cur;
    }
    // GLIBC_2.34 is the current version; 2.2.5 is x86-64's base version (older glibc). On
    // glibc >= 2.34 both name the same function. Never the public dlsym (it would be us) and
    // never _dl_sym (GLIBC_PRIVATE, gone from some builds).
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym is not interposed by oomtrace; all arguments are valid C strings.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// glibc's `dlsym`, for oomtrace's own lookups. `handle` is passed through, never read.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let p = init_real_dlsym();
    if p == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: p is glibc's dlsym.
    unsafe { std::mem::transmute::<usize, DlsymFn>(p)(handle, name.as_ptr()) }
}

/// True if `p` lies in an object whose file name starts with `prefix`.
pub(crate) fn provided_by(p: *mut c_void, prefix: &[u8]) -> bool {
    // SAFETY: Dl_info is pointers and integers; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads p; info is a valid out-parameter.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr's non-null file name is a NUL-terminated string owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    base.starts_with(prefix)
}

/// The path this library was loaded from (what `dladdr` says of one of its own functions).
pub fn own_path() -> Option<std::path::PathBuf> {
    std::fs::canonicalize(loaded_from()?).ok()
}

/// The file name the loader has for this library, as it was loaded (not canonicalized).
pub fn loaded_from() -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: Dl_info is pointers and nothing else; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address; info is a valid out-parameter.
    if unsafe { libc::dladdr(own_path as *const c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    Some(std::ffi::OsStr::from_bytes(name).into())
}

/// True for an address inside liboomtrace itself (one of our exported wrappers, our `dlsym`):
/// a lookup that lands there found us, not the real function.
pub fn is_ours(p: usize) -> bool {
    let own = own_base();
    own != 0 && p != 0 && base_of(p as *const c_void) == own
}

/// The load address of the object that contains `p`, 0 if none.
fn base_of(p: *const c_void) -> usize {
    // SAFETY: Dl_info is pointers and integers; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address (never dereferences it); info is a valid
    // out-parameter.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

static OWN_BASE: AtomicUsize = AtomicUsize::new(0);

/// liboomtrace's load address (cached; the library is never unloaded while its hooks run).
fn own_base() -> usize {
    let b = OWN_BASE.load(Ordering::Relaxed);
    if b != 0 {
        return b;
    }
    let b = base_of(own_base as *const c_void);
    OWN_BASE.store(b, Ordering::Relaxed);
    b
}

static LIBCUDA: AtomicUsize = AtomicUsize::new(0);

/// Set once [`load_libcuda`] has tried a real `dlopen`: on a machine without a driver the
/// library search is paid once, not on every call.
static LIBCUDA_LOAD_TRIED: OneShot = OneShot::new();

/// A handle to the loaded `libcuda.so.1`, or NULL if it is not loaded (the hooks never load
/// it: they only run once the program has). Programs that dlopen the driver RTLD_LOCAL (like
/// libcudart) hide it from RTLD_NEXT.
pub fn libcuda_handle() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    // SAFETY: plain dlopen with NOLOAD: only finds an already loaded driver.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        LIBCUDA.store(h as usize, Ordering::Release);
    }
    h
}

/// The driver, loaded by us if nothing in the process has loaded it yet; NULL if it cannot
/// be loaded (no driver installed). Only for oomtrace's own entry points (`oomtrace_malloc`,
/// `oomtrace_free`): PyTorch may call them before it has touched CUDA itself, and they are
/// the program's allocator, so they must reach the driver on their own. After the first call
/// this is one atomic load (loaded) or a no-load lookup (no driver), as `libcuda_handle`.
pub fn load_libcuda() -> *mut c_void {
    let h = libcuda_handle();
    if !h.is_null() || !LIBCUDA_LOAD_TRIED.first() {
        return h;
    }
    // SAFETY: dlopen of the driver by its soname, as libcudart loads it. RTLD_LOCAL keeps its
    // symbols out of the global scope (we reach it through the handle only), so symbol
    // binding in the program is the same as if it had loaded the driver itself. The handle
    // is never closed: function pointers taken from it stay valid.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if !h.is_null() {
        LIBCUDA.store(h as usize, Ordering::Release);
        log::info("loaded libcuda.so.1 for oomtrace_malloc (nothing had loaded the driver yet)");
    }
    h
}

/// A loaded libcudart found by file name, for runtime symbols that RTLD_NEXT cannot see
/// (a libcudart that is only a local dependency of a dlopened extension).
pub fn loaded_cudart_symbol(name: &CStr) -> *mut c_void {
    let mut found = std::ptr::null_mut();
    for path in modules::loaded_paths() {
        let base = path.rsplit('/').next().unwrap_or(&path);
        if !base.starts_with("libcudart.so") {
            continue;
        }
        let Ok(c) = std::ffi::CString::new(path.clone()) else {
            continue;
        };
        // SAFETY: NOLOAD: takes a reference to an already loaded object, which keeps the
        // pointer we return valid (the reference is deliberately never dropped).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            continue;
        }
        let p = real_dlsym(h, name);
        if !p.is_null() && !is_ours(p as usize) {
            found = p;
            break;
        }
    }
    found
}

/// Takes a reference on the object that contains `p` (never dropped).
pub(crate) fn pin_provider(p: *mut c_void) {
    // SAFETY: Dl_info is pointers and integers; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads p.
    if unsafe { libc::dladdr(p, &mut info) } != 0 && !info.dli_fname.is_null() {
        // SAFETY: NOLOAD on an object that is loaded.
        unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    }
}
