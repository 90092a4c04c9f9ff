//! Native call stacks: DWARF unwinding with cached rules (framehop), correct in code built
//! without frame pointers, interned per thread so each distinct stack crosses the socket once.
//!
//! Hot path (the same call path as a recent allocation on this thread): read pc/sp/bp; a small
//! per-thread table keyed by (sp, bp) remembers the stack slots the last unwind read its
//! return addresses from; if every slot still holds the same return address, the stack is the
//! same and its id is reused (a few dozen loads, no DWARF at all). Otherwise: unwind with
//! framehop (DWARF rules cached per address), hash the return addresses, look the hash up in
//! the per-thread table of stacks already sent -> StackId.
//! Cold path (a new stack): make sure every module in it is known to the unwinder and to the
//! collector (its unwind tables copied, a `ModuleDef` sent), unwind again if that changed
//! anything, then send a `StackDef` and remember it.
//!
//! Symbolization never happens here: the collector and CLI map addresses to lines.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Module, UnwindRegsNative,
    Unwinder,
};
use oomtrace_proto::StackId;

use crate::cache_line::CacheLine;
use crate::config::MAX_STACK_DEPTH;
use crate::log;
use crate::modules::{self, LoadCounts, LoadedModule};
use crate::once::OneShot;
use crate::python::{self, CodeRegistry, Interpreter, ThreadCodes, Walked, MAX_PY_FRAMES};
use crate::this_thread::{thread_block, Zeroed};
use crate::transport::{Msg, Outbox};

type NativeUnwinder = framehop::UnwinderNative<Vec<u8>, MayAllocateDuringUnwind>;
type NativeCache = framehop::CacheNative<MayAllocateDuringUnwind>;

/// Slots of the per-thread table of stacks already sent (direct-mapped, power of two).
/// 4096 x 16 bytes = 64 KiB per thread; a training loop has far fewer distinct stacks.
const INTERN_SLOTS: usize = 4096;

/// Recent stacks remembered with their slots (round robin). A training step allocates from a
/// handful of call paths; 8 covers them without making a miss expensive to scan.
const VERIFIED_ENTRIES: usize = 8;

/// Frames unwound at most, ours included (a few hook frames precede the caller's).
const RAW_DEPTH: usize = MAX_STACK_DEPTH + 16;

/// Words of a `Verified`'s arrays: its frames, and room to pad the slots after the first to
/// whole groups of four (`remember`).
const CHECK_WORDS: usize = 1 + (RAW_DEPTH - 1).div_ceil(4) * 4;

/// What a padding slot points at, and holds: the check reads it like a stack slot.
static CHECK_PAD: u64 = 0;

/// A stack as unwound from (sp, bp) at the capture point: every return address and the stack
/// slot it was read from (on x86-64 always CFA - 8).
struct Verified {
    sp: u64,
    bp: u64,
    n: usize,
    raw: [u64; CHECK_WORDS],
    slots: [u64; CHECK_WORDS],
    /// Groups of four slots the check reads (slots 1.. padded with `CHECK_PAD`); set by
    /// `remember`. A `u32`: four times it cannot overflow, so the check masks nothing.
    quads: u32,
    id: u32,
}

impl Verified {
    /// Nothing unwound yet, boxed: 2 KiB that a capture's frame need not hold.
    fn empty(sp: u64, bp: u64) -> Box<Verified> {
        Box::new(Verified {
            sp,
            bp,
            n: 0,
            raw: [0; CHECK_WORDS],
            slots: [0; CHECK_WORDS],
            quads: 0,
            id: 0,
        })
    }
}

/// What unwinding threads read; replaced as a whole when modules change.
pub struct Snapshot {
    unwinder: NativeUnwinder,
    /// Ranges of modules whose tables are in `unwinder` and whose `ModuleDef` was sent.
    active: Vec<(u64, u64)>,
    /// Ranges of every module known at the last enumeration.
    known: Vec<(u64, u64)>,
    counts: LoadCounts,
    /// Range of liboomtrace itself: its frames are dropped from stacks.
    own: (u64, u64),
}

fn in_ranges(ranges: &[(u64, u64)], a: u64) -> bool {
    // Sorted by start; few dozen entries: binary search on start.
    let i = ranges.partition_point(|r| r.0 <= a);
    i > 0 && a < ranges[i - 1].1
}

struct Entry {
    module: LoadedModule,
    /// Set once the module is active (tables loaded, ModuleDef sent).
    id: Option<u32>,
}

struct Registry {
    entries: Vec<Entry>,
    counts: LoadCounts,
    unwinder: NativeUnwinder,
    next_module_id: u32,
    own: (u64, u64),
}

/// Per-process stack state (built on the first capture, rebuilt after fork).
pub struct Stacks {
    registry: Mutex<Registry>,
    snapshot: Mutex<Arc<Snapshot>>,
    snapshot_gen: AtomicU64,
    /// Bumped when an active module goes away: stacks interned before may now be ambiguous.
    intern_gen: AtomicU64,
    next_stack_id: AtomicU32,
    /// Python code objects announced so far.
    codes: CodeRegistry,
}

impl Registry {
    fn snapshot(&self) -> Snapshot {
        let mut active: Vec<(u64, u64)> = self
            .entries
            .iter()
            .filter(|e| e.id.is_some())
            .map(|e| (e.module.start, e.module.end))
            .collect();
        active.sort_unstable();
        let mut known: Vec<(u64, u64)> = self
            .entries
            .iter()
            .map(|e| (e.module.start, e.module.end))
            .collect();
        known.sort_unstable();
        Snapshot {
            unwinder: self.unwinder.clone(),
            active,
            known,
            counts: self.counts,
            own: self.own,
        }
    }

