//! Tensor-level tracing that keeps PyTorch's own caching allocator: an *allocator trace
//! tracker* attached to it (`oomtrace_torch_attach`, called by `oomtrace run --torch` and
//! `oomtrace.install()` right after PyTorch initialised CUDA).
//!
//! PyTorch's native caching allocator calls every attached tracker from `record_trace`, with
//! its mutex held, on the allocating thread (autograd threads included), for each tensor
//! allocation and free, each segment it takes from or gives back to CUDA, and each OOM. It
//! has no Python binding, so the tracker is attached through the C++ ABI:
//!
//! - `c10::cuda::CUDACachingAllocator::allocator` (exported by libc10_cuda) holds the current
//!   `CUDAAllocator*`; its first word is the vtable pointer.
//! - `attachAllocatorTraceTracker` is virtual. Its slot is found by scanning the exported
//!   vtable of `CUDAPluggableAllocator` (the same base class; exported by libtorch_cuda, by
//!   libtorch_python in 2.4) for the exported address of that class's override: no slot
//!   number is compiled in (it moved from 28 in 2.4 to 50 in 2.15).
//! - The argument is a `std::function<void(const TraceEntry&)>` passed by value; libstdc++'s
//!   layout (`_Any_data`, manager, invoker) is built here ([`StdFunction`]) around a stateless
//!   functor.
//!
//! Anything unexpected (a symbol missing, no slot or two, no allocator, PyTorch's allocator
//! swapped for a pluggable one) attaches nothing and returns why. The Python side attaches
//! only to the `native` backend (`torch.cuda.memory.get_allocator_backend()`), whose method
//! cannot throw. The tracker records and returns: it never calls into the allocator, never
//! takes the GIL, never unwinds.
//!
//! TraceEntry offsets are those of every release from 2.4 to 2.15 (`TraceEntry` moved from
//! `c10/cuda/CUDACachingAllocator.h` to `c10/core/CachingDeviceAllocator.h` on the way, its
//! layout did not); a test in the real-PyTorch tier compiles a program against the headers of
//! the release under test and compares. Which releases were checked, and the check of an
//! unknown release's headers before attaching, are in the Python package
//! (`python/oomtrace/__init__.py`: `_CHECKED_RELEASES`; `python/oomtrace/_abi.py`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::hooks::record;
use crate::{guard, log, symbols};

/// `TraceEntry::Action` values (torch 2.4 to 2.15).
pub mod action {
    pub const ALLOC: u32 = 0;
    pub const FREE_REQUESTED: u32 = 1;
    pub const FREE_COMPLETED: u32 = 2;
    pub const SEGMENT_ALLOC: u32 = 3;
    pub const SEGMENT_FREE: u32 = 4;
    pub const SEGMENT_MAP: u32 = 5;
    pub const SEGMENT_UNMAP: u32 = 6;
    pub const OOM: u32 = 8;
}

/// Byte offsets of the `TraceEntry` fields read here (torch 2.4 to 2.15, x86-64 libstdc++).
pub mod offset {
    pub const ACTION: usize = 0;
    pub const DEVICE: usize = 4;
    pub const ADDR: usize = 8;
    pub const STREAM: usize = 32;
    pub const SIZE: usize = 40;
}

/// libstdc++'s `_Any_data`: the functor's in-place storage.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AnyData(pub [usize; 2]);

type Manager = unsafe extern "C" fn(*mut AnyData, *const AnyData, c_int) -> bool;
type Invoker = unsafe extern "C" fn(*const AnyData, *const u8);

/// libstdc++'s `std::function<void(const TraceEntry&)>` (32 bytes): the functor storage,
/// then `_M_manager`, then `_M_invoker`. A non-null manager is what makes it non-empty.
#[repr(C)]
pub struct StdFunction {
    pub functor: AnyData,
    pub manager: Option<Manager>,
    pub invoker: Option<Invoker>,
}

