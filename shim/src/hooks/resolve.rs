//! Handing out our wrappers where a program looks functions up at run time (`dlsym`,
//! `cuGetProcAddress[_v2]`, `cudaGetDriverEntryPoint*`).
//!
//! This lives inside the hook tree because the two depend on each other by nature: the table
//! lists these exported resolvers, and they consult the table. Plain lookup (glibc's `dlsym`,
//! the driver library) is `crate::symbols`, which knows nothing of hooks.
//!
//! Rules:
//! - Call the real resolver with the caller's exact arguments. Substitute only when the real
//!   answer is a function we wrap, identified by exact ABI: either it is the address libcuda
//!   exports under that exact name, or the driver gives the same address when asked for the
//!   candidate's own introduction version (so a newer `_v3` ABI is never mistaken for `_v2`).
//!   Never invent a pointer the real lookup did not give.
//! - `dlsym`: a naked trampoline that tail-jumps into glibc, so glibc still sees the original
//!   caller (RTLD_NEXT and RTLD_DEFAULT are resolved relative to the caller's return address).
//!   Never substitute for pseudo-handles; only for real handles and driver symbols that the
//!   real lookup found in a `libcuda.so*`.
//! - Runtime (`cuda*`) functions: several libcudart copies can be loaded at once (torch's
//!   `.so.13` next to another wheel's `.so.12`), and calls from both bind to our one export.
//!   Each call therefore carries its caller's address (a trampoline passes it) and goes to the
//!   function the caller's own dependency scope provides (`resolve_for_caller`). They are not
//!   substituted in `dlsym` answers: the caller asked a specific handle, and their driver
//!   calls reach our driver wrappers anyway.
//! - Our own lookups never go through our exported `dlsym`: they use the saved real one.
//! - `dlvsym` is deliberately not interposed. libcuda defines no symbol versions but has a
//!   VERSYM table (it references versioned glibc symbols), and glibc's `dlvsym` returns NULL
//!   for every versioned lookup in such an object (checked on glibc 2.36): no working program
//!   reaches a driver function through it, so interposing it would only add risk. (libcudart
//!   imports `dlvsym` for its libc lookups.)

use std::ffi::{c_char, c_int, c_void, CStr};

use super::{by_name, Family, Hook, HookId, HOOKS};
use crate::cuda::*;
use crate::guard;
use crate::log;
use crate::symbols::{init_real_dlsym, is_ours, libcuda_handle, provided_by, real_dlsym};

/// `dlsym`, exported. The filter decides in Rust; the jump keeps the caller's identity.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "endbr64",
        "push rdi",
        "push rsi",
        // Entry rsp is 8 mod 16; two pushes and 8 more make the call 16-byte aligned.
        "sub rsp, 8",
        "call {filter}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        // Not ours: glibc's dlsym runs as if called directly by our caller.
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        filter = sym dlsym_filter,
        real = sym crate::symbols::REAL_DLSYM,
    )
}

thread_local! {
    /// Set while the filter itself looks things up, so nested lookups pass straight through.
    static IN_FILTER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Returns our wrapper for `symbol` when `handle` is a real handle and the real lookup finds
/// a driver function we wrap; NULL means "let glibc answer".
extern "C" fn dlsym_filter(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Must work before anything else is initialised and must not allocate on the common path:
    // our own std calls dlsym (e.g. while spawning a thread) from inside our init.
    if init_real_dlsym() == 0 {
        return std::ptr::null_mut();
    }
    if handle.is_null() || handle == libc::RTLD_NEXT || symbol.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: symbol is a C string.
    let name = unsafe { CStr::from_ptr(symbol) };
    if !name.to_bytes().starts_with(b"cu") {
        return std::ptr::null_mut();
    }
    let nested = IN_FILTER.try_with(|f| f.replace(true)).unwrap_or(true);
    if nested {
        return std::ptr::null_mut();
    }
    let out = guard::catch(|| substitute_dlsym(handle, name)).unwrap_or(std::ptr::null_mut());
    let _ = IN_FILTER.try_with(|f| f.set(false));
    out
}

fn substitute_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let Some(hook) = by_name(name.to_bytes()) else {
        return std::ptr::null_mut();
    };
    if !matches!(hook.family, Family::Driver | Family::DriverResolver) {
        return std::ptr::null_mut();
    }
    let p = real_dlsym(handle, name);
    if p.is_null() || is_ours(p as usize) || !provided_by(p, b"libcuda.so") {
        return std::ptr::null_mut();
    }
    if hook.offer_real(p as usize) == 0 {
        return std::ptr::null_mut();
    }
    hook.wrapper as *mut c_void
}