    /// Loads the unwind tables of entry `i` and announces it to the collector.
    fn activate(&mut self, ob: &Outbox, i: usize) {
        let id = self.next_module_id;
        self.next_module_id += 1;
        let e = &mut self.entries[i];
        e.id = Some(id);
        let m = &e.module;
        let mut info = ExplicitModuleSectionInfo::<Vec<u8>> {
            base_svma: 0,
            ..Default::default()
        };
        if let Some((lo, hi)) = m.text.first().copied() {
            info.text_svma = Some(lo - m.bias..hi - m.bias);
        }
        if let Some(t) = modules::unwind_tables(m) {
            info.eh_frame_hdr_svma = Some(
                t.eh_frame_hdr_avma - m.bias
                    ..t.eh_frame_hdr_avma - m.bias + t.eh_frame_hdr.len() as u64,
            );
            info.eh_frame_svma =
                Some(t.eh_frame_avma - m.bias..t.eh_frame_avma - m.bias + t.eh_frame.len() as u64);
            info.eh_frame_hdr = Some(t.eh_frame_hdr);
            info.eh_frame = Some(t.eh_frame);
        }
        self.unwinder
            .add_module(Module::new(m.path.clone(), m.start..m.end, m.bias, info));
        ob.send_reliable(Msg::Module(Box::new(m.def(id))));
    }

    /// Re-reads the loaded modules; returns true if an active module went away.
    fn rescan(&mut self, ob: &Outbox) -> bool {
        let (mods, counts) = modules::enumerate();
        let mut removed_active = false;
        let mut kept = Vec::with_capacity(mods.len());
        for old in self.entries.drain(..) {
            if mods
                .iter()
                .any(|m| m.start == old.module.start && m.path == old.module.path)
            {
                kept.push(old);
            } else if let Some(id) = old.id {
                self.unwinder.remove_module(old.module.start);
                ob.send_reliable(Msg::ModuleGone(id));
                removed_active = true;
            }
        }
        for m in mods {
            if !kept
                .iter()
                .any(|e| e.module.start == m.start && e.module.path == m.path)
            {
                kept.push(Entry {
                    module: m,
                    id: None,
                });
            }
        }
        self.entries = kept;
        self.counts = counts;
        removed_active
    }
}

impl Stacks {
    fn new(ob: &Outbox) -> Stacks {
        let (mods, counts) = modules::enumerate();
        let here = capture as *const () as u64;
        let own = mods
            .iter()
            .find(|m| m.contains(here))
            .map(|m| (m.start, m.end))
            .unwrap_or((0, 0));
        let mut reg = Registry {
            entries: mods
                .into_iter()
                .map(|module| Entry { module, id: None })
                .collect(),
            counts,
            unwinder: NativeUnwinder::new(),
            next_module_id: 1,
            own,
        };
        // Our own tables are needed to unwind out of the hook's frames.
        if let Some(i) = reg.entries.iter().position(|e| e.module.contains(here)) {
            reg.activate(ob, i);
        }
        let snap = Arc::new(reg.snapshot());
        Stacks {
            registry: Mutex::new(reg),
            snapshot: Mutex::new(snap),
            snapshot_gen: AtomicU64::new(1),
            intern_gen: AtomicU64::new(1),
            next_stack_id: AtomicU32::new(1),
            codes: CodeRegistry::default(),
        }
    }

    fn current(&self) -> (u64, Arc<Snapshot>) {
        let snap = match self.snapshot.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        (self.snapshot_gen.load(Ordering::Acquire), snap)
    }