/// `std::_Manager_operation`.
const GET_TYPE_INFO: c_int = 0;
const GET_FUNCTOR_PTR: c_int = 1;
const CLONE_FUNCTOR: c_int = 2;

/// `typeid(void)` from libstdc++ (what `target_type()` gets for our functor), or 0.
static TYPEINFO_VOID: AtomicUsize = AtomicUsize::new(0);

/// The manager of a stateless functor stored in place: cloning copies the two words,
/// destroying does nothing.
///
/// # Safety
/// `dest` and `src` point at `_Any_data` as libstdc++ passes them.
pub unsafe extern "C" fn manager(dest: *mut AnyData, src: *const AnyData, op: c_int) -> bool {
    match op {
        // SAFETY: dest is the caller's `_Any_data`; the first word receives a pointer.
        GET_TYPE_INFO => unsafe { (*dest).0[0] = TYPEINFO_VOID.load(Ordering::Relaxed) },
        // SAFETY: as above; the functor lives in place in `src`.
        GET_FUNCTOR_PTR => unsafe { (*dest).0[0] = src as usize },
        // SAFETY: both are `_Any_data`; the functor is two plain words.
        CLONE_FUNCTOR => unsafe { *dest = *src },
        _ => {}
    }
    false
}

/// Called by PyTorch for each trace entry.
///
/// # Safety
/// `entry` points at a live `c10::CachingDeviceAllocator::TraceEntry` of the pinned layout.
pub unsafe extern "C" fn invoker(_functor: *const AnyData, entry: *const u8) {
    if entry.is_null() {
        return;
    }
    // SAFETY: the entry outlives the call; fields at the offsets of the pinned layout.
    let e = unsafe { read_entry(entry) };
    on_entry(e);
}

/// The fields of one trace entry that oomtrace records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub action: u32,
    pub device: i8,
    pub addr: u64,
    pub stream: u64,
    pub size: u64,
}

/// # Safety
/// `p` points at a `TraceEntry` of the pinned layout.
pub unsafe fn read_entry(p: *const u8) -> Entry {
    // SAFETY: per the contract; unaligned reads cost nothing here and assume nothing.
    unsafe {
        Entry {
            action: (p.add(offset::ACTION) as *const u32).read_unaligned(),
            device: (p.add(offset::DEVICE) as *const i8).read_unaligned(),
            addr: (p.add(offset::ADDR) as *const u64).read_unaligned(),
            stream: (p.add(offset::STREAM) as *const u64).read_unaligned(),
            size: (p.add(offset::SIZE) as *const u64).read_unaligned(),
        }
    }
}

/// Records one entry, as every hook does: only when recording, once (not nested in another
/// hook), never unwinding into PyTorch.
fn on_entry(e: Entry) {
    if !guard::enter() {
        return;
    }
    guard::catch(|| record::torch_trace(e.action, e.device as i16, e.addr, e.size, e.stream));
    guard::leave();
}

/// The tracker PyTorch keeps (it copies it through `manager`).
pub fn tracker() -> StdFunction {
    StdFunction {
        functor: AnyData([0, 0]),
        manager: Some(manager),
        invoker: Some(invoker),
    }
}

const C10_CUDA: &CStr = c"libc10_cuda.so";
/// Where `CUDAPluggableAllocator`'s vtable and methods are exported: libtorch_cuda from torch
/// 2.5 on, libtorch_python in 2.4.
const PLUGGABLE_LIBRARIES: [&CStr; 2] = [c"libtorch_cuda.so", c"libtorch_python.so"];
const ALLOCATOR: &CStr = c"_ZN3c104cuda20CUDACachingAllocator9allocatorE";
const PLUGGABLE_VTABLE: &CStr =
    c"_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";