/// Asks the real driver resolver for `name` at `version` with `flags`.
fn real_gpa(name: &CStr, version: c_int, flags: u64) -> usize {
    let mut out: *mut c_void = std::ptr::null_mut();
    if let Some(p) = HOOKS[HookId::cuGetProcAddress_v2 as usize].real() {
        let mut status: c_int = 0;
        // SAFETY: the slot holds the driver's cuGetProcAddress_v2 (CUDA 12 ABI).
        let f = unsafe { std::mem::transmute::<*const (), CuGetProcAddressV2Fn>(p) };
        // SAFETY: a valid C string and out-parameters that live across the call.
        let rc = unsafe { f(name.as_ptr(), &mut out, version, flags, &mut status) };
        if rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS {
            return 0;
        }
    } else if let Some(p) = HOOKS[HookId::cuGetProcAddress as usize].real() {
        // SAFETY: the slot holds the driver's cuGetProcAddress (CUDA 11.3 ABI).
        let f = unsafe { std::mem::transmute::<*const (), CuGetProcAddressFn>(p) };
        // SAFETY: a valid C string and an out-parameter that lives across the call.
        if unsafe { f(name.as_ptr(), &mut out, version, flags) } != CUDA_SUCCESS {
            return 0;
        }
    }
    out as usize
}

/// Which of our driver hooks the resolver answer `p` for `name` is, by exact ABI.
fn identify(p: usize, name: &CStr, version: c_int) -> Option<&'static Hook> {
    let base = name.to_str().ok()?;
    // Whether some hook of this name has an ABI old enough for `version`: an answer for an
    // older ABI (the 32-bit cuMemAlloc of CUDA 2.0, say) is not ours to wrap.
    let mut eligible = false;
    for hook in HOOKS.iter() {
        let Some(gpa) = hook.gpa else { continue };
        if gpa.base != base || (version as i64) < gpa.since as i64 {
            continue;
        }
        eligible = true;
        // The address libcuda exports under this exact name.
        let h = libcuda_handle();
        if !h.is_null() && real_dlsym(h, hook.name) as usize == p {
            return Some(hook);
        }
        // The address the driver gives for this exact ABI.
        let flags = if gpa.ptsz {
            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        } else {
            CU_GET_PROC_ADDRESS_LEGACY_STREAM
        };
        let since = std::ffi::CString::new(gpa.base).ok()?;
        if real_gpa(&since, gpa.since as c_int, flags) == p {
            return Some(hook);
        }
    }
    if eligible {
        // Not an ABI we know under this name (a newer _v3, or a driver whose answers differ
        // per version): forwarding it untouched is safe; its allocations are not seen.
        log::info(&format!(
            "could not identify the driver's answer for {base} at version {version}; left it unwrapped"
        ));
    }
    None
}

/// After a successful resolver call: replace `*pfn` with our wrapper of the same exact ABI.
fn substitute_answer(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the real resolver succeeded, so pfn was written; symbol is a C string.
    let p = unsafe { *pfn } as usize;
    if p == 0 || is_ours(p) {
        return;
    }
    // SAFETY: the caller passed `symbol` to the resolver as a C string (checked non-null).
    let name = unsafe { CStr::from_ptr(symbol) };
    if !name.to_bytes().starts_with(b"cu") {
        return;
    }
    if let Some(hook) = identify(p, name, version) {
        if hook.offer_real(p) != 0 {
            // SAFETY: pfn is the caller's out-parameter.
            unsafe { *pfn = hook.wrapper as *mut c_void };
        }
    }
}