    /// Rescans the loaded modules if the loader's counters moved since the last scan (a
    /// dlclose, perhaps followed by another library at the same address: its frames would
    /// otherwise fall inside a stale range and be unwound and attributed with the old tables).
    fn refresh_if_loader_changed(&self, ob: &Outbox) {
        let Ok(mut reg) = self.registry.lock() else {
            return;
        };
        if modules::load_counts() == reg.counts {
            return;
        }
        if reg.rescan(ob) {
            self.intern_gen.fetch_add(1, Ordering::AcqRel);
        }
        let snap = Arc::new(reg.snapshot());
        if let Ok(mut g) = self.snapshot.lock() {
            *g = snap;
        }
        self.snapshot_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// Makes every frame's module active (rescanning if the loader changed). Returns true if
    /// the snapshot changed, so the caller should unwind again.
    fn cover(&self, ob: &Outbox, frames: &[u64]) -> bool {
        let Ok(mut reg) = self.registry.lock() else {
            return false;
        };
        let mut changed = false;
        let needs_rescan = frames.iter().any(|&f| {
            let a = f.wrapping_sub(1);
            !reg.entries.iter().any(|e| e.module.contains(a))
        }) && modules::load_counts() != reg.counts;
        if needs_rescan {
            if reg.rescan(ob) {
                self.intern_gen.fetch_add(1, Ordering::AcqRel);
            }
            changed = true;
        }
        for &f in frames {
            let a = f.wrapping_sub(1);
            if let Some(i) = reg
                .entries
                .iter()
                .position(|e| e.id.is_none() && e.module.contains(a))
            {
                reg.activate(ob, i);
                changed = true;
            }
        }
        if changed {
            let snap = Arc::new(reg.snapshot());
            if let Ok(mut g) = self.snapshot.lock() {
                *g = snap;
            }
            self.snapshot_gen.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }
}

impl Snapshot {
    /// True if no frame needs a module that is known but not yet active, and no frame lies
    /// outside every known module while the loader's counters say something changed.
    fn covers(&self, frames: &[u64]) -> bool {
        let mut unknown = false;
        for &f in frames {
            let a = f.wrapping_sub(1);
            if in_ranges(&self.active, a) {
                continue;
            }
            if in_ranges(&self.known, a) {
                return false;
            }
            unknown = true;
        }
        !unknown || modules::load_counts() == self.counts
    }
}

struct ThreadStacks {
    /// The `Capturer` this belongs to; a new one (after fork) means start over.
    owner: usize,
    snapshot_gen: u64,
    snapshot: Arc<Snapshot>,
    cache: Box<NativeCache>,
    intern_gen: u64,
    interned: Box<[(u64, u32)]>,
    /// Fixed size, so that the hot path indexes it without a length check; an entry with id
    /// 0 is empty.
    verified: Box<[Verified; VERIFIED_ENTRIES]>,
    /// (sp, bp) of each entry of `verified`, side by side: scanning the entries themselves
    /// (2 KiB apart) cost a cache miss each.
    verified_keys: [(u64, u64); VERIFIED_ENTRIES],
    next_verified: usize,
    /// The entry of `verified` that hit last, and for each entry the one found next after
    /// it the last time (`verified_hit`).
    last_hit: usize,
    follows: [u8; VERIFIED_ENTRIES],
    stack_lo: u64,
    stack_hi: u64,
    /// The interpreter's module while its Python frames are read: the native unwind ends at
    /// its first frame, since the Python frames that follow say more, for less (libtorch's
    /// and CPython's evaluation frames are most of a PyTorch stack's depth). (0, 0) if none.
    stop: (u64, u64),
    /// What `stop` was found for: the snapshot generation and whether Python frames are read.
    stop_for: (u64, bool),
    py: PyThread,
}

/// Per-thread Python state: the interpreter (looked for again when the modules change),
/// code ids, and the table of (native stack, Python frames) combinations already sent.
struct PyThread {
    interpreter: Option<&'static Interpreter>,
    looked_at_gen: u64,
    /// The snapshot generation `interpreter` and `stop` were last settled for (`u64::MAX`:
    /// not yet, or Python frames only with no interpreter found): a capture with the same
    /// one has nothing to look at again but whether the frames can still be read.
    settled_gen: u64,
    codes: ThreadCodes,
    interned: Box<[(u64, u32)]>,
    /// The last few combinations met, checked before `interned`: a loop allocates from a
    /// few lines, and a slot of the 64 KiB table is often a cache miss (measured ~12 ns).
    recent: [(u64, u32); RECENT],
    next_recent: usize,
    /// (native id, combined id) of the latest capture: when the walk finds the same frames
    /// as last time and the native stack is the same, the answer is too (no hashing).
    /// `NO_LAST` when there is none: no native id is `u32::MAX` (ids count up from 1), so
    /// one compare of the native id decides.
    last: (u32, u32),
    frames: Box<[u64; MAX_PY_FRAMES]>,
}

const RECENT: usize = 4;

/// Where this thread's `ThreadStacks` is (a thread block: reached without `__tls_get_addr`,
/// see `this_thread`), and whether a capture is using it (a signal handler that captures
/// meanwhile gets no stack).
#[repr(C)]
struct ThreadSlot {
    /// A `Box<ThreadStacks>` made by `capture_with` and owned through `OWNER`; null: none.
    stacks: *mut ThreadStacks,
    busy: bool,
    /// Whether `stack` was asked (a thread's first capture asks, before anything else).
    bounds_asked: bool,
    /// This thread's stack, [low, high); (0, 0) when pthread could not say.
    stack: (u64, u64),
    /// Where a capture's stack pointer may be, [floor, ceiling): `low` +
    /// [`CAPTURE_STACK_NEEDED`] to `high`, anywhere when pthread could not say, nowhere
    /// before the bounds were asked. One range, so the hot path compares twice; anything
    /// outside it goes to [`outside_capture_range`].
    floor: u64,
    ceiling: u64,
}

// SAFETY: a null pointer, `false`s and zeros.
unsafe impl Zeroed for ThreadSlot {}

/// What a capture may use of a thread's stack at most, measured from its own frame (the
/// thread's first capture, a miss's unwind, a module scan; 2026-12-05: 10.7 KiB in the
/// release build, 67 KiB in the debug build, whose frames hold what the release build
/// builds in place). With less left below it, the allocation is recorded without its call
/// site, and one line says so: a thread with glibc's least stack (16 KiB) crashed in the
/// capture before.
const CAPTURE_STACK_NEEDED: u64 = if cfg!(debug_assertions) {
    128 * 1024
} else {
    24 * 1024
};

static SMALL_STACK_SAID: OneShot = OneShot::new();

thread_block! {
    /// This thread's stack tables.
    fn thread_slot() -> ThreadSlot;
}

thread_local! {
    /// Frees this thread's `ThreadStacks` when the thread ends (a thread block runs nothing).
    static OWNER: SlotOwner = const { SlotOwner };
}

struct SlotOwner;

impl Drop for SlotOwner {
    fn drop(&mut self) {
        let slot = thread_slot();
        // SAFETY: this thread's own block; the pointer is null or a `Box` made by
        // `capture_with` on this thread and not freed since (freeing clears it). A capture
        // cannot be running: this destructor runs on this thread outside any hook.
        unsafe {
            let stacks = std::mem::replace(&mut (*slot).stacks, std::ptr::null_mut());
            if !stacks.is_null() {
                drop(Box::from_raw(stacks));
            }
        }
    }
}

/// Marks the thread's slot in use until dropped (also when a capture unwinds).
struct Busy(*mut ThreadSlot);

impl Drop for Busy {
    fn drop(&mut self) {
        // SAFETY: this thread's own block.
        unsafe { (*self.0).busy = false };
    }
}

fn stack_bounds() -> (u64, u64) {
    // SAFETY: standard pthread attribute dance on the calling thread.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok {
            (addr as u64, addr as u64 + size as u64)
        } else {
            (0, 0)
        }
    }
}

