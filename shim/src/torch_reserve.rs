//! PyTorch's reserve as the CUDA hooks see it, when tensors are traced through the methods of
//! PyTorch's allocator (`torch_allocator.rs`) rather than its trace tracker, which would have
//! said which CUDA allocations are the allocator's segments.
//!
//! A device allocation (`cuMemAlloc`, or a `cuMemMap` of expandable segments) made while this
//! thread is inside one of the allocator's methods is a segment of its reserve; a free or
//! unmap of a segment's base address, from any thread (`empty_cache()`, the retry before an
//! OOM), gives it back. The hooks tell the PyTorch way in of each such call through its
//! watcher (`device_watch.rs`); the watcher asks here and records the segment events: this
//! module keeps state only and records nothing.
//!
//! Also kept: the last device allocation that failed inside the method (what PyTorch's OOM
//! asked the driver for), what PyTorch's out-of-memory observer said inside it (its own
//! refusal under `set_per_process_memory_fraction`, where the driver refuses nothing), and
//! the devices tensors were seen on, so that a free, which PyTorch
//! hands over as a bare pointer, is put on its device without a lookup in a one-device process.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use oomtrace_proto::DEVICE_UNKNOWN;

use crate::cuda::CUDA_ERROR_OUT_OF_MEMORY;
use crate::this_thread::{self, TorchMethod};

/// Set once the allocator's methods are hooked: until then (and in programs without PyTorch)
/// the hooks skip all of this with one load.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Segments by base address: (size, device).
static SEGMENTS: Mutex<BTreeMap<u64, (u64, i16)>> = Mutex::new(BTreeMap::new());

/// Devices tensors were allocated on (bit per device 0..63).
static DEVICES: AtomicU64 = AtomicU64::new(0);

/// A device allocation that failed inside an allocator method: its CUDA result, size, device;
/// or PyTorch's own out-of-memory, as its observer said it (`allocator_out_of_memory`; what it
/// said the allocator was allowed: `take_observed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    pub rc: i32,
    pub size: u64,
    pub device: i16,
}

/// This thread's place in the allocator's methods: in the hooks' own thread block, which the
/// methods' wrappers reach for their guard too (see `this_thread`).
type Method = TorchMethod;

fn method() -> *mut Method {
    // SAFETY: a field of this thread's own block (a raw pointer, no reference made here).
    unsafe { std::ptr::addr_of_mut!((*this_thread::get()).torch_method) }
}

impl Method {
    fn failed(&self) -> Option<Failed> {
        (self.failed_rc != 0).then_some(Failed {
            rc: self.failed_rc,
            size: self.failed_size,
            device: self.failed_device,
        })
    }

    fn set_failed(&mut self, f: Failed) {
        self.failed_rc = f.rc;
        self.failed_size = f.size;
        self.failed_device = f.device;
    }
}

pub fn activate() {
    ACTIVE.store(true, Ordering::Release);
}

/// In a fork child: PyTorch's CUDA is unusable there, and another thread of the parent may
/// have held the lock: nothing here is touched again.
pub fn deactivate_after_fork() {
    ACTIVE.store(false, Ordering::Release);
}

#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Entering an allocator method on this thread.
pub fn enter() {
    // SAFETY: this thread's own block, used on this thread only.
    let m = unsafe { &mut *method() };
    if m.depth == 0 {
        m.failed_rc = 0;
    }
    m.depth += 1;
}

/// Leaving it (returned or unwound); the failure seen inside, if any.
pub fn leave() -> Option<Failed> {
    // SAFETY: as in `enter`.
    let m = unsafe { &mut *method() };
    m.depth = m.depth.saturating_sub(1);
    m.failed()
}

/// True while this thread runs one of the allocator's methods (after they were hooked): what
/// a hook checks before asking anything for a segment (its device, say).
pub fn inside_method() -> bool {
    // SAFETY: as in `enter`.
    active() && unsafe { (*method()).depth != 0 }
}

/// A device allocation (or mapping) of `size` bytes at `ptr` on `device` that succeeded (`rc`
/// 0) or failed. True when it is a new segment of PyTorch's reserve (the caller records it).
#[inline]
pub fn device_alloc(rc: i32, ptr: u64, size: u64, device: i16) -> bool {
    // The load inline, the rest out of line: every cudaMalloc of a program without PyTorch
    // comes here, and a call that saves registers to return at once costs 20 instructions.
    active() && device_alloc_in_method(rc, ptr, size, device)
}

