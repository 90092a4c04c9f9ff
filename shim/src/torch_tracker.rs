//! Tensor-level tracing that keeps PyTorch's own caching allocator through an *allocator trace
//! tracker* attached to it: the way in when the allocator's methods cannot be hooked
//! (`torch_allocator.rs`, which decides), or when `OOMTRACE_TORCH_ENTRY=tracker` asks for it.
//!
//! PyTorch's native caching allocator calls every attached tracker from `record_trace`, with
//! its mutex held, on the allocating thread (autograd threads included), for each tensor
//! allocation and free, each segment it takes from or gives back to CUDA, and each OOM. It
//! has no Python binding, so the tracker is attached through the C++ ABI (`torch_abi.rs`):
//! `attachAllocatorTraceTracker` is virtual, its slot read from the pluggable allocator's
//! vtable. The argument is a `std::function<void(const TraceEntry&)>` passed by value;
//! libstdc++'s layout (`_Any_data`, manager, invoker) is built here ([`StdFunction`]) around a
//! stateless functor. Every entry costs PyTorch a `TraceEntry` (with a string) before the
//! tracker sees it, three per tensor: why it is no longer the first way in.
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

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use oomtrace_proto::{Api, EventKind};

use crate::cuda::CUDA_ERROR_OUT_OF_MEMORY;
use crate::recording::SegmentChange;
use crate::torch_abi::{current_allocator, Pluggable};
use crate::torch_layout::{action, offset, AnyData, StdFunction};
use crate::{guard, log, recording, symbols};

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
    guard::catch(|| record(e));
    guard::leave();
}

/// PyTorch's trace action, in the recording API's words: tensors (with their stacks),
/// segments (the allocator's reserve), and the allocator's own OOM. Frees that are only
/// requested are not recorded: the block stays the tensor's until the free completes (after
/// the streams that used it are done).
fn record(e: Entry) {
    let device = e.device as i16;
    match e.action {
        action::ALLOC => recording::alloc(
            Api::oomtrace_torch_alloc,
            device,
            0,
            e.addr,
            e.size,
            e.stream,
            0,
        ),
        action::FREE_COMPLETED => recording::release(
            Api::oomtrace_torch_free,
            EventKind::Free,
            device,
            e.addr,
            e.size,
            e.stream,
        ),
        action::SEGMENT_ALLOC | action::SEGMENT_MAP => {
            recording::segment(SegmentChange::Taken, device, e.addr, e.size, e.stream)
        }
        action::SEGMENT_FREE | action::SEGMENT_UNMAP => {
            recording::segment(SegmentChange::GivenBack, device, e.addr, e.size, e.stream)
        }
        // `addr` is the free bytes the driver reported; the tensor's size is what was asked.
        // What the allocator was allowed: not said (0).
        action::OOM => recording::alloc(
            Api::oomtrace_torch_alloc,
            device,
            CUDA_ERROR_OUT_OF_MEMORY,
            0,
            e.size,
            e.stream,
            0,
        ),
        _ => {}
    }
}

/// The tracker PyTorch keeps (it copies it through `manager`).
pub fn tracker() -> StdFunction {
    StdFunction {
        functor: AnyData([0, 0]),
        manager: Some(manager),
        invoker: Some(invoker),
    }
}

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

/// True once the tracker is attached (then the allocator's methods must not be hooked too:
/// every tensor would be recorded twice).
pub fn attached() -> bool {
    STATE.load(Ordering::Acquire) == ATTACHED
}

/// Attaches the tracker once. Returns why not, or `None` (attached now or before).
pub fn attach() -> Option<&'static CStr> {
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
    let pluggable = match Pluggable::find() {
        Ok(p) => p,
        Err(why) => return Some(why),
    };
    let Some(slot) = pluggable.slot(&PLUGGABLE_ATTACH) else {
        return Some(c"attachAllocatorTraceTracker is not in the allocator's vtable once");
    };
    let (object, vptr) = match current_allocator(&pluggable) {
        Ok(found) => found,
        Err(why) => return Some(why),
    };
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
}