/// A table of recent stacks with every entry empty, built on the heap (18 KiB: a thread's
/// first capture may run on a small stack).
fn empty_verified_table() -> Box<[Verified; VERIFIED_ENTRIES]> {
    let entries: Box<[Verified]> = (0..VERIFIED_ENTRIES)
        .map(|_| *Verified::empty(0, 0))
        .collect();
    match entries.try_into() {
        Ok(table) => table,
        Err(_) => unreachable!("VERIFIED_ENTRIES entries were made"),
    }
}

impl ThreadStacks {
    fn new(cap: &Capturer) -> ThreadStacks {
        let (snapshot_gen, snapshot) = cap.stacks().current();
        ThreadStacks::with(
            cap as *const Capturer as usize,
            (snapshot_gen, snapshot),
            cap.stacks().intern_gen.load(Ordering::Acquire),
        )
    }

    /// This thread's tables for `owner`, with the module snapshot and interning generation
    /// it starts from.
    fn with(
        owner: usize,
        (snapshot_gen, snapshot): (u64, Arc<Snapshot>),
        intern_gen: u64,
    ) -> ThreadStacks {
        let (stack_lo, stack_hi) = stack_bounds();
        ThreadStacks {
            owner,
            snapshot_gen,
            snapshot,
            cache: Box::new(NativeCache::new()),
            intern_gen,
            interned: vec![(0u64, 0u32); INTERN_SLOTS].into_boxed_slice(),
            verified: empty_verified_table(),
            verified_keys: [(0, 0); VERIFIED_ENTRIES],
            next_verified: 0,
            last_hit: 0,
            follows: [0; VERIFIED_ENTRIES],
            stack_lo,
            stack_hi,
            stop: (0, 0),
            stop_for: (0, false),
            py: PyThread {
                interpreter: None,
                looked_at_gen: 0,
                settled_gen: u64::MAX,
                codes: ThreadCodes::default(),
                interned: vec![(0u64, 0u32); INTERN_SLOTS].into_boxed_slice(),
                recent: [(0, 0); RECENT],
                next_recent: 0,
                last: NO_LAST,
                frames: Box::new([0; MAX_PY_FRAMES]),
            },
        }
    }

    fn readable(&self, sp: u64, addr: u64) -> bool {
        addr >= sp && addr.wrapping_add(8) <= self.stack_hi && addr & 7 == 0
    }

    /// Unwinds from (pc, sp, bp): return addresses and their slots, innermost first, oomtrace's
    /// own frames included, stopping after `depth` frames of the caller's. Returns the number of
    /// frames (0 if this stack cannot be read).
    fn unwind(&mut self, pc: u64, sp: u64, bp: u64, depth: usize, v: &mut Verified) -> usize {
        v.n = 0;
        if sp < self.stack_lo || sp >= self.stack_hi {
            return 0; // on a stack we do not know the bounds of (signal or fiber stack)
        }
        let hi = self.stack_hi;
        let read = |addr: u64| -> Result<u64, ()> {
            if addr >= sp && addr.wrapping_add(8) <= hi && addr & 7 == 0 {
                // SAFETY: inside this thread's stack, below its top and above the current sp,
                // aligned: mapped memory of this thread that the unwind does not change.
                Ok(unsafe { (addr as *const u64).read() })
            } else {
                Err(())
            }
        };
        unwind_with(
            &self.snapshot,
            &mut self.cache,
            (pc, sp, bp),
            (depth, self.stop),
            v,
            read,
        )
    }

    /// The id of a recent stack from (sp, bp) whose return addresses are all still in place.
    /// This is the hot path of every allocation from a known call path: one load and one
    /// compare per frame, nothing else (the slots' bounds were checked once, in `remember`).
    /// The entry that followed the last hit the last time is tried first: entries of other
    /// paths can share one (sp, bp) (the same chain of functions reached from another call
    /// site: a warm-up call and a loop in one function, two call sites in turn), and each
    /// costs a read of its slots before it is found different (bench_pairs: three full reads
    /// a pair, 220 instructions, before this order). A loop through a few paths in the same
    /// order every time then finds each at the first try.
    fn verified_hit(&mut self, sp: u64, bp: u64) -> Option<u32> {
        debug_assert!(self.last_hit < VERIFIED_ENTRIES);
        // SAFETY: `last_hit` and each `follows` are entry indexes, below `VERIFIED_ENTRIES`
        // (`hit` stores only those; `forget_verified` and a new table zero them).
        let guess = unsafe { *self.follows.get_unchecked(self.last_hit) } as usize;
        // SAFETY: as just said.
        if let Some(id) = unsafe { self.verified_at(guess, sp, bp) } {
            // It already follows the last hit: only the last hit changes.
            self.last_hit = guess;
            return Some(id);
        }
        let (i, id) = (0..VERIFIED_ENTRIES)
            .filter(|&i| i != guess)
            // SAFETY: `i` is in the range of entry indexes.
            .find_map(|i| Some((i, unsafe { self.verified_at(i, sp, bp) }?)))?;
        self.hit(i);
        Some(id)
    }

    /// Entry `i` was found (or just remembered): it follows the last one.
    fn hit(&mut self, i: usize) {
        self.follows[self.last_hit % VERIFIED_ENTRIES] = i as u8;
        self.last_hit = i;
    }