#[inline(never)]
fn device_alloc_in_method(rc: i32, ptr: u64, size: u64, device: i16) -> bool {
    if !inside_method() {
        return false;
    }
    if rc != 0 {
        // SAFETY: as in `enter`.
        unsafe { (*method()).set_failed(Failed { rc, size, device }) };
        return false;
    }
    if ptr == 0 {
        return false;
    }
    if let Ok(mut s) = SEGMENTS.lock() {
        s.insert(ptr, (size, device));
        true
    } else {
        false
    }
}

/// PyTorch's out-of-memory observer spoke on this thread (its allocator is about to raise
/// `OutOfMemoryError`): the method running here failed, whether or not the driver refused
/// anything (under `set_per_process_memory_fraction` the allocator refuses first). `allowed`
/// is what the observer said the allocator may reserve. False outside a method (PyTorch's
/// trace tracker records its own OOM entry then).
pub fn allocator_out_of_memory(device: i16, allowed: u64) -> bool {
    if !inside_method() {
        return false;
    }
    // SAFETY: as in `enter`.
    let m = unsafe { &mut *method() };
    m.observed = allowed;
    let size = m.failed().map_or(0, |f| f.size);
    m.set_failed(Failed {
        rc: CUDA_ERROR_OUT_OF_MEMORY,
        size,
        device,
    });
    true
}

/// What the observer said in the method that just unwound on this thread, cleared (0: it did
/// not speak).
pub fn take_observed() -> u64 {
    // SAFETY: as in `enter`.
    std::mem::take(unsafe { &mut (*method()).observed })
}

/// A device free (or unmap) of `ptr`, before the real call: the segment it gives back.
#[inline]
pub fn device_free(ptr: u64) -> Option<(u64, i16)> {
    if !active() || ptr == 0 {
        return None;
    }
    segment_removed(ptr)
}

#[inline(never)]
fn segment_removed(ptr: u64) -> Option<(u64, i16)> {
    SEGMENTS.lock().ok()?.remove(&ptr)
}

/// A tensor was allocated on `device`.
#[inline]
pub fn tensor_device(device: i16) {
    if (0..64).contains(&device) {
        let bit = 1u64 << device;
        if DEVICES.load(Ordering::Relaxed) & bit == 0 {
            DEVICES.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// The device of the tensor at `ptr`: the only device tensors were seen on, else the device
/// of the segment that holds it. The first answer inline (every tensor's free asks), the
/// lookup out of line: its frame would cost every free a score of instructions.
#[inline]
pub fn device_of(ptr: u64) -> i16 {
    let seen = DEVICES.load(Ordering::Relaxed);
    if seen.is_power_of_two() {
        return seen.trailing_zeros() as i16;
    }
    device_of_segment(ptr)
}

#[inline(never)]
fn device_of_segment(ptr: u64) -> i16 {
    if !active() {
        return DEVICE_UNKNOWN;
    }
    let Ok(s) = SEGMENTS.lock() else {
        return DEVICE_UNKNOWN;
    };
    match s.range(..=ptr).next_back() {
        Some((&base, &(size, device))) if ptr - base < size => device,
        _ => DEVICE_UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the state is process-wide.
    #[test]
    fn segments_are_taken_inside_methods_and_given_back_from_anywhere() {
        activate();
        assert!(
            !device_alloc(0, 0x1000, 0x100, 0),
            "outside a method: not a segment"
        );
        enter();
        assert!(device_alloc(0, 0x1000_0000, 2 << 20, 1));
        assert!(!device_alloc(2, 0, 20 << 20, 1));
        let failed = leave();
        assert_eq!(
            failed,
            Some(Failed {
                rc: 2,
                size: 20 << 20,
                device: 1,
            })
        );
        assert_eq!(take_observed(), 0, "the observer did not speak");
        assert!(
            !allocator_out_of_memory(1, 1 << 30),
            "outside a method: the tracker's"
        );
        enter();
        assert!(
            allocator_out_of_memory(1, 1 << 30),
            "a cap's refusal: no driver failure"
        );
        assert_eq!(
            leave(),
            Some(Failed {
                rc: 2,
                size: 0,
                device: 1,
            })
        );
        assert_eq!(take_observed(), 1 << 30);
        assert_eq!(take_observed(), 0, "taken once");
        enter();
        assert_eq!(leave(), None, "a new method starts with no failure");
        assert!(
            !device_alloc(0, 0x3000_0000, 1, 1),
            "after the method: not a segment"
        );
        tensor_device(1);
        assert_eq!(device_of(0x1000_0040), 1, "one device seen");
        tensor_device(3);
        assert_eq!(device_of(0x1000_0040), 1, "inside the segment");
        assert_eq!(device_of(0x2000_0000), DEVICE_UNKNOWN);
        assert_eq!(device_free(0x1000_0000), Some((2 << 20, 1)));
        assert_eq!(device_free(0x1000_0000), None);
    }
}