/// `CUDAPluggableAllocator::attachAllocatorTraceTracker(std::function<void(const
/// TraceEntry&)>)`, one name per namespace `TraceEntry` has had: only the parameter's type
/// differs, the method and its slot are the same.
const PLUGGABLE_ATTACH: [&CStr; 2] = [
    // torch 2.4 to 2.10: `c10::cuda::CUDACachingAllocator::TraceEntry`.
    c"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator27attachAllocatorTraceTrackerESt8functionIFvRKN3c104cuda20CUDACachingAllocator10TraceEntryEEE",
    // torch 2.11 on: `c10::CachingDeviceAllocator::TraceEntry`.
    c"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator27attachAllocatorTraceTrackerESt8functionIFvRKN3c1022CachingDeviceAllocator10TraceEntryEEE",
];

/// Where attaching stands: a second tracker would record every event twice, so only one
/// thread attaches, once.
static STATE: AtomicU8 = AtomicU8::new(IDLE);
const IDLE: u8 = 0;
const ATTACHING: u8 = 1;
const ATTACHED: u8 = 2;

/// An already loaded library (never loads one).
fn loaded(name: &CStr) -> *mut c_void {
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

/// Attaches the tracker once. Returns why not, or `None` (attached now or before).
fn attach() -> Option<&'static CStr> {
    match STATE.compare_exchange(IDLE, ATTACHING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(ATTACHED) => return None,
        Err(_) => return Some(c"another thread is attaching the tracker"),
    }
    let why = attach_now();
    STATE.store(
        if why.is_none() { ATTACHED } else { IDLE },
        Ordering::Release,
    );
    why
}

/// Attaches the tracker to PyTorch's current CUDA allocator. Returns why not, or `None`.
fn attach_now() -> Option<&'static CStr> {
    let c10 = loaded(C10_CUDA);
    if c10.is_null() {
        return Some(c"libc10_cuda.so is not loaded");
    }
    let global = symbols::real_dlsym(c10, ALLOCATOR) as *const AtomicUsize;
    // The vtable and the method from the same library: the method's address is what the
    // vtable holds.
    let (vtable, method) = PLUGGABLE_LIBRARIES
        .iter()
        .map(|name| loaded(name))
        .filter(|lib| !lib.is_null())
        .find_map(|lib| {
            let vtable = symbols::real_dlsym(lib, PLUGGABLE_VTABLE) as *const usize;
            let method = PLUGGABLE_ATTACH
                .iter()
                .map(|name| symbols::real_dlsym(lib, name) as usize)
                .find(|&p| p != 0)?;
            (!vtable.is_null()).then_some((vtable, method))
        })
        .unwrap_or((std::ptr::null(), 0));
    if global.is_null() || vtable.is_null() || method == 0 {
        return Some(c"this PyTorch does not export the allocator symbols oomtrace needs");
    }
    let Some(len) = symbol_size(vtable as *const c_void) else {
        return Some(c"the pluggable allocator's vtable has no size");
    };
    // SAFETY: vtable is the exported vtable object, len its size from the symbol table.
    let Some(slot) = (unsafe { slot_of(vtable, len, method) }) else {
        return Some(c"attachAllocatorTraceTracker is not in the allocator's vtable once");
    };
    // SAFETY: the exported std::atomic<CUDAAllocator*>; an atomic of one pointer is a word.
    let object = unsafe { (*global).load(Ordering::Acquire) };
    if object == 0 {
        return Some(c"PyTorch has no CUDA allocator yet");
    }
    // SAFETY: a live polymorphic C++ object: its first word is its vtable pointer.
    let vptr = unsafe { (object as *const *const usize).read() };
    // The pluggable allocator's vptr points past offset-to-top and typeinfo.
    // SAFETY: pointer arithmetic inside the vtable object.
    if vptr == unsafe { vtable.add(2) } {
        return Some(c"PyTorch allocates through a pluggable allocator");
    }
    // SAFETY: the object's vtable has the same base-class slots as the pluggable one.
    let target = unsafe { vptr.add(slot).read() };
    if target == 0 {
        return Some(c"the allocator's attachAllocatorTraceTracker slot is empty");
    }
    if let Some(p) = std::ptr::NonNull::new(symbols::real_dlsym(libc::RTLD_DEFAULT, c"_ZTIv")) {
        TYPEINFO_VOID.store(p.as_ptr() as usize, Ordering::Relaxed);
    }
    type AttachFn = unsafe extern "C" fn(usize, *mut StdFunction);
    // SAFETY: `void CUDAAllocator::attachAllocatorTraceTracker(std::function<...>)`: `this`,
    // then the by-value std::function as a pointer to the caller's temporary.
    let attach_fn = unsafe { std::mem::transmute::<usize, AttachFn>(target) };
    let mut f = tracker();
    // SAFETY: as above; the native allocator copies the function into each device's
    // allocator and does not throw.
    unsafe { attach_fn(object, &mut f) };
    // The caller destroys its temporary: our manager does nothing for that, so `f` just drops.
    log::info(&format!(
        "attached an allocator trace tracker to PyTorch (vtable slot {slot})"
    ));
    None
}