    /// Entry `i`'s id if it is from (sp, bp) and every return address is still in place.
    ///
    /// # Safety
    /// `i` is below `VERIFIED_ENTRIES` (not checked: the hot path's guess is one).
    #[inline(always)]
    unsafe fn verified_at(&self, i: usize, sp: u64, bp: u64) -> Option<u32> {
        // SAFETY: per the contract.
        let (v, key) = unsafe {
            (
                self.verified.get_unchecked(i),
                self.verified_keys.get_unchecked(i),
            )
        };
        // An entry's key is set with its id, and cleared (to a stack pointer no thread has)
        // when the id is: a key that matches has an id.
        if *key != (sp, bp) {
            return None;
        }
        // Four slots at a time without a branch (a hit reads every slot anyway; the padding
        // spares a loop for the rest): an entry of another path is left at its first four
        // slots that differ, which for two call sites in turn are the first four.
        let words = 1 + 4 * v.quads as usize;
        // SAFETY: `remember` sets `quads` from `n`, at most `RAW_DEPTH`, so `words` is at most
        // `CHECK_WORDS`, the arrays' length (a fresh entry has 0).
        let (slots, raw) = unsafe {
            (
                v.slots.get_unchecked(1..words),
                v.raw.get_unchecked(1..words),
            )
        };
        let differs = slots
            .chunks_exact(4)
            .zip(raw.chunks_exact(4))
            .any(|(slots, raw)| {
                slots.iter().zip(raw).fold(0u64, |differ, (&slot, &ra)| {
                    // SAFETY: `remember` keeps only entries whose every slot lies, aligned, in
                    // this thread's stack at or above the entry's sp, which equals the current
                    // sp here (mapped memory of this thread above the live stack pointer), or
                    // is `CHECK_PAD`.
                    differ | (unsafe { (slot as *const u64).read() } ^ ra)
                }) != 0
            });
        (!differs).then_some(v.id)
    }

    fn forget_verified(&mut self) {
        for v in self.verified.iter_mut() {
            v.id = 0;
        }
        self.verified_keys = [(0, 0); VERIFIED_ENTRIES];
        self.next_verified = 0;
        self.last_hit = 0;
        self.follows = [0; VERIFIED_ENTRIES];
    }

    /// Remembers an unwound stack for `verified_hit`, if every slot it read lies in this
    /// thread's stack above its sp (the unwind only reads such slots; checked here, once, so
    /// that the hot path need not), its slots padded to whole groups of four.
    fn remember(&mut self, mut v: Verified) {
        if v.n == 0
            || v.id == 0
            || !v.slots[1..v.n]
                .iter()
                .all(|&slot| self.readable(v.sp, slot))
        {
            return;
        }
        v.quads = (v.n - 1).div_ceil(4) as u32;
        debug_assert!(4 * (v.quads as usize) < CHECK_WORDS);
        for k in v.n..1 + 4 * v.quads as usize {
            v.slots[k] = &CHECK_PAD as *const u64 as u64;
            v.raw[k] = CHECK_PAD;
        }
        let at = self.next_verified % VERIFIED_ENTRIES;
        self.verified_keys[at] = (v.sp, v.bp);
        self.verified[at] = v;
        self.next_verified = (at + 1) % VERIFIED_ENTRIES;
        self.hit(at);
    }
}

/// Unwinds from `regs` = (pc, sp, bp) with `snapshot`'s rules, reading the stack through
/// `read` (the live stack in `ThreadStacks::unwind`, a fake memory image in tests): return
/// addresses and their slots, innermost first, oomtrace's own frames included, stopping after
/// `depth` frames of the caller's or before the first caller's frame (after the first) that
/// returns into `stop`. Returns the number of frames.
fn unwind_with(
    snapshot: &Snapshot,
    cache: &mut NativeCache,
    (pc, sp, bp): (u64, u64, u64),
    (depth, stop): (usize, (u64, u64)),
    v: &mut Verified,
    mut read: impl FnMut(u64) -> Result<u64, ()>,
) -> usize {
    let own = snapshot.own;
    let mut regs = UnwindRegsNative::new(pc, sp, bp);
    let mut frame = FrameAddress::from_instruction_pointer(pc);
    v.raw[0] = pc;
    v.slots[0] = 0;
    let mut n = 1;
    let mut callers = 0;
    while n < RAW_DEPTH && callers < depth {
        let prev_sp = regs.sp();
        match snapshot
            .unwinder
            .unwind_frame(frame, &mut regs, cache, &mut read)
        {
            Ok(Some(ra)) => {
                // The stack must move up, or a corrupt frame could loop forever.
                if regs.sp() <= prev_sp {
                    break;
                }
                if callers > 0 && stop.0 <= ra && ra < stop.1 {
                    break;
                }
                v.raw[n] = ra;
                v.slots[n] = regs.sp().wrapping_sub(8);
                n += 1;
                if callers > 0 || !(own.0 <= ra && ra < own.1) {
                    callers += 1;
                }
                match FrameAddress::from_return_address(ra) {
                    Some(f) => frame = f,
                    None => break,
                }
            }
            _ => break,
        }
    }
    v.n = n;
    n
}

/// The caller's return addresses: `raw` without oomtrace's own leading frames, at most `depth`.
fn caller_frames(v: &Verified, own: (u64, u64), depth: usize) -> &[u64] {
    let skip = v.raw[..v.n]
        .iter()
        .take_while(|&&a| own.0 <= a && a < own.1)
        .count();
    let end = v.n.min(skip + depth);
    &v.raw[skip..end]
}

/// The frames the collector is sent: oomtrace's own frames dropped wherever they are (past the
/// leading ones, which `caller_frames` skips: a wrapper of PyTorch's allocator methods sits
/// between PyTorch's frames, and is no frame of the program's).
fn without_own(frames: &[u64], own: (u64, u64)) -> Box<[u64]> {
    frames
        .iter()
        .copied()
        .filter(|&a| !(own.0 <= a && a < own.1))
        .collect()
}

