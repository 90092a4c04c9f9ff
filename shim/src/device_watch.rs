//! One watcher of device memory taken and given back, installed by a way in above the hooks
//! that needs to hear of the CUDA calls made under it: today the PyTorch way in
//! (`torch_allocator.rs`), for which device memory taken inside one of its allocator's methods
//! is a segment of PyTorch's reserve.
//!
//! Why a watcher: the hooks sit below every way in and know none of them, and the recording
//! API only records. The hooks tell this slot what they saw; whoever installed it decides what
//! that means and records it through the recording API itself. The hooks' order rule holds
//! for what the watcher records: it hears of memory taken after the real call and the
//! allocation's event, and of memory given back before both.
//!
//! Cost: a program without a watcher (no PyTorch, or PyTorch traced by its trace tracker)
//! pays one load per call.

use std::sync::atomic::{AtomicPtr, Ordering};

/// What a watcher is told. Each function runs inside the hook that saw the call (recording is
/// on, the guard held): it may record, and must not enter the guard again.
pub struct Watcher {
    /// Device memory handed out at `ptr` (`rc` 0) or refused (`rc` the driver's error, `ptr`
    /// 0), `size` bytes on `device`: after the real call and the allocation's event.
    pub taken: fn(rc: i32, ptr: u64, size: u64, device: i16),
    /// A virtual range of `size` bytes at `va` now backed by physical memory: after the real
    /// call and the mapping's event.
    pub mapped: fn(va: u64, size: u64),
    /// Memory at `ptr` about to be given back (freed or unmapped): before the real call and
    /// the release's event.
    pub giving_back: fn(ptr: u64),
}

/// The installed watcher; null: none. Only `&'static Watcher`s are stored.
static WATCHER: AtomicPtr<Watcher> = AtomicPtr::new(std::ptr::null_mut());

/// Installs `w` (a second install replaces the first).
pub fn install(w: &'static Watcher) {
    WATCHER.store(w as *const Watcher as *mut Watcher, Ordering::Release);
}

/// No watcher from now on (a fork child: the way in that installed it is unusable there).
pub fn remove() {
    WATCHER.store(std::ptr::null_mut(), Ordering::Release);
}

#[inline]
fn watcher() -> Option<&'static Watcher> {
    let w = WATCHER.load(Ordering::Acquire);
    // SAFETY: only null or a `&'static Watcher` is ever stored (`install`, `remove`).
    unsafe { w.as_ref() }
}

/// Device memory handed out or refused (see [`Watcher::taken`]).
#[inline]
pub fn taken(rc: i32, ptr: u64, size: u64, device: i16) {
    if let Some(w) = watcher() {
        (w.taken)(rc, ptr, size, device);
    }
}

/// A virtual range mapped (see [`Watcher::mapped`]).
#[inline]
pub fn mapped(va: u64, size: u64) {
    if let Some(w) = watcher() {
        (w.mapped)(va, size);
    }
}

/// Memory about to be given back (see [`Watcher::giving_back`]).
#[inline]
pub fn giving_back(ptr: u64) {
    if let Some(w) = watcher() {
        (w.giving_back)(ptr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    static TAKEN: AtomicU64 = AtomicU64::new(0);
    static GIVEN: AtomicU64 = AtomicU64::new(0);

    static W: Watcher = Watcher {
        taken: |_, ptr, _, _| TAKEN.store(ptr, Ordering::Relaxed),
        mapped: |va, _| TAKEN.store(va, Ordering::Relaxed),
        giving_back: |ptr| GIVEN.store(ptr, Ordering::Relaxed),
    };

    // One test: the slot is process-wide.
    #[test]
    fn only_an_installed_watcher_hears() {
        taken(0, 0x10, 1, 0);
        assert_eq!(TAKEN.load(Ordering::Relaxed), 0, "none installed");
        install(&W);
        taken(0, 0x20, 1, 0);
        assert_eq!(TAKEN.load(Ordering::Relaxed), 0x20);
        mapped(0x30, 1);
        assert_eq!(TAKEN.load(Ordering::Relaxed), 0x30);
        giving_back(0x40);
        assert_eq!(GIVEN.load(Ordering::Relaxed), 0x40);
        remove();
        giving_back(0x50);
        assert_eq!(GIVEN.load(Ordering::Relaxed), 0x40, "removed");
    }
}
