//! The rules every hook obeys: forward-only when tracing is off, one event per allocation
//! (the outermost hook records), and no panic ever crosses into the host.
//!
//! A hook that fails inside oomtrace switches the whole process to forward-only mode and says
//! so once; the real CUDA call always runs exactly once, outside any `catch_unwind`, so that a
//! bug in recording can never repeat or skip an allocation.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::cache_line::CacheLine;
use crate::log;
use crate::once::OneShot;
use crate::this_thread;

/// Tracing has not started in this process (or was reset by fork).
pub const MODE_UNINIT: u8 = 0;
/// Hooks record events.
pub const MODE_RECORDING: u8 = 1;
/// Hooks only forward (disabled by config, after an internal error, or while exiting).
pub const MODE_FORWARD: u8 = 2;

/// Read by every hook, written a handful of times per process: on a line of its own
/// (`#[used]`: see `cache_line.rs`).
#[used]
pub static MODE: CacheLine<AtomicU8> = CacheLine(AtomicU8::new(MODE_UNINIT));

/// Called first by every recording hook. True: record this call (and `leave` afterwards).
/// The thread's depth (`this_thread`) is >0 while it is inside a recording hook: a
/// `cudaMalloc` that reaches `cuMemAlloc_v2` through our wrapper is then recorded once, by the
/// outer hook. The depth lives in a block without a destructor: usable during thread teardown.
#[inline]
pub fn enter() -> bool {
    let mode = MODE.load(Ordering::Acquire);
    if mode != MODE_RECORDING && (mode != MODE_UNINIT || !crate::start_tracing()) {
        return false;
    }
    take_depth()
}

/// Takes this thread's guard: true when it was free (the outermost recording hook).
#[inline(always)]
fn take_depth() -> bool {
    take_depth_at(this_thread::get())
}

#[inline(always)]
fn take_depth_at(t: *mut this_thread::HookThread) -> bool {
    // SAFETY: this thread's own block, read and written on this thread only.
    unsafe {
        if (*t).depth != 0 {
            return false;
        }
        (*t).depth = 1;
    }
    true
}

/// This thread's guard, taken: [`Held::leave`] gives it back without looking the thread's
/// block up again.
#[repr(transparent)]
pub struct Held(*mut this_thread::HookThread);

impl Held {
    /// The guard `enter` took on this thread.
    #[inline]
    pub fn taken() -> Held {
        Held(this_thread::get())
    }

    #[inline(always)]
    pub fn leave(self) {
        // SAFETY: this thread's own block (a `Held` is made on the thread that took the guard
        // and is not Send), read and written on this thread only.
        unsafe { (*self.0).depth = 0 };
    }
}

/// What a hook's fast path does with a call (`enter_fast`).
pub enum Entry {
    /// Record it: the outermost recording hook of this thread (the guard is now taken;
    /// `Held::leave` afterwards).
    Record(Held),
    /// Forward it untouched: nested inside a recording hook, or tracing is off.
    Forward,
    /// Tracing has not started: the general path (`enter`) starts it.
    Unknown,
}

/// [`enter`] without starting tracing: no call, so a hook can decide before it builds a frame.
#[inline(always)]
pub fn enter_fast() -> Entry {
    match MODE.load(Ordering::Acquire) {
        MODE_RECORDING => {
            let t = this_thread::get();
            if take_depth_at(t) {
                Entry::Record(Held(t))
            } else {
                Entry::Forward
            }
        }
        MODE_UNINIT => Entry::Unknown,
        _ => Entry::Forward,
    }
}

#[inline]
pub fn leave() {
    // SAFETY: as in `enter`.
    unsafe { (*this_thread::get()).depth = 0 };
}

/// True while the current thread is inside a recording hook (used by code that must not
/// record twice, such as the pluggable allocator entry points).
pub fn nested() -> bool {
    // SAFETY: as in `enter`.
    unsafe { (*this_thread::get()).depth != 0 }
}

/// Runs oomtrace code that must not unwind into the host. A panic disables tracing.
/// Always inlined: a `catch_unwind` costs nothing until something unwinds (a landing pad in
/// the caller), but a call of its own costs a frame on every hook.
#[inline(always)]
pub fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(payload) => {
            caught(payload);
            None
        }
    }
}

/// What [`catch`] does with a panic, out of line: inlined into every hook, the landing pad's
/// work (the mode switch, the line, the payload dropped) took three more saved registers in
/// each hook's frame (6 instructions a call).
#[cold]
#[inline(never)]
fn caught(payload: Box<dyn std::any::Any + Send>) {
    disable("internal error while recording; this process continues untraced");
    drop(payload);
}

static DISABLED_SAID: OneShot = OneShot::new();

/// Switches this process to forward-only mode and says why, once.
pub fn disable(why: &str) {
    MODE.store(MODE_FORWARD, Ordering::Release);
    log::warn_once(&DISABLED_SAID, why);
}

/// What a hook records around its real call. `new` only stores arguments (it cannot fail);
/// `before` and `after` may do anything, under `catch`.
pub trait Recorder {
    /// False for a recorder whose `after` does nothing when the call succeeded (a release
    /// records only a failure afterwards): its hook then enters no `catch` scope for it.
    const AFTER_ON_SUCCESS: bool = true;
    fn before(&mut self) {}
    fn after(&mut self, _rc: c_int) {}
}

/// Runs `r`'s `before` under `catch`. `hook` is the hook's own closure (`|r| r.before()`,
/// written in its wrapper): its type is the hook's alone, so every hook gets its own copy of
/// the `catch_unwind` around it, which the compiler inlines into the hook (the recorders'
/// methods are always inlined too). One copy shared by the hooks of a recorder type
/// (cudaMalloc, cudaMallocHost, ...) stayed a call, and the api was a value there, not a
/// constant: the memory class looked up twice, the event's tail word built at run time, a
/// second frame (347 -> 310 instructions a cudaMalloc+cudaFree pair, events only).
#[inline(always)]
pub fn before<R: Recorder>(r: &mut R, hook: impl FnOnce(&mut R)) {
    catch(|| hook(r));
}

/// Runs `r`'s `after` for result `rc` under `catch` (`hook`: as in [`before`]).
#[inline(always)]
pub fn after<R: Recorder>(r: &mut R, rc: std::ffi::c_int, hook: impl FnOnce(&mut R, c_int)) {
    if R::AFTER_ON_SUCCESS {
        catch(|| hook(r, rc));
    } else if rc != 0 {
        after_failure(r, rc, hook);
    }
}

/// [`after`] of a recorder that records only failures, out of line: the hook's frame then
/// holds only what its success needs.
#[cold]
#[inline(never)]
fn after_failure<R: Recorder>(r: &mut R, rc: c_int, hook: impl FnOnce(&mut R, c_int)) {
    catch(|| hook(r, rc));
}

/// Installed once at start: oomtrace's own copy of std must not print backtraces into the
/// host's stderr (a host with RUST_BACKTRACE=1 would otherwise get one per caught panic).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        log::info(&format!("internal panic: {info}"));
    }));
}