/// Mixes the return addresses in four independent lanes (a single dependent multiply chain
/// was measurably slower in the prototype), then avalanches.
fn hash_frames(frames: &[u64]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = [
        0x243F_6A88_85A3_08D3u64,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    ];
    for chunk in frames.chunks(4) {
        for (lane, f) in h.iter_mut().zip(chunk) {
            *lane = (*lane ^ f).wrapping_mul(K).rotate_left(31);
        }
    }
    let mut x = h[0] ^ h[1].rotate_left(17) ^ h[2].rotate_left(31) ^ h[3].rotate_left(47);
    x ^= frames.len() as u64;
    // splitmix64 finalizer
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What stack capture is asked to do in this process.
#[derive(Clone, Copy, Debug)]
pub struct StackConfig {
    /// Native stacks at all (`OOMTRACE_STACKS`).
    pub native: bool,
    /// Python frames after the native ones (`OOMTRACE_PYTHON`).
    pub python: bool,
    /// Most caller frames kept.
    pub depth: usize,
}

/// Stack capture for one process image: where definitions go, what to capture, and the
/// module state (built on the first capture: processes with stacks off never enumerate
/// modules). Published by whoever starts tracing; a fork child forgets it and gets its own.
pub struct Capturer {
    outbox: &'static Outbox,
    config: StackConfig,
    stacks: OnceLock<Stacks>,
}

static CURRENT: AtomicPtr<Capturer> = AtomicPtr::new(std::ptr::null_mut());

impl Capturer {
    /// Makes stack capture send to `outbox` with `config` in this process from now on. A
    /// config that captures nothing publishes nothing: every event then finds capture off
    /// in one load ([`capture`]), not three.
    pub fn publish(outbox: &'static Outbox, config: StackConfig) {
        if !(config.native || config.python) {
            Capturer::forget();
            return;
        }
        // Alone on its cache lines: every capture reads its config.
        let cap: &'static Capturer = &Box::leak(Box::new(CacheLine(Capturer {
            outbox,
            config,
            stacks: OnceLock::new(),
        })))
        .0;
        CURRENT.store(cap as *const Capturer as *mut Capturer, Ordering::Release);
    }

    /// In a fork child: forget the parent's (leaked) capture state.
    pub fn forget() {
        CURRENT.store(std::ptr::null_mut(), Ordering::Release);
    }

    fn stacks(&self) -> &Stacks {
        self.stacks.get_or_init(|| Stacks::new(self.outbox))
    }
}

fn current() -> Option<&'static Capturer> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: only `publish` stores a non-null pointer, from a leaked box never freed.
    unsafe { p.as_ref() }
}

/// The calling thread's native stack as an interned id (0 if stacks are off or unavailable).
/// Inlined into the caller: with stacks off (`OOMTRACE_STACKS=off`: no capturer published)
/// or before tracing started, one load and no call.
#[inline]
pub fn capture() -> StackId {
    match current() {
        Some(cap) => capture_with(cap),
        None => StackId::NONE,
    }
}

/// [`capture`]'s work, in a frame of its own: unwinding starts from this frame's registers.
#[inline(never)]
fn capture_with(cap: &'static Capturer) -> StackId {
    let (pc, sp, bp): (u64, u64, u64);
    // Registers of this very frame: unwinding starts here and runs in deeper frames, so the
    // part of the stack it reads (this frame and its callers) stays untouched meanwhile.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads three registers into outputs; no memory, stack or flags are touched.
    // `rbp` first: the compiler may give `rbp` to another output (it is free to when the
    // frame does not use it), and that output's write would clobber it.
    unsafe {
        core::arch::asm!(
            "mov {bp}, rbp",
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        return StackId::NONE;
    }
    let slot = thread_slot();
    // SAFETY: this thread's own block, used on this thread only; `busy` keeps a signal handler
    // that captures while this capture runs away from the tables.
    let ts = unsafe {
        if (*slot).busy {
            return StackId::NONE; // re-entered from a signal handler
        }
        if (sp < (*slot).floor || sp >= (*slot).ceiling) && outside_capture_range(slot, sp) {
            return StackId::NONE;
        }
        let owner = cap as *const Capturer as usize;
        if (*slot).stacks.is_null() || (*(*slot).stacks).owner != owner {
            // The first capture on this thread (or the first since a fork): its tables,
            // freed by `OWNER` when the thread ends. None once the thread is ending. Not busy,
            // so no capture uses the old ones.
            if OWNER.try_with(|_| ()).is_err() {
                return StackId::NONE;
            }
            install_thread_stacks(slot, cap);
        }
        (*slot).busy = true;
        &mut *(*slot).stacks
    };
    let _busy = Busy(slot);
    // Once, not in each step: the steps' calls keep the compiler from sharing its check.
    let stacks = cap.stacks();
    let py = if cap.config.python {
        interpreter(cap, ts)
    } else {
        None
    };
    let native = if cap.config.native {
        intern(cap, stacks, ts, (pc, sp, bp))
    } else {
        StackId::NONE
    };
    match py {
        Some(py) => with_python(cap, stacks, ts, py, native),
        None => native,
    }
}

/// A stack pointer outside the slot's capture range: true if the capture must give up.
/// Asks this thread's stack bounds first if they were never asked (the thread's first
/// capture; out of line).
///
/// # Safety
/// `slot` is this thread's own block.
#[cold]
#[inline(never)]
unsafe fn outside_capture_range(slot: *mut ThreadSlot, sp: u64) -> bool {
    // SAFETY: per the contract.
    unsafe {
        if !(*slot).bounds_asked {
            let (lo, hi) = stack_bounds();
            (*slot).stack = (lo, hi);
            // Bounds pthread could not tell leave the capture as it was (its unwind then
            // reads no native frame).
            (*slot).floor = if hi == 0 {
                0
            } else {
                lo.saturating_add(CAPTURE_STACK_NEEDED)
            };
            (*slot).ceiling = if hi == 0 { u64::MAX } else { hi };
            (*slot).bounds_asked = true;
            if sp >= (*slot).floor && sp < (*slot).ceiling {
                return false;
            }
        }
        // Off the thread's stack (a signal's own stack, a fiber's: how much is left there is
        // unknown), or too near its end.
        let (lo, hi) = (*slot).stack;
        if sp < hi && sp >= lo {
            small_stack_said();
        }
        true
    }
}

#[cold]
#[inline(never)]
fn small_stack_said() {
    log::warn_once(
        &SMALL_STACK_SAID,
        &format!(
            "a thread has less than {} KiB of stack left where it allocates: its allocations \
             are recorded without their call sites",
            CAPTURE_STACK_NEEDED / 1024
        ),
    );
}

/// Makes this thread's tables for `cap` (freeing any of an earlier capturer's). Out of line
/// and cold: the tables are built on the stack before they are boxed, and would otherwise
/// be in every capture's frame (8 KiB more, probed page by page on each call).
///
/// # Safety
/// `slot` is this thread's own block, and no capture is using its tables.
#[cold]
#[inline(never)]
unsafe fn install_thread_stacks(slot: *mut ThreadSlot, cap: &Capturer) {
    let fresh = Box::into_raw(Box::new(ThreadStacks::new(cap)));
    // SAFETY: per the contract; the old pointer is null or a `Box` made here on this thread
    // and not freed since.
    unsafe {
        let old = std::mem::replace(&mut (*slot).stacks, fresh);
        if !old.is_null() {
            drop(Box::from_raw(old));
        }
    }
}

/// The interpreter whose frames this thread's stacks get, looked for again when the loaded
/// modules changed (native stacks: on a new snapshot; Python frames only: every 1024th
/// capture without one), and the module the native unwind stops at.
#[inline(always)]
fn interpreter(cap: &Capturer, ts: &mut ThreadStacks) -> Option<&'static Interpreter> {
    // Settled: readable when settled; one whose frames turned out unreadable since is let go
    // by `with_python`, which sends the thread back here.
    if ts.py.settled_gen == ts.snapshot_gen {
        return ts.py.interpreter;
    }
    settle_interpreter(cap, ts)
}