fn real_of(id: HookId) -> Option<*const ()> {
    HOOKS[id as usize].real()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    let Some(p) = real_of(HookId::cuGetProcAddress) else {
        return HOOKS[HookId::cuGetProcAddress as usize].unresolved();
    };
    // SAFETY: the slot holds the driver's function of this exact ABI.
    let real = unsafe { std::mem::transmute::<*const (), CuGetProcAddressFn>(p) };
    // SAFETY: the one real call, with the caller's exact arguments.
    let rc = unsafe { real(symbol, pfn, cuda_version, flags) };
    if rc == CUDA_SUCCESS {
        guard::catch(|| substitute_answer(symbol, pfn, cuda_version));
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut c_int,
) -> CUresult {
    let Some(p) = real_of(HookId::cuGetProcAddress_v2) else {
        return HOOKS[HookId::cuGetProcAddress_v2 as usize].unresolved();
    };
    // SAFETY: as above.
    let real = unsafe { std::mem::transmute::<*const (), CuGetProcAddressV2Fn>(p) };
    // SAFETY: the one real call, with the caller's exact arguments.
    let rc = unsafe { real(symbol, pfn, cuda_version, flags, symbol_status) };
    // SAFETY: a non-null `symbol_status` is the caller's out-parameter, written by the call.
    let found = symbol_status.is_null() || unsafe { *symbol_status } == CU_GET_PROC_ADDRESS_SUCCESS;
    if rc == CUDA_SUCCESS && found {
        guard::catch(|| substitute_answer(symbol, pfn, cuda_version));
    }
    rc
}

// The runtime resolvers (CUDA 12 signatures), as caller-first trampolines like the other
// runtime wrappers (see hooks/mod.rs). CUDA 11.x had a 3-argument cudaGetDriverEntryPoint:
// the 4th register is then garbage, which is forwarded untouched and never read here. Their
// version is the runtime's own, unknown to us: `identify` then checks every candidate against
// the driver's answer for that candidate's exact ABI.
type EntryPointFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> c_int;
type EntryPointByVersionFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, u32, u64, *mut c_int) -> c_int;

unsafe fn entry_point(
    id: HookId,
    caller: usize,
    symbol: *const c_char,
    func_ptr: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let hook = &HOOKS[id as usize];
    let Some(p) = hook.real_for(caller) else {
        return hook.unresolved();
    };
    // SAFETY: the runtime's function of this exact ABI.
    let real = unsafe { std::mem::transmute::<*const (), EntryPointFn>(p) };
    // SAFETY: the one real call, with the caller's exact arguments.
    let rc = unsafe { real(symbol, func_ptr, flags, status) };
    if rc == 0 {
        guard::catch(|| substitute_answer(symbol, func_ptr, c_int::MAX));
    }
    rc
}

unsafe fn entry_point_by_version(
    id: HookId,
    caller: usize,
    symbol: *const c_char,
    func_ptr: *mut *mut c_void,
    version: u32,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let hook = &HOOKS[id as usize];
    let Some(p) = hook.real_for(caller) else {
        return hook.unresolved();
    };
    // SAFETY: as above.
    let real = unsafe { std::mem::transmute::<*const (), EntryPointByVersionFn>(p) };
    // SAFETY: the one real call, with the caller's exact arguments.
    let rc = unsafe { real(symbol, func_ptr, version, flags, status) };
    if rc == 0 {
        let v = c_int::try_from(version).unwrap_or(c_int::MAX);
        guard::catch(|| substitute_answer(symbol, func_ptr, v));
    }
    rc
}

/// Exports `$name` as a caller-first trampoline into `$imp`, which calls `$inner` with the
/// hook's id and the caller's address.
macro_rules! runtime_resolver {
    ($name:ident, $imp:ident => $inner:ident, ($($arg:ident: $ty:ty),*)) => {
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        #[allow(unused_variables)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            crate::hooks::caller_first_trampoline!($imp)
        }

        unsafe extern "C" fn $imp(caller: usize, $($arg: $ty),*) -> c_int {
            // SAFETY: the caller's arguments, passed on untouched with its return address.
            unsafe { $inner(HookId::$name, caller, $($arg),*) }
        }
    };
}

runtime_resolver!(cudaGetDriverEntryPoint, entry_point_imp => entry_point,
    (symbol: *const c_char, func_ptr: *mut *mut c_void, flags: u64, status: *mut c_int));
runtime_resolver!(cudaGetDriverEntryPoint_ptsz, entry_point_ptsz_imp => entry_point,
    (symbol: *const c_char, func_ptr: *mut *mut c_void, flags: u64, status: *mut c_int));
runtime_resolver!(cudaGetDriverEntryPointByVersion, entry_point_by_version_imp => entry_point_by_version,
    (symbol: *const c_char, func_ptr: *mut *mut c_void, version: u32, flags: u64, status: *mut c_int));
runtime_resolver!(cudaGetDriverEntryPointByVersion_ptsz, entry_point_by_version_ptsz_imp => entry_point_by_version,
    (symbol: *const c_char, func_ptr: *mut *mut c_void, version: u32, flags: u64, status: *mut c_int));