/// Attaches oomtrace's allocator trace tracker to PyTorch's CUDA caching allocator. Call it
/// after PyTorch initialised CUDA (`torch.cuda.is_initialized()`, or from
/// `torch.cuda._lazy_call` as `oomtrace.install()` does): the allocator object exists from
/// `import torch` on, but it hands a tracker only to the device allocators it already has, so
/// an earlier call attaches to nothing and no later call attaches again.
/// Returns NULL once attached (or already), otherwise why not (a static C string).
#[unsafe(no_mangle)]
pub extern "C" fn oomtrace_torch_attach() -> *const c_char {
    match guard::catch(attach) {
        Some(None) => std::ptr::null(),
        Some(Some(why)) => {
            log::info(&format!(
                "no allocator trace tracker: {}",
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
    fn std_function_is_libstdcxx_sized() {
        assert_eq!(std::mem::size_of::<StdFunction>(), 32);
        assert_eq!(std::mem::offset_of!(StdFunction, manager), 16);
        assert_eq!(std::mem::offset_of!(StdFunction, invoker), 24);
    }

    #[test]
    fn manager_clones_and_points_at_the_functor() {
        let src = AnyData([7, 9]);
        let mut dest = AnyData([0, 0]);
        // SAFETY: both are valid `_Any_data`.
        unsafe { manager(&mut dest, &src, CLONE_FUNCTOR) };
        assert_eq!(dest.0, [7, 9]);
        // SAFETY: as above.
        unsafe { manager(&mut dest, &src, GET_FUNCTOR_PTR) };
        assert_eq!(dest.0[0], &src as *const AnyData as usize);
        // Destroying (3) touches nothing.
        let mut keep = AnyData([1, 2]);
        // SAFETY: as above.
        unsafe { manager(&mut keep, &src, 3) };
        assert_eq!(keep.0, [1, 2]);
    }

    #[test]
    fn entry_fields_are_read_at_the_pinned_offsets() {
        let mut buf = [0u8; 64];
        buf[0..4].copy_from_slice(&action::SEGMENT_ALLOC.to_le_bytes());
        buf[4] = 3;
        buf[8..16].copy_from_slice(&0x7f00_0020_0000u64.to_le_bytes());
        buf[32..40].copy_from_slice(&0x55u64.to_le_bytes());
        buf[40..48].copy_from_slice(&(2u64 << 20).to_le_bytes());
        // SAFETY: 64 bytes cover every field read.
        let e = unsafe { read_entry(buf.as_ptr()) };
        assert_eq!(
            e,
            Entry {
                action: action::SEGMENT_ALLOC,
                device: 3,
                addr: 0x7f00_0020_0000,
                stream: 0x55,
                size: 2 << 20
            }
        );
    }

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