/// [`interpreter`] when something may have changed: the search, and the native unwind's end.
#[inline(never)]
fn settle_interpreter(cap: &Capturer, ts: &mut ThreadStacks) -> Option<&'static Interpreter> {
    if cap.config.native {
        if ts.py.looked_at_gen != ts.snapshot_gen {
            ts.py.looked_at_gen = ts.snapshot_gen;
            let c = ts.snapshot.counts;
            ts.py.interpreter = python::interpreter(c.adds.wrapping_mul(0x9E37_79B9) ^ c.subs);
        }
    } else if ts.py.interpreter.is_none() {
        ts.py.interpreter = python::interpreter_if_found();
        if ts.py.interpreter.is_none() {
            ts.py.looked_at_gen = ts.py.looked_at_gen.wrapping_add(1);
            if ts.py.looked_at_gen % 1024 == 1 {
                let c = modules::load_counts();
                ts.py.interpreter = python::interpreter(c.adds.wrapping_mul(0x9E37_79B9) ^ c.subs);
            }
        }
    }
    let py = ts.py.interpreter.filter(|i| i.readable());
    ts.py.interpreter = py;
    if cap.config.native && ts.stop_for != (ts.snapshot_gen, py.is_some()) {
        ts.stop_for = (ts.snapshot_gen, py.is_some());
        let stop = match py {
            Some(i) => {
                let a = i.code_address();
                let k = &ts.snapshot.known;
                let at = k.partition_point(|r| r.0 <= a);
                if at > 0 && a < k[at - 1].1 {
                    k[at - 1]
                } else {
                    (0, 0)
                }
            }
            None => (0, 0),
        };
        if stop != ts.stop {
            // Stacks remembered with the other end point would be reused as they are.
            ts.stop = stop;
            ts.forget_verified();
        }
    }
    // Python frames only and no interpreter yet: the search above counts captures.
    ts.py.settled_gen = if cap.config.native || py.is_some() {
        ts.snapshot_gen
    } else {
        u64::MAX
    };
    py
}

fn intern(
    cap: &Capturer,
    stacks: &Stacks,
    ts: &mut ThreadStacks,
    (pc, sp, bp): (u64, u64, u64),
) -> StackId {
    if let Some(id) = ts.verified_hit(sp, bp) {
        if stacks.intern_gen.load(Ordering::Acquire) == ts.intern_gen {
            return StackId(id);
        }
    }
    intern_miss(cap, ts, pc, sp, bp)
}

