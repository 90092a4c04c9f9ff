//! PyTorch's C++ ABI as both ways into its caching allocator read it (`torch_allocator.rs`,
//! the allocator's own methods; `torch_tracker.rs`, its trace tracker): the allocator object,
//! and slot numbers of its virtual methods. (What PyTorch's trace entries hold, and libstdc++'s
//! `std::function`, are in `torch_layout.rs`.)
//!
//! - `c10::cuda::CUDACachingAllocator::allocator` (exported by libc10_cuda) holds the current
//!   `CUDAAllocator*`; its first word is the vtable pointer.
//! - A virtual method's slot is found by scanning the exported vtable of
//!   `CUDAPluggableAllocator` (the same base class; exported by libtorch_cuda, by
//!   libtorch_python in 2.4) for the exported address of that class's override: no slot
//!   number is compiled in (`attachAllocatorTraceTracker` moved from 28 in 2.4 to 50 in 2.15).
//!
//! Anything unexpected answers why, in words for the one line the user reads.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::symbols;

pub const C10_CUDA: &CStr = c"libc10_cuda.so";
/// Where `CUDAPluggableAllocator`'s vtable and methods are exported: libtorch_cuda from torch
/// 2.5 on, libtorch_python in 2.4.
const PLUGGABLE_LIBRARIES: [&CStr; 2] = [c"libtorch_cuda.so", c"libtorch_python.so"];
const ALLOCATOR: &CStr = c"_ZN3c104cuda20CUDACachingAllocator9allocatorE";
const PLUGGABLE_VTABLE: &CStr =
    c"_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";

/// An already loaded library (never loads one).
pub fn loaded(name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects.
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
}

/// The slot of `method` in `vtable` (an exported vtable symbol, so its size is known):
/// `Some(i)` when exactly one slot holds it.
///
/// # Safety
/// `vtable` is the start of a vtable object of `len` bytes.
pub unsafe fn slot_of(vtable: *const usize, len: usize, method: usize) -> Option<usize> {
    // Itanium ABI: offset-to-top and typeinfo come first, then the slots.
    let words = len / std::mem::size_of::<usize>();
    let mut found = None;
    for i in 2..words {
        // SAFETY: i < words, inside the object.
        if unsafe { vtable.add(i).read() } == method {
            if found.is_some() {
                return None;
            }
            found = Some(i - 2);
        }
    }
    found
}

/// dlfcn.h: `dladdr1` returns the symbol table entry.
const RTLD_DL_SYMENT: c_int = 1;

/// Size of the object the dynamic symbol at `p` names, from its symbol table entry.
fn symbol_size(p: *const c_void) -> Option<usize> {
    // SAFETY: Dl_info is pointers and integers; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *const libc::Elf64_Sym = std::ptr::null();
    // SAFETY: dladdr1 only reads p; both out-parameters are valid.
    let ok = unsafe {
        libc::dladdr1(
            p,
            &mut info,
            &mut sym as *mut *const libc::Elf64_Sym as *mut *mut c_void,
            RTLD_DL_SYMENT,
        )
    };
    // SAFETY: dladdr1 set sym to the loader's symbol entry when it returned non-zero.
    (ok != 0 && !sym.is_null() && std::ptr::eq(info.dli_saddr, p))
        .then(|| unsafe { (*sym).st_size } as usize)
}

/// `CUDAPluggableAllocator`'s exported vtable: where slot numbers are read.
pub struct Pluggable {
    lib: *mut c_void,
    vtable: *const usize,
    len: usize,
}

impl Pluggable {
    pub fn find() -> Result<Pluggable, &'static CStr> {
        let found = PLUGGABLE_LIBRARIES
            .iter()
            .map(|name| loaded(name))
            .filter(|lib| !lib.is_null())
            .find_map(|lib| {
                let vtable = symbols::real_dlsym(lib, PLUGGABLE_VTABLE) as *const usize;
                (!vtable.is_null()).then_some((lib, vtable))
            });
        let Some((lib, vtable)) = found else {
            return Err(c"this PyTorch does not export the allocator symbols oomtrace needs");
        };
        let Some(len) = symbol_size(vtable as *const c_void) else {
            return Err(c"the pluggable allocator's vtable has no size");
        };
        Ok(Pluggable { lib, vtable, len })
    }

    /// The slot of the method exported under the first of `names` found (one name per
    /// mangling a method has had), when exactly one slot holds it.
    pub fn slot(&self, names: &[&CStr]) -> Option<usize> {
        let method = names
            .iter()
            .map(|name| symbols::real_dlsym(self.lib, name) as usize)
            .find(|&p| p != 0)?;
        // SAFETY: the exported vtable object and its size from the symbol table.
        unsafe { slot_of(self.vtable, self.len, method) }
    }

    /// The address point of the pluggable allocator's vtable (what its objects' vptr holds).
    fn address_point(&self) -> *const usize {
        // SAFETY: past offset-to-top and typeinfo, inside the vtable object.
        unsafe { self.vtable.add(2) }
    }
}

/// PyTorch's current CUDA allocator: the object and its vtable pointer. Refused when there is
/// none yet, or when it is a pluggable allocator (swapped in by the program or by
/// `--torch=swap`).
pub fn current_allocator(pluggable: &Pluggable) -> Result<(usize, *const usize), &'static CStr> {
    let c10 = loaded(C10_CUDA);
    if c10.is_null() {
        return Err(c"libc10_cuda.so is not loaded");
    }
    let global = symbols::real_dlsym(c10, ALLOCATOR) as *const AtomicUsize;
    if global.is_null() {
        return Err(c"this PyTorch does not export the allocator symbols oomtrace needs");
    }
    // SAFETY: the exported std::atomic<CUDAAllocator*>; an atomic of one pointer is a word.
    let object = unsafe { (*global).load(Ordering::Acquire) };
    if object == 0 {
        return Err(c"PyTorch has no CUDA allocator yet");
    }
    // SAFETY: a live polymorphic C++ object: its first word is its vtable pointer.
    let vptr = unsafe { (object as *const *const usize).read() };
    if vptr == pluggable.address_point() {
        return Err(c"PyTorch allocates through a pluggable allocator");
    }
    Ok((object, vptr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_is_found_once_or_not_at_all() {
        let vt = [0usize, 0, 10, 20, 30, 40];
        // SAFETY: the array is the "vtable".
        unsafe {
            assert_eq!(slot_of(vt.as_ptr(), 48, 30), Some(2));
            assert_eq!(slot_of(vt.as_ptr(), 48, 99), None);
            // The header words are never slots.
            assert_eq!(slot_of(vt.as_ptr(), 48, 0), None);
        }
        let twice = [0usize, 0, 30, 30];
        // SAFETY: as above.
        assert_eq!(unsafe { slot_of(twice.as_ptr(), 32, 30) }, None);
    }
}