/// [`intern`] of a stack not verified in place: unwound, and sent if new. Out of line and
/// cold: its buffers (a whole unwind, about 2 KiB, and the move into the table) would
/// otherwise be in every capture's frame (8.5 KiB, probed page by page on each call).
#[cold]
#[inline(never)]
fn intern_miss(cap: &Capturer, ts: &mut ThreadStacks, pc: u64, sp: u64, bp: u64) -> StackId {
    let stacks = cap.stacks();
    // A miss: before unwinding, make sure no module was unloaded or replaced since the last
    // scan (one dl_iterate_phdr call that stops at the first object; misses are rare).
    if modules::load_counts() != ts.snapshot.counts {
        stacks.refresh_if_loader_changed(cap.outbox);
    }
    let gen = stacks.snapshot_gen.load(Ordering::Acquire);
    if gen != ts.snapshot_gen {
        let (g, s) = stacks.current();
        ts.snapshot_gen = g;
        ts.snapshot = s;
    }
    let igen = stacks.intern_gen.load(Ordering::Acquire);
    if igen != ts.intern_gen {
        ts.interned.fill((0, 0));
        ts.forget_verified();
        ts.intern_gen = igen;
    }
    let depth = cap.config.depth;
    let mut v = Verified::empty(sp, bp);
    if ts.unwind(pc, sp, bp, depth, &mut v) == 0 {
        return StackId::NONE;
    }
    let own = ts.snapshot.own;
    // New on this thread. Make sure the unwinder and the collector know every module in it;
    // if that changed anything, this unwind may have used fallback rules: do it again. Each
    // round can reach deeper (a newly loaded module lets the unwind continue into its caller's
    // module), so repeat until nothing changes; a stack crosses few modules.
    for _ in 0..16 {
        if ts.snapshot.covers(caller_frames(&v, own, depth))
            || !stacks.cover(cap.outbox, caller_frames(&v, own, depth))
        {
            break;
        }
        let (g, s) = stacks.current();
        ts.snapshot_gen = g;
        ts.snapshot = s;
        if ts.unwind(pc, sp, bp, depth, &mut v) == 0 {
            return StackId::NONE;
        }
    }
    let frames = caller_frames(&v, own, depth);
    if frames.is_empty() {
        return StackId::NONE;
    }
    let h = hash_frames(frames);
    let slot = (h as usize) & (INTERN_SLOTS - 1);
    let id = if ts.interned[slot].0 == h && ts.interned[slot].1 != 0 {
        ts.interned[slot].1
    } else {
        let id = stacks.next_stack_id.fetch_add(1, Ordering::Relaxed);
        let msg = Msg::Stack {
            id,
            frames: without_own(frames, own),
        };
        if !cap.outbox.send_reliable(msg) {
            // Not remembered: the next occurrence tries again rather than pointing at a stack
            // the collector never received.
            cap.outbox.count_lost_stack();
            return StackId::NONE;
        }
        ts.interned[slot] = (h, id);
        id
    };
    v.id = id;
    // Verification re-reads every slot, so only stacks that ended cleanly inside the readable
    // stack are worth remembering.
    ts.remember(*v);
    StackId(id)
}

/// The native stack `native` (none with Python frames only) with the calling thread's
/// Python frames after it, interned on its own (the same native path runs many Python
/// lines), or `native` if there are none.
fn with_python(
    cap: &Capturer,
    stacks: &Stacks,
    ts: &mut ThreadStacks,
    py: &'static Interpreter,
    native: StackId,
) -> StackId {
    let walked = python::walk(
        cap.outbox,
        py,
        &stacks.codes,
        &mut ts.py.codes,
        &mut ts.py.frames,
    );
    let n = match walked {
        // The hot path of a loop: the same Python frames above the same native stack.
        Walked::Same if ts.py.last.0 == native.0 => return StackId(ts.py.last.1),
        Walked::Same => ts.py.codes.frames_walked(),
        Walked::Frames(n) => n,
    };
    if n == 0 {
        ts.py.last = NO_LAST;
        if !py.readable() {
            // Its frames did not look as expected (once, for the process): the next capture
            // settles again, without it (and with the native unwind's end moved).
            ts.py.settled_gen = u64::MAX;
        }
        return native;
    }
    let id = combined(cap, stacks, ts, n, native);
    if id.is_none() {
        ts.py.last = NO_LAST;
        return native;
    }
    ts.py.last = (native.0, id.0);
    id
}

/// `PyThread::last` when no capture combined Python frames with a native stack.
const NO_LAST: (u32, u32) = (u32::MAX, 0);

/// The id of the native stack `native` followed by the `n` Python frames just walked (NONE
/// if it could not be sent: the caller then gives the native stack alone).
fn combined(
    cap: &Capturer,
    stacks: &Stacks,
    ts: &mut ThreadStacks,
    n: usize,
    native: StackId,
) -> StackId {
    let py_frames = &ts.py.frames[..n];
    let h = hash_frames(py_frames) ^ (native.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if let Some(&(_, id)) = ts.py.recent.iter().find(|r| r.0 == h && r.1 != 0) {
        return StackId(id);
    }
    let slot = (h as usize) & (INTERN_SLOTS - 1);
    if ts.py.interned[slot].0 == h && ts.py.interned[slot].1 != 0 {
        let id = ts.py.interned[slot].1;
        ts.py.remember_recent(h, id);
        return StackId(id);
    }
    // New: send the native frames (still in the verified table under `native`) and these.
    let mut frames = Vec::with_capacity(MAX_STACK_DEPTH + n);
    if !native.is_none() {
        let Some(v) = ts.verified.iter().find(|v| v.id == native.0 && v.n > 0) else {
            return StackId::NONE;
        };
        frames.extend(without_own(
            caller_frames(v, ts.snapshot.own, cap.config.depth),
            ts.snapshot.own,
        ));
    }
    frames.extend_from_slice(&ts.py.frames[..n]);
    let id = stacks.next_stack_id.fetch_add(1, Ordering::Relaxed);
    let msg = Msg::Stack {
        id,
        frames: frames.into_boxed_slice(),
    };
    if !cap.outbox.send_reliable(msg) {
        cap.outbox.count_lost_stack();
        return StackId::NONE;
    }
    ts.py.interned[slot] = (h, id);
    ts.py.remember_recent(h, id);
    StackId(id)
}

impl PyThread {
    fn remember_recent(&mut self, h: u64, id: u32) {
        self.recent[self.next_recent] = (h, id);
        self.next_recent = (self.next_recent + 1) % RECENT;
    }
}

#[cfg(test)]
mod tests;
