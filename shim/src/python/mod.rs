//! Python frames of the calling thread, read without the GIL.
//!
//! PyTorch releases the GIL before it allocates, and a hook that waited for the GIL while
//! PyTorch holds its allocator lock would deadlock. So the walk takes no lock and calls no
//! Python API that needs one: it reads the calling thread's own frame chain from memory
//! (its thread state from the thread-specific key `PyGILState_GetThisThreadState` reads,
//! read where that function's code shows it, see `runtime_words.rs`, or through the function
//! where it does not). Only the owning thread changes that chain, and it is inside our hook,
//! so the chain holds still while we read it. This is what py-spy and austin do from another
//! process.
//!
//! Each frame becomes (code id, bytecode offset); a code object crosses the socket once, as a
//! `CodeDef` with its file, qualified name and line table, and lines are computed in the
//! collector.
//!
//! Safety: the layout (`layout.rs`) could be wrong for an interpreter we did not test. The
//! first walks therefore read through `process_vm_readv`, which fails cleanly on a bad
//! address, and check that every code object, file name and line table has the right type.
//! Only after a walk passes are plain loads used; a walk that fails switches Python frames
//! off for the process with one line on stderr. Type checks stay on every load of a code
//! object, and walks stop at 128 frames.

pub mod layout;
mod runtime_words;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use oomtrace_proto::python::{CodeDef, PyFrame, MAX_CODE_ID};

use crate::log;
use crate::symbols;
use crate::transport::{Msg, Outbox};
use layout::{FrameModel, Layout};

/// Most Python frames kept per stack (the innermost ones).
pub const MAX_PY_FRAMES: usize = 128;
/// Longest file or function name read; longer ones are cut.
const MAX_NAME: usize = 1024;
/// Largest line table read (a line table grows ~1 byte per instruction).
const MAX_TABLE: usize = 1 << 20;

/// The interpreter found in this process: its layout and the addresses the walk compares with.
pub struct Interpreter {
    pub layout: Layout,
    /// `layout` as the chain check reads it.
    chain: ChainLayout,
    /// Which chain check the hot path runs (`FixedChain as u8 + 1`): 0 until a walk passed
    /// with checked reads (set with `trust`), then `chain`'s constant where it equals one.
    /// One load and one compare decide both whether to check and how.
    check: AtomicU8,
    this_thread_state: unsafe extern "C" fn() -> *mut c_void,
    is_finalizing: Option<unsafe extern "C" fn() -> c_int>,
    /// The word `is_finalizing` tests, where its code shows which (`runtime_words.rs`): the
    /// hot path loads it instead of calling the function.
    finalizing_word: Option<&'static AtomicU64>,
    /// `_PyRuntime` (0: not found).
    runtime: u64,
    /// The finalizing word and the thread-state key, once both are known: each capture then
    /// reads them itself, not through CPython's functions (`ReadDirectly`). Until then, or if
    /// either is not found, it calls those functions (`thread_state_asked`).
    read_directly: ReadDirectlyCell,
    /// The key was looked for (once per process).
    thread_state_key_searched: AtomicBool,
    code_type: u64,
    unicode_type: u64,
    bytes_type: u64,
    /// `TRUSTED` once a walk passed with checked reads; `BROKEN` if one failed.
    trust: AtomicU8,
}

/// `Interpreter::check` before a walk passed.
const NO_CHECK: u8 = 0;

const UNVERIFIED: u8 = 0;
const TRUSTED: u8 = 1;
const BROKEN: u8 = 2;

static INTERPRETER: AtomicPtr<Interpreter> = AtomicPtr::new(std::ptr::null_mut());
/// Loader counters at the last failed search (0 = never searched).
static SEARCHED_AT: AtomicU64 = AtomicU64::new(0);

fn sym(name: &CStr) -> *mut c_void {
    symbols::real_dlsym(libc::RTLD_DEFAULT, name)
}

/// The interpreter of this process, searched for again only when the loader's counters moved
/// (an embedding program may load libpython late). `counts` is a fingerprint of those.
pub fn interpreter(counts: u64) -> Option<&'static Interpreter> {
    if let Some(i) = interpreter_if_found() {
        return Some(i);
    }
    if !INTERPRETER.load(Ordering::Acquire).is_null() {
        return None; // found, and its frames did not look as expected
    }
    search(counts)
}

/// The interpreter if one was found and its frames can be read (one atomic load): for the
/// hot path, which searches (`interpreter`) only when the loader's counters moved.
#[inline]
pub fn interpreter_if_found() -> Option<&'static Interpreter> {
    let p = INTERPRETER.load(Ordering::Acquire);
    // SAFETY: set once in `search` from a leaked Box, never freed.
    let i = unsafe { p.as_ref() }?;
    (i.trust.load(Ordering::Relaxed) != BROKEN).then_some(i)
}

fn search(counts: u64) -> Option<&'static Interpreter> {
    if SEARCHED_AT.swap(counts, Ordering::AcqRel) == counts {
        return None;
    }
    let found = find()?;
    let leaked = Box::into_raw(Box::new(found));
    match INTERPRETER.compare_exchange(
        std::ptr::null_mut(),
        leaked,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {}
        // SAFETY: another thread won; ours was never shared.
        Err(_) => drop(unsafe { Box::from_raw(leaked) }),
    }
    // SAFETY: non-null from here on, leaked.
    Some(unsafe { &*INTERPRETER.load(Ordering::Acquire) })
}

fn version() -> Option<(u8, u8)> {
    let hex = sym(c"Py_Version");
    if !hex.is_null() {
        // SAFETY: `const unsigned long Py_Version` (3.11+).
        let v = unsafe { *(hex as *const u64) };
        return Some(((v >> 24) as u8, (v >> 16) as u8));
    }
    let get = sym(c"Py_GetVersion");
    if get.is_null() {
        return None;
    }
    // SAFETY: `const char *Py_GetVersion(void)`, safe without the GIL ("3.10.12 (main, ...").
    let f: unsafe extern "C" fn() -> *const c_char = unsafe { std::mem::transmute(get) };
    // SAFETY: Py_GetVersion returns a static NUL-terminated string.
    let s = unsafe { CStr::from_ptr(f()) }.to_str().ok()?;
    let mut it = s.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

fn find() -> Option<Interpreter> {
    let tstate = sym(c"PyGILState_GetThisThreadState");
    let code_type = sym(c"PyCode_Type");
    if tstate.is_null() || code_type.is_null() {
        return None;
    }
    let (major, minor) = version()?;
    let layout = if (major, minor) >= (3, 13) {
        debug_offsets::read(sym(c"_PyRuntime"), major, minor)
    } else {
        layout::builtin(major, minor)
    };
    let Some(layout) = layout else {
        log::warn(&format!(
            "Python {major}.{minor} is not supported for Python frames; stacks stay native"
        ));
        return None;
    };
    let mut fin = sym(c"Py_IsFinalizing");
    if fin.is_null() {
        fin = sym(c"_Py_IsFinalizing");
    }
    let runtime = sym(c"_PyRuntime");
    let finalizing_word = finalizing_word(fin, runtime);
    log::info(&match finalizing_word {
        Some(w) => format!(
            "Python {major}.{minor}: the finalizing flag is read from _PyRuntime+{:#x}",
            w as *const AtomicU64 as u64 - runtime as u64
        ),
        None => format!("Python {major}.{minor}: the finalizing flag is asked of CPython"),
    });
    Some(Interpreter {
        layout,
        chain: ChainLayout::of(&layout),
        check: AtomicU8::new(NO_CHECK),
        // SAFETY: `PyThreadState *PyGILState_GetThisThreadState(void)`.
        this_thread_state: unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_void>(tstate)
        },
        // SAFETY: `int Py_IsFinalizing(void)` (or `_Py_IsFinalizing`), found non-null.
        is_finalizing: (!fin.is_null()).then(|| unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(fin)
        }),
        finalizing_word,
        runtime: runtime as u64,
        read_directly: ReadDirectlyCell::default(),
        thread_state_key_searched: AtomicBool::new(false),
        code_type: code_type as u64,
        unicode_type: sym(c"PyUnicode_Type") as u64,
        bytes_type: sym(c"PyBytes_Type") as u64,
        trust: AtomicU8::new(UNVERIFIED),
    })
}

/// The word that `fin` (`Py_IsFinalizing`, found at `fin`) tests, if its machine code shows
/// which (`runtime_words.rs`), read only through `process_vm_readv`.
fn finalizing_word(fin: *mut c_void, runtime: *mut c_void) -> Option<&'static AtomicU64> {
    if fin.is_null() || runtime.is_null() {
        return None;
    }
    let body = function_body(fin as u64)?;
    let word =
        runtime_words::word_tested(&body, fin as u64, runtime as u64, |slot| Checked.u64(slot))?;
    // SAFETY: an aligned word in the first 64 KiB of `_PyRuntime`, libpython's static, which
    // lives as long as the functions this interpreter calls; CPython writes it atomically
    // (`_Py_atomic_address`), so it is read as an atomic.
    Some(unsafe { &*(word as *const AtomicU64) })
}

/// The first bytes of the function at `at`, read through `process_vm_readv`, for
/// `runtime_words.rs` to decode (x86-64 only: the shapes it knows).
fn function_body(at: u64) -> Option<[u8; runtime_words::BODY_BYTES]> {
    let mut body = [0u8; runtime_words::BODY_BYTES];
    (cfg!(target_arch = "x86_64") && Checked.read(at, &mut body)).then_some(body)
}

/// CPython's `Py_tss_t`: whether its key was created, and the key.
#[repr(C)]
struct PyTss {
    created: AtomicU32,
    key: AtomicU32,
}

impl PyTss {
    /// What `PyGILState_GetThisThreadState` reads, without its two calls: the key's value on
    /// this thread, as CPython last wrote the key, while created (the function's own test,
    /// of `autoInterpreterState`, is cleared with it at exit; a key deleted there and not yet
    /// made again, as an embedder that initializes Python a second time would meet, is not
    /// asked).
    #[inline(always)]
    fn this_thread(&self) -> u64 {
        if self.created.load(Ordering::Relaxed) != 1 {
            return 0;
        }
        // SAFETY: `pthread_getspecific` of a created key: this thread's value, or NULL.
        unsafe { libc::pthread_getspecific(self.key.load(Ordering::Relaxed)) as u64 }
    }
}

/// `PTHREAD_KEYS_MAX` on Linux: no key is this or more.
const PTHREAD_KEYS_MAX: u32 = 1024;

/// The key `PyGILState_GetThisThreadState` (at `tstate_fn`) reads, where its machine code
/// shows it (`runtime_words.rs`), checked there: a created key (its `Py_tss_t`'s flag before
/// it is 1) whose value on this thread is `ts`, this thread's thread state as the function
/// just answered. Cold: once per process, on a thread with a thread state.
#[cold]
#[inline(never)]
fn find_thread_state_key(tstate_fn: u64, runtime: u64, ts: u64) -> Option<&'static PyTss> {
    let body = function_body(tstate_fn)?;
    let at = runtime_words::key_read(&body, tstate_fn, runtime, |slot| Checked.u64(slot))?;
    let (created, key) = (Checked.u32(at - 4)?, Checked.u32(at)?);
    if created != 1 || key >= PTHREAD_KEYS_MAX {
        return None;
    }
    // SAFETY: any key below PTHREAD_KEYS_MAX may be asked; one not created gives NULL.
    let value = unsafe { libc::pthread_getspecific(key) } as u64;
    // SAFETY: an aligned `Py_tss_t` in `_PyRuntime`, libpython's static, which lives as long
    // as the functions this interpreter calls; CPython writes its words, read atomically.
    (value == ts).then(|| unsafe { &*((at - 4) as *const PyTss) })
}

/// What CPython's `_Py_IsFinalizing` and `PyGILState_GetThisThreadState` read, where their
/// own code reads it (`runtime_words.rs`): each capture reads these two words itself.
struct ReadDirectly {
    /// `_PyRuntime._finalizing`.
    finalizing: &'static AtomicU64,
    /// `_PyRuntime.autoTSSkey`.
    key: &'static PyTss,
}

impl ReadDirectly {
    /// This thread's thread state, or 0: none, or the interpreter is finalizing (thread
    /// states may be freed from then on; the key is deleted at its end).
    #[inline(always)]
    fn thread_state(&self) -> u64 {
        if self.finalizing.load(Ordering::Relaxed) != 0 {
            return 0;
        }
        self.key.this_thread()
    }
}

/// A `ReadDirectly` set once (leaked: hooks on any thread may hold it until the process ends).
#[derive(Default)]
struct ReadDirectlyCell(AtomicPtr<ReadDirectly>);

impl ReadDirectlyCell {
    #[inline(always)]
    fn load(&self, order: Ordering) -> Option<&'static ReadDirectly> {
        // SAFETY: null, or a leaked box stored once by `set` and never freed.
        unsafe { self.0.load(order).as_ref() }
    }

    fn set(&self, direct: ReadDirectly) {
        let leaked = Box::into_raw(Box::new(direct));
        if self
            .0
            .compare_exchange(
                std::ptr::null_mut(),
                leaked,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // SAFETY: ours, never shared.
            drop(unsafe { Box::from_raw(leaked) });
        }
    }
}

/// This thread's thread state as CPython answers it (0 while the interpreter is finalizing),
/// and the first time one is found (on a thread that has one), the key it was read from:
/// with the finalizing word, what the hot path reads from then on.
#[cold]
#[inline(never)]
fn thread_state_asked(py: &Interpreter) -> u64 {
    // Thread states may be freed once the interpreter is finalizing.
    match py.finalizing_word {
        Some(word) if word.load(Ordering::Relaxed) != 0 => return 0,
        Some(_) => {}
        None => {
            if let Some(fin) = py.is_finalizing {
                // SAFETY: reads a flag; no GIL needed.
                if unsafe { fin() } != 0 {
                    return 0;
                }
            }
        }
    }
    // SAFETY: reads this thread's thread-specific key; NULL when it has no thread state.
    let ts = unsafe { (py.this_thread_state)() } as u64;
    // Only with the finalizing word: the hot path reads both or neither.
    if let Some(finalizing) = py.finalizing_word {
        if ts != 0 && py.runtime != 0 && !py.thread_state_key_searched.swap(true, Ordering::Relaxed)
        {
            let key = find_thread_state_key(py.this_thread_state as usize as u64, py.runtime, ts);
            log::info(&match key {
                Some(k) => format!(
                    "Python: the thread state is read from its key (_PyRuntime+{:#x})",
                    k as *const PyTss as u64 + 4 - py.runtime
                ),
                None => "Python: the thread state is asked of CPython".to_string(),
            });
            if let Some(key) = key {
                py.read_directly.set(ReadDirectly { finalizing, key });
            }
        }
    }
    ts
}

pub mod debug_offsets;

impl Interpreter {
    /// An address in the interpreter's code: its module's frames are where the Python frames
    /// take over from the native ones.
    pub fn code_address(&self) -> u64 {
        self.this_thread_state as usize as u64
    }

    /// False once a walk found the frames not as the layout says (stacks stay native).
    pub fn readable(&self) -> bool {
        self.trust.load(Ordering::Relaxed) != BROKEN
    }
}

/// How the walk reads the target's memory: plain loads once the layout is trusted,
/// `process_vm_readv` before, a fake memory image in tests.
trait Mem {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool;
    fn u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }
    fn u32(&self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b).then(|| u32::from_le_bytes(b))
    }
}

struct Direct;
impl Mem for Direct {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        if addr < 4096 || addr.checked_add(out.len() as u64).is_none() {
            return false;
        }
        // SAFETY: the layout was verified on this interpreter with checked reads, and the
        // objects read are the calling thread's own frames and the code objects they hold.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        true
    }
}

/// Plain loads without `Direct`'s null-page check, for `unchanged` alone: it reads only the
/// thread state and frames the live chain leads to at the addresses the last walk already
/// read them from (none is 0, or below the null page).
struct Known;
impl Mem for Known {
    #[inline(always)]
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        // SAFETY: see the type's comment and `unchanged`: the calling thread's own thread state
        // and frames, alive while its chain holds them, under the trusted layout.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        true
    }
}

struct Checked;
impl Mem for Checked {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        if addr < 4096 {
            return false;
        }
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: out.len(),
        };
        // SAFETY: reads our own memory into `out`; a bad address is an error, not a fault.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        n == out.len() as isize
    }
}

/// Code objects already announced, per process (rebuilt after fork with the stack state).
#[derive(Default)]
pub struct CodeRegistry {
    /// Code object address -> (identity check, id).
    by_addr: Mutex<HashMap<u64, (u64, u32)>>,
    next_id: std::sync::atomic::AtomicU32,
}

/// Per-thread cache of code ids, direct-mapped by address, and the chain the last walk read.
pub struct ThreadCodes {
    slots: Box<[(u64, u64, u32)]>,
    last: LastChain,
}

/// What the last trusted walk of this thread read from each frame it visited (sentinels and
/// frames of other executables included), and the thread state it started from. A loop
/// allocates again and again from the same frames at the same instructions; when every frame
/// reads the same, the frames the walk wrote last time are still the answer, and the code
/// objects (a cache miss or two each: the interpreter seldom touches their headers) are not
/// read again. A frame that reads the same holds the same code object: it keeps it alive.
/// (Only a code object freed and another made at its address, run from a frame at the same
/// address at the same instruction, would pass for the old one.)
struct LastChain {
    /// The thread state the frames were read from; 0: nothing to compare with. Not 0 only
    /// with 1 to `MAX_VISITED` frames recorded ([`LastChain::recorded`]), which the check
    /// relies on to slice them unchecked.
    ts: u64,
    /// Frames recorded.
    len: usize,
    /// A fixed size: the check slices it without a bounds check.
    frames: Box<[FrameRead; MAX_VISITED]>,
    /// What the walk returned.
    n: usize,
}

impl LastChain {
    /// Keeps what a trusted walk from `ts` read for the next check (`n`: what it returned,
    /// None if it failed). Every chain a walk finished is comparable, however it ended (its
    /// end, `MAX_PY_FRAMES` frames, `MAX_VISITED` visited): what the walk wrote depends on the
    /// frames it read and on nothing past the last one's link, and the check reads exactly
    /// those. A walk that failed or found no frame leaves nothing to compare with.
    fn recorded(&mut self, ts: u64, n: Option<usize>) {
        debug_assert!(self.len <= MAX_VISITED);
        self.n = n.unwrap_or(0);
        self.ts = if n.is_some() && self.len > 0 { ts } else { 0 };
    }
}

/// Everything the walk reads from one frame (not from its code object).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct FrameRead {
    frame: u64,
    back: u64,
    code: u64,
    lasti: u64,
    /// `owner` and `is_entry` as one load reads them (3.11+, see `KindWord`), widened: the
    /// chain check compares it with one `xor` from memory.
    kind: u64,
}

/// Frames visited at most per walk (Python frames, sentinels and skipped frames together).
const MAX_VISITED: usize = 4 * MAX_PY_FRAMES;

/// Reads one frame's fields the walk uses.
fn read_frame<M: Mem>(m: &M, l: &Layout, frame: u64) -> Option<FrameRead> {
    let back = m.u64(frame + l.frame_back as u64)?;
    let code = m.u64(frame + l.frame_code as u64)?;
    let (lasti, kind) = match l.model {
        FrameModel::Object { .. } => (m.u32(frame + l.frame_lasti as u64)? as u64, 0),
        FrameModel::Interpreter {
            is_entry, owner, ..
        } => (
            m.u64(frame + l.frame_lasti as u64)?,
            KindWord::of(is_entry, owner).read(m, frame)?,
        ),
    };
    Some(FrameRead {
        frame,
        back,
        code,
        lasti,
        kind,
    })
}

/// Where one 16-bit load reads a 3.11+ frame's `owner` and, beside it, `is_entry` (3.11);
/// where there is no `is_entry`, the byte after `owner` (inside the frame: `localsplus`
/// follows) is masked off. The chain check compares the word as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KindWord {
    at: u64,
    mask: u16,
    /// `owner` is the high byte (`is_entry` precedes it).
    owner_high: bool,
}

impl KindWord {
    #[inline(always)]
    fn of(is_entry: Option<usize>, owner: usize) -> KindWord {
        match is_entry {
            Some(e) if e + 1 == owner => KindWord {
                at: e as u64,
                mask: 0xffff,
                owner_high: true,
            },
            Some(e) if owner + 1 == e => KindWord {
                at: owner as u64,
                mask: 0xffff,
                owner_high: false,
            },
            // No `is_entry`, or one not beside `owner` (no such layout): `owner` alone, and
            // no frame counts as an entry.
            _ => KindWord {
                at: owner as u64,
                mask: 0x00ff,
                owner_high: false,
            },
        }
    }

    #[inline(always)]
    fn read<M: Mem>(self, m: &M, frame: u64) -> Option<u64> {
        let mut b = [0u8; 2];
        m.read(frame + self.at, &mut b)
            .then(|| u64::from(u16::from_le_bytes(b) & self.mask))
    }

    fn owner(self, kind: u64) -> u8 {
        (if self.owner_high { kind >> 8 } else { kind }) as u8
    }

    fn is_entry(self, kind: u64) -> bool {
        self.mask == 0xffff
            && (if self.owner_high {
                kind & 0xff
            } else {
                kind >> 8
            }) != 0
    }
}

/// The first frame of the chain from thread state `ts` (0: none).
fn first_frame<M: Mem>(m: &M, l: &Layout, ts: u64) -> Option<u64> {
    let frame = m.u64(ts + l.ts_frame as u64)?;
    match l.cframe_current {
        Some(_) if frame == 0 => Some(0),
        Some(cur) => m.u64(frame + cur as u64),
        None => Some(frame),
    }
}

/// True if the chain from `ts` reads exactly as the last walk recorded it (plain loads: only
/// once the layout is trusted). The hot path of a loop's allocations: a frame is read only
/// once the chain has led to the address the last walk read it at (each frame's link is
/// compared before the next frame is read), so the loads need none of `Direct`'s checks.
/// A frame costs three loads and the loop's bookkeeping: 14 instructions in the capture with
/// a constant layout (`chain_unchanged`), 15 with one read from the struct (17 reading the
/// recorded frame's address and comparing the kind as 16 bits; 25 before the link-first order
/// and the one-load kind word; 2026-12-05/06, callgrind).
#[inline(always)]
fn unchanged<M: Mem>(m: &M, c: &ChainLayout, last: &LastChain, ts: u64) -> bool {
    if last.ts != ts {
        return false;
    }
    // SAFETY: `len` never exceeds `MAX_VISITED`, the array's length (the walk stops there);
    // a chain that matched its thread state has at least one (`LastChain::recorded`).
    let frames = unsafe { last.frames.get_unchecked(..last.len) };
    let first = &last.frames[0];
    let top = m.u64(ts + c.ts_frame).unwrap_or(0);
    let top = match c.cframe_current {
        Some(cur) if top != 0 => m.u64(top + cur).unwrap_or(0),
        _ => top,
    };
    if top != first.frame {
        return false;
    }
    // `f` follows the live chain, which equals the recorded one up to here: each frame's
    // fields are read from the address its caller's link (or the thread state) gave, the link
    // last, so the next frame's address is the register just loaded (no load of the recorded
    // address, one register less in the loop).
    let mut f = top;
    let mut differ = 0;
    match c.kind {
        // The instruction pointer points into the code object's own bytecode (inline in it
        // since 3.11), so the same pointer is the same code object: its field is not read.
        Some(kind) => {
            let (lasti, back) = (c.lasti, c.back);
            for want in frames {
                differ |= m.u64(f + lasti).unwrap_or(!0) ^ want.lasti;
                differ |= kind.read(m, f).unwrap_or(!0) ^ want.kind;
                f = m.u64(f + back).unwrap_or(!0);
                if f != want.back {
                    return false;
                }
            }
        }
        None => {
            let (code, lasti, back) = (c.code, c.lasti, c.back);
            for want in frames {
                differ |= (m.u64(f + code).unwrap_or(!0) ^ want.code)
                    | (m.u32(f + lasti).map_or(!0, u64::from) ^ want.lasti);
                f = m.u64(f + back).unwrap_or(!0);
                if f != want.back {
                    return false;
                }
            }
        }
    }
    differ == 0
}

/// The fields of `Layout` the chain check reads, as addends, its frame model decided once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChainLayout {
    ts_frame: u64,
    cframe_current: Option<u64>,
    back: u64,
    code: u64,
    lasti: u64,
    /// Interpreter frames (3.11+): their kind word; None: frame objects, whose code and
    /// 32-bit `f_lasti` are compared.
    kind: Option<KindWord>,
}

/// 3.11's and 3.12's chain layouts (`layout::builtin`'s, a test holds them equal) as
/// constants: the check inlined with one of them reads no offset and decides no `Option`, and
/// keeps its loop in registers (the interpreter picks it once, `ChainLayout::fixed`).
const CHAIN_311: ChainLayout = ChainLayout {
    ts_frame: 56,
    cframe_current: Some(8),
    back: 48,
    code: 32,
    lasti: 56,
    kind: Some(KindWord {
        at: 68,
        mask: 0xffff,
        owner_high: true,
    }),
};
const CHAIN_312: ChainLayout = ChainLayout {
    ts_frame: 56,
    cframe_current: Some(0),
    back: 8,
    code: 0,
    lasti: 56,
    kind: Some(KindWord {
        at: 70,
        mask: 0x00ff,
        owner_high: false,
    }),
};

/// Which constant chain layout an interpreter's equals, if any (its `u8` plus one is
/// `Interpreter::check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum FixedChain {
    Py311 = 0,
    Py312 = 1,
    Read = 2,
}

impl FixedChain {
    /// `Interpreter::check` for this layout, once its walks are trusted.
    const fn check(self) -> u8 {
        self as u8 + 1
    }
}

impl ChainLayout {
    fn of(l: &Layout) -> ChainLayout {
        ChainLayout {
            ts_frame: l.ts_frame as u64,
            cframe_current: l.cframe_current.map(|c| c as u64),
            back: l.frame_back as u64,
            code: l.frame_code as u64,
            lasti: l.frame_lasti as u64,
            kind: match l.model {
                FrameModel::Interpreter {
                    is_entry, owner, ..
                } => Some(KindWord::of(is_entry, owner)),
                FrameModel::Object { .. } => None,
            },
        }
    }

    /// The constant this layout equals, field for field (else `Read`: from the struct).
    fn fixed(&self) -> FixedChain {
        if *self == CHAIN_311 {
            FixedChain::Py311
        } else if *self == CHAIN_312 {
            FixedChain::Py312
        } else {
            FixedChain::Read
        }
    }
}

/// [`unchanged`] with the interpreter's chain layout, a constant where it is one; false
/// while its walks are not trusted.
#[inline(always)]
fn chain_unchanged(py: &Interpreter, last: &LastChain, ts: u64) -> bool {
    const PY311: u8 = FixedChain::Py311.check();
    const PY312: u8 = FixedChain::Py312.check();
    const READ: u8 = FixedChain::Read.check();
    match py.check.load(Ordering::Relaxed) {
        PY311 => unchanged(&Known, &CHAIN_311, last, ts),
        PY312 => unchanged(&Known, &CHAIN_312, last, ts),
        READ => unchanged(&Known, &py.chain, last, ts),
        _ => false,
    }
}

const CODE_SLOTS: usize = 1024;

impl ThreadCodes {
    /// Frames the latest walk of this thread put in its `out` (what a [`Walked::Same`] has
    /// there).
    pub fn frames_walked(&self) -> usize {
        self.last.n
    }
}

impl Default for ThreadCodes {
    fn default() -> Self {
        ThreadCodes {
            slots: vec![(0, 0, 0); CODE_SLOTS].into_boxed_slice(),
            last: LastChain {
                ts: 0,
                len: 0,
                // Made on the heap: `Box::new` of the array may build its 20 KiB on the
                // stack first, in a thread's first capture, which must fit in what
                // `CAPTURE_STACK_NEEDED` allows (stack/mod.rs).
                frames: vec![FrameRead::default(); MAX_VISITED]
                    .into_boxed_slice()
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("MAX_VISITED frames")),
                n: 0,
            },
        }
    }
}

/// What [`walk`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walked {
    /// The same frames as the walk before it on this thread (still in `out` from then, and
    /// `n` of them); how the hot path of a loop's allocations learns it in one compare.
    Same,
    /// `n` frames walked into `out` (0: this thread runs no Python now).
    Frames(usize),
}

/// Walks the calling thread's Python frames into `out` (innermost first, encoded as
/// `PyFrame`s).
#[inline(always)]
pub fn walk(
    ob: &Outbox,
    py: &Interpreter,
    codes: &CodeRegistry,
    cache: &mut ThreadCodes,
    out: &mut [u64; MAX_PY_FRAMES],
) -> Walked {
    let ts = match py.read_directly.load(Ordering::Acquire) {
        Some(direct) => direct.thread_state(),
        None => thread_state_asked(py),
    };
    if ts == 0 {
        return Walked::Frames(0);
    }
    if chain_unchanged(py, &cache.last, ts) {
        return Walked::Same;
    }
    Walked::Frames(walk_changed(ob, py, codes, cache, ts, out))
}

/// [`walk`] of a chain not as it was: out of line, the hot path keeps only its check.
#[inline(never)]
fn walk_changed(
    ob: &Outbox,
    py: &Interpreter,
    codes: &CodeRegistry,
    cache: &mut ThreadCodes,
    ts: u64,
    out: &mut [u64; MAX_PY_FRAMES],
) -> usize {
    match py.trust.load(Ordering::Relaxed) {
        TRUSTED => {
            let n = walk_with(&Direct, ob, py, codes, cache, ts, out);
            cache.last.recorded(ts, n);
            n.unwrap_or(0)
        }
        BROKEN => 0,
        _ => match walk_with(&Checked, ob, py, codes, cache, ts, out) {
            Some(0) => 0,
            Some(n) => {
                py.trust.store(TRUSTED, Ordering::Relaxed);
                py.check.store(py.chain.fixed().check(), Ordering::Relaxed);
                n
            }
            None => {
                py.trust.store(BROKEN, Ordering::Relaxed);
                let (ma, mi) = py.layout.version;
                log::warn(&format!(
                    "the frames of Python {ma}.{mi} do not look as expected; \
                     stacks stay native for this process"
                ));
                0
            }
        },
    }
}

/// None: something did not look like the layout says (only reported while unverified).
fn walk_with<M: Mem>(
    m: &M,
    ob: &Outbox,
    py: &Interpreter,
    codes: &CodeRegistry,
    cache: &mut ThreadCodes,
    ts: u64,
    out: &mut [u64; MAX_PY_FRAMES],
) -> Option<usize> {
    let l = &py.layout;
    let mut frame = first_frame(m, l, ts)?;
    let mut n = 0;
    let mut seen = 0;
    cache.last.len = 0;
    while frame != 0 && n < MAX_PY_FRAMES && seen < MAX_VISITED {
        let read = read_frame(m, l, frame)?;
        cache.last.frames[seen] = read;
        seen += 1;
        cache.last.len = seen;
        let back = read.back;
        let mut code = read.code;
        let (offset, group_end) = match l.model {
            FrameModel::Object { lasti_in_units } => {
                let lasti = (read.lasti as u32 as i32).max(0) as u32;
                (if lasti_in_units { lasti * 2 } else { lasti }, true)
            }
            FrameModel::Interpreter {
                is_entry,
                owner,
                owner_cstack,
                tagged_code,
                offset_of_code,
                ..
            } => {
                let kind = KindWord::of(is_entry, owner);
                if kind.owner(read.kind) == owner_cstack {
                    // The sentinel at a loop entry: the frame before it (inner) ended a group.
                    end_group(out, n);
                    frame = back;
                    continue;
                }
                if tagged_code {
                    code &= !7;
                }
                let entry = kind.is_entry(read.kind);
                let ip = read.lasti;
                let start = code + offset_of_code as u64;
                let off = ip.saturating_sub(start).min(u32::MAX as u64) as u32;
                (off, entry)
            }
        };
        // Not a code object (3.13+ frames may run other executables): skip it.
        if code == 0 || m.u64(code + 8)? != py.code_type {
            frame = back;
            continue;
        }
        let id = code_id(m, ob, py, codes, cache, code)?;
        out[n] = PyFrame {
            code: id,
            offset,
            group_end,
        }
        .encode();
        n += 1;
        frame = back;
    }
    // The outermost frame ends the outermost group.
    end_group(out, n);
    Some(n)
}

/// Marks the last of the `n` frames in `out` as the end of an interpreter-loop group.
fn end_group(out: &mut [u64; MAX_PY_FRAMES], n: usize) {
    if n > 0 {
        out[n - 1] |= PyFrame {
            code: 0,
            offset: 0,
            group_end: true,
        }
        .encode();
    }
}

/// The id of the code object at `code`, announcing it on first sight. A code object freed
/// and another allocated at its address is told apart by its file name, name and table.
fn code_id<M: Mem>(
    m: &M,
    ob: &Outbox,
    py: &Interpreter,
    codes: &CodeRegistry,
    cache: &mut ThreadCodes,
    code: u64,
) -> Option<u32> {
    let l = &py.layout;
    let filename = m.u64(code + l.co_filename as u64)?;
    let name = m.u64(code + l.co_name as u64)?;
    let table = m.u64(code + l.co_linetable as u64)?;
    let check = filename ^ name.rotate_left(21) ^ table.rotate_left(42);
    let slot = ((code >> 4) as usize ^ (code >> 14) as usize) & (CODE_SLOTS - 1);
    let e = cache.slots[slot];
    if e.0 == code && e.1 == check && e.2 != 0 {
        return Some(e.2);
    }
    let id = {
        let mut map = codes.by_addr.lock().ok()?;
        match map.get(&code) {
            Some(&(c, id)) if c == check => id,
            _ => {
                let def = read_code(m, py, code, filename, name, table)?;
                let id = codes.next_id.fetch_add(1, Ordering::Relaxed) + 1;
                if id > MAX_CODE_ID {
                    return None;
                }
                if !ob.send_reliable(Msg::Code(Box::new(CodeDef { id, ..def }))) {
                    return None;
                }
                map.insert(code, (check, id));
                id
            }
        }
    };
    cache.slots[slot] = (code, check, id);
    Some(id)
}

fn read_code<M: Mem>(
    m: &M,
    py: &Interpreter,
    code: u64,
    filename: u64,
    name: u64,
    table: u64,
) -> Option<CodeDef> {
    let l = &py.layout;
    Some(CodeDef {
        id: 0,
        format: l.table_format as u8,
        first_line: m.u32(code + l.co_firstlineno as u64)?,
        filename: read_str(m, py, filename)?,
        name: read_str(m, py, name)?,
        line_table: read_bytes(m, py, table)?,
    })
}

fn read_str<M: Mem>(m: &M, py: &Interpreter, s: u64) -> Option<String> {
    let l = &py.layout;
    if m.u64(s + 8)? != py.unicode_type {
        return None;
    }
    let len = (m.u64(s + l.str_length as u64)? as usize).min(MAX_NAME);
    let state = m.u32(s + l.str_state as u64)?;
    let kind = ((state >> 2) & 7) as usize;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return Some("?".into()); // legacy string layout: not worth the code
    }
    let data = s + if ascii {
        l.str_ascii_size
    } else {
        l.str_compact_size
    } as u64;
    let mut raw = vec![0u8; len * kind];
    if !m.read(data, &mut raw) {
        return None;
    }
    Some(match kind {
        1 => raw.iter().map(|&b| b as char).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('?'))
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    })
}

fn read_bytes<M: Mem>(m: &M, py: &Interpreter, b: u64) -> Option<Vec<u8>> {
    let l = &py.layout;
    if m.u64(b + 8)? != py.bytes_type {
        return None;
    }
    let len = m.u64(b + l.bytes_size as u64)? as usize;
    if len > MAX_TABLE {
        return Some(Vec::new());
    }
    let mut out = vec![0u8; len];
    m.read(b + l.bytes_data as u64, &mut out).then_some(out)
}

#[cfg(test)]
mod tests {
    //! The walk over a fake memory image: a CPython 3.11 thread state, two frames, their code
    //! objects, names and line tables, at made-up addresses.

    use super::*;
    use crate::transport::Outbox;

    /// Regions of fake memory; a read must fall inside one.
    #[derive(Default)]
    struct FakeMem {
        regions: Vec<(u64, Vec<u8>)>,
    }

    impl FakeMem {
        fn put(&mut self, addr: u64, bytes: &[u8]) {
            for (base, data) in &mut self.regions {
                if addr >= *base && addr + bytes.len() as u64 <= *base + data.len() as u64 {
                    let at = (addr - *base) as usize;
                    data[at..at + bytes.len()].copy_from_slice(bytes);
                    return;
                }
            }
            panic!("no region at {addr:#x}");
        }
        fn region(&mut self, base: u64, len: usize) {
            self.regions.push((base, vec![0; len]));
        }
        fn set_u64(&mut self, addr: u64, v: u64) {
            self.put(addr, &v.to_le_bytes());
        }
        fn set_u32(&mut self, addr: u64, v: u32) {
            self.put(addr, &v.to_le_bytes());
        }
        fn set_u8(&mut self, addr: u64, v: u8) {
            self.put(addr, &[v]);
        }
    }

    impl Mem for FakeMem {
        fn read(&self, addr: u64, out: &mut [u8]) -> bool {
            self.regions.iter().any(|(base, data)| {
                let end = *base + data.len() as u64;
                if addr >= *base && addr + out.len() as u64 <= end {
                    let at = (addr - *base) as usize;
                    out.copy_from_slice(&data[at..at + out.len()]);
                    true
                } else {
                    false
                }
            })
        }
    }

    const CODE_TYPE: u64 = 0xC0DE_0000;
    const UNICODE_TYPE: u64 = 0x5717_0000;
    const BYTES_TYPE: u64 = 0xB17E_0000;

    unsafe extern "C" fn no_thread_state() -> *mut c_void {
        std::ptr::null_mut()
    }

    fn interpreter_311() -> Interpreter {
        let layout = layout::builtin(3, 11).unwrap();
        Interpreter {
            layout,
            chain: ChainLayout::of(&layout),
            check: AtomicU8::new(NO_CHECK),
            this_thread_state: no_thread_state,
            is_finalizing: None,
            finalizing_word: None,
            runtime: 0,
            read_directly: ReadDirectlyCell::default(),
            thread_state_key_searched: AtomicBool::new(false),
            code_type: CODE_TYPE,
            unicode_type: UNICODE_TYPE,
            bytes_type: BYTES_TYPE,
            trust: AtomicU8::new(UNVERIFIED),
        }
    }

    /// An ASCII str object at `at`.
    fn put_str(m: &mut FakeMem, l: &Layout, at: u64, s: &str) {
        m.region(at, 256);
        m.set_u64(at + 8, UNICODE_TYPE);
        m.set_u64(at + l.str_length as u64, s.len() as u64);
        // kind 1, compact, ascii
        m.set_u32(at + l.str_state as u64, (1 << 2) | (1 << 5) | (1 << 6));
        m.put(at + l.str_ascii_size as u64, s.as_bytes());
    }

    /// A code object at `at` named `name` in `file`, first line `line`.
    fn put_code(m: &mut FakeMem, l: &Layout, at: u64, file: &str, name: &str, line: u32) {
        m.region(at, 512);
        m.set_u64(at + 8, CODE_TYPE);
        put_str(m, l, at + 0x1000, file);
        put_str(m, l, at + 0x2000, name);
        m.region(at + 0x3000, 64);
        m.set_u64(at + 0x3000 + 8, BYTES_TYPE);
        m.set_u64(at + 0x3000 + l.bytes_size as u64, 3);
        m.put(at + 0x3000 + l.bytes_data as u64, &[1, 2, 3]);
        m.set_u64(at + l.co_filename as u64, at + 0x1000);
        m.set_u64(at + l.co_name as u64, at + 0x2000);
        m.set_u64(at + l.co_linetable as u64, at + 0x3000);
        m.set_u32(at + l.co_firstlineno as u64, line);
    }

    /// Thread state -> cframe -> inner frame -> outer frame (the loop entry), 3.11 style.
    fn fake_311(l: &Layout) -> (FakeMem, u64) {
        let FrameModel::Interpreter {
            is_entry,
            owner,
            offset_of_code,
            ..
        } = l.model
        else {
            panic!("3.11 has interpreter frames")
        };
        let mut m = FakeMem::default();
        let (ts, cframe, inner, outer) = (0x10_000u64, 0x11_000u64, 0x20_000u64, 0x21_000u64);
        let (code_a, code_b) = (0x100_000u64, 0x200_000u64);
        m.region(ts, 256);
        m.region(cframe, 64);
        m.region(inner, 128);
        m.region(outer, 128);
        m.set_u64(ts + l.ts_frame as u64, cframe);
        m.set_u64(cframe + l.cframe_current.unwrap() as u64, inner);
        for (frame, back, code, instr, entry) in [
            (inner, outer, code_a, 10u64, 0u8),
            (outer, 0, code_b, 24, 1),
        ] {
            m.set_u64(frame + l.frame_back as u64, back);
            m.set_u64(frame + l.frame_code as u64, code);
            m.set_u64(
                frame + l.frame_lasti as u64,
                code + offset_of_code as u64 + instr,
            );
            m.set_u8(frame + is_entry.unwrap() as u64, entry);
            m.set_u8(frame + owner as u64, 0);
        }
        put_code(&mut m, l, code_a, "train.py", "Model.forward", 7);
        put_code(&mut m, l, code_b, "train.py", "main", 40);
        (m, ts)
    }

    fn code_defs(rx: &crate::transport::Receiver) -> Vec<CodeDef> {
        rx.try_iter()
            .filter_map(|m| match m {
                Msg::Code(def) => Some(*def),
                _ => None,
            })
            .collect()
    }

    /// The constant chain layouts are the builtin ones, field for field: the check inlined
    /// with a constant reads what the layout says.
    #[test]
    fn constant_chain_layouts_are_the_builtin_ones() {
        let of = |minor| ChainLayout::of(&layout::builtin(3, minor).unwrap());
        assert_eq!(of(11), CHAIN_311);
        assert_eq!(of(12), CHAIN_312);
        assert_eq!(of(11).fixed(), FixedChain::Py311);
        assert_eq!(of(12).fixed(), FixedChain::Py312);
        assert_eq!(of(10).fixed(), FixedChain::Read);
        assert_eq!(of(9).fixed(), FixedChain::Read);
    }

    #[test]
    fn walks_a_fake_python_311_frame_chain() {
        let py = interpreter_311();
        let (m, ts) = fake_311(&py.layout);
        let (ob, rx) = Outbox::create(64, std::process::id());
        let codes = CodeRegistry::default();
        let mut cache = ThreadCodes::default();
        let mut out = [0u64; MAX_PY_FRAMES];
        let n = walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out).unwrap();
        assert_eq!(n, 2);
        let frames: Vec<PyFrame> = out[..n]
            .iter()
            .map(|&f| PyFrame::decode(f).unwrap())
            .collect();
        // Innermost first; offsets from the start of the bytecode; the loop entry (and the
        // outermost frame) ends a group.
        assert_eq!(
            (frames[0].code, frames[0].offset, frames[0].group_end),
            (1, 10, false)
        );
        assert_eq!(
            (frames[1].code, frames[1].offset, frames[1].group_end),
            (2, 24, true)
        );
        let defs = code_defs(&rx);
        assert_eq!(defs.len(), 2);
        assert_eq!((defs[0].id, defs[0].name.as_str()), (1, "Model.forward"));
        assert_eq!(
            (defs[0].filename.as_str(), defs[0].first_line),
            ("train.py", 7)
        );
        assert_eq!(defs[0].line_table, [1, 2, 3]);
        assert_eq!(
            (defs[1].id, defs[1].name.as_str(), defs[1].first_line),
            (2, "main", 40)
        );
        // A second walk finds the same ids and announces nothing new.
        let n = walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out).unwrap();
        assert_eq!(n, 2);
        assert!(code_defs(&rx).is_empty());
    }

    #[test]
    fn a_frame_that_is_not_a_code_object_is_skipped_and_a_bad_pointer_fails_the_walk() {
        let py = interpreter_311();
        let l = py.layout;
        let (mut m, ts) = fake_311(&l);
        // The outer frame runs something that is not a code object.
        m.set_u64(0x200_000 + 8, 0xDEAD_0000);
        let (ob, _rx) = Outbox::create(64, std::process::id());
        let codes = CodeRegistry::default();
        let mut cache = ThreadCodes::default();
        let mut out = [0u64; MAX_PY_FRAMES];
        let n = walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out).unwrap();
        assert_eq!(n, 1);
        // A frame pointer into unmapped memory: the walk reports that the layout is wrong.
        m.set_u64(0x20_000 + l.frame_back as u64, 0x9999_0000);
        assert!(walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out).is_none());
        // No thread state frame: no Python frames.
        m.set_u64(0x11_000 + l.cframe_current.unwrap() as u64, 0);
        assert_eq!(
            walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out),
            Some(0)
        );
    }

    #[test]
    fn the_chain_reads_unchanged_until_a_frame_moves_to_another_instruction_or_kind() {
        let py = interpreter_311();
        let l = py.layout;
        let FrameModel::Interpreter {
            is_entry, owner, ..
        } = l.model
        else {
            panic!("3.11 has interpreter frames")
        };
        // 3.11's `is_entry` and `owner` are read in one load.
        assert_eq!(KindWord::of(is_entry, owner).mask, 0xffff);
        let (mut m, ts) = fake_311(&l);
        let (ob, _rx) = Outbox::create(64, std::process::id());
        let codes = CodeRegistry::default();
        let mut cache = ThreadCodes::default();
        let mut out = [0u64; MAX_PY_FRAMES];
        assert_eq!(
            walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out),
            Some(2)
        );
        cache.last.recorded(ts, Some(2));
        assert!(unchanged(&m, &py.chain, &cache.last, ts));
        assert!(
            !unchanged(&m, &py.chain, &cache.last, ts + 8),
            "another thread state"
        );
        let (inner, outer) = (0x20_000u64, 0x21_000u64);
        // Each field the walk depends on, changed alone, then put back.
        let fields = [
            (
                outer + l.frame_lasti as u64,
                8,
                "the outer frame's instruction",
            ),
            (
                inner + l.frame_lasti as u64,
                8,
                "the inner frame's instruction",
            ),
            (inner + l.frame_back as u64, 8, "the inner frame's link"),
            (
                outer + is_entry.unwrap() as u64,
                1,
                "the outer frame's entry flag",
            ),
            (inner + owner as u64, 1, "the inner frame's owner"),
        ];
        for (at, width, what) in fields {
            let mut was = [0u8; 8];
            assert!(m.read(at, &mut was[..width]));
            let mut changed = was;
            changed[0] ^= 0x40;
            m.put(at, &changed[..width]);
            assert!(!unchanged(&m, &py.chain, &cache.last, ts), "{what} changed");
            m.put(at, &was[..width]);
            assert!(unchanged(&m, &py.chain, &cache.last, ts), "{what} put back");
        }
        // The thread's first frame replaced by another.
        m.set_u64(0x11_000 + l.cframe_current.unwrap() as u64, outer);
        assert!(!unchanged(&m, &py.chain, &cache.last, ts));
    }

    /// A chain deeper than the frames a stack keeps: the walk keeps the innermost
    /// `MAX_PY_FRAMES`, and the check compares exactly those (a deep recursion's loop stays on
    /// the hot path); a change in a kept frame is still seen, one past them changes nothing.
    #[test]
    fn a_chain_deeper_than_the_frames_kept_is_compared_up_to_them() {
        let py = interpreter_311();
        let l = py.layout;
        let FrameModel::Interpreter { offset_of_code, .. } = l.model else {
            panic!("3.11 has interpreter frames")
        };
        let (mut m, ts) = fake_311(&l);
        let code = 0x100_000u64;
        let depth = MAX_PY_FRAMES as u64 + 3;
        let frame_at = |i: u64| 0x40_000 + i * 0x100;
        for i in 0..depth {
            let f = frame_at(i);
            m.region(f, 128);
            let back = if i + 1 < depth { frame_at(i + 1) } else { 0 };
            m.set_u64(f + l.frame_back as u64, back);
            m.set_u64(f + l.frame_code as u64, code);
            m.set_u64(f + l.frame_lasti as u64, code + offset_of_code as u64 + 10);
        }
        m.set_u64(0x11_000 + l.cframe_current.unwrap() as u64, frame_at(0));
        let (ob, _rx) = Outbox::create(64, std::process::id());
        let codes = CodeRegistry::default();
        let mut cache = ThreadCodes::default();
        let mut out = [0u64; MAX_PY_FRAMES];
        let n = walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out);
        assert_eq!(n, Some(MAX_PY_FRAMES));
        cache.last.recorded(ts, n);
        assert!(unchanged(&m, &py.chain, &cache.last, ts));
        // The frame after the last one kept: not read, not compared.
        let past = frame_at(MAX_PY_FRAMES as u64) + l.frame_lasti as u64;
        m.set_u64(past, code + offset_of_code as u64 + 12);
        assert!(unchanged(&m, &py.chain, &cache.last, ts));
        // The last frame kept.
        let kept = frame_at(MAX_PY_FRAMES as u64 - 1) + l.frame_lasti as u64;
        m.set_u64(kept, code + offset_of_code as u64 + 12);
        assert!(!unchanged(&m, &py.chain, &cache.last, ts));
    }

    /// The thread-state key is asked only while its `Py_tss_t` says it is created.
    #[test]
    fn the_thread_state_key_is_asked_only_while_created() {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a key of our own, deleted below.
        assert_eq!(unsafe { libc::pthread_key_create(&mut key, None) }, 0);
        let value = 0x5eed_0000usize;
        // SAFETY: the key just created.
        let set = unsafe { libc::pthread_setspecific(key, value as *const c_void) };
        assert_eq!(set, 0);
        let tss = PyTss {
            created: AtomicU32::new(1),
            key: AtomicU32::new(key),
        };
        assert_eq!(tss.this_thread(), value as u64);
        // Another thread has no value for it.
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(tss.this_thread(), 0));
        });
        tss.created.store(0, Ordering::Relaxed);
        assert_eq!(tss.this_thread(), 0, "deleted at exit, not made again");
        // SAFETY: our own key, no longer used.
        assert_eq!(unsafe { libc::pthread_key_delete(key) }, 0);
    }

    /// A walk that found no frame leaves nothing for the check to match.
    #[test]
    fn a_walk_with_no_frame_is_never_matched() {
        let py = interpreter_311();
        let l = py.layout;
        let (mut m, ts) = fake_311(&l);
        m.set_u64(0x11_000 + l.cframe_current.unwrap() as u64, 0);
        let (ob, _rx) = Outbox::create(64, std::process::id());
        let codes = CodeRegistry::default();
        let mut cache = ThreadCodes::default();
        let mut out = [0u64; MAX_PY_FRAMES];
        let n = walk_with(&m, ob, &py, &codes, &mut cache, ts, &mut out);
        assert_eq!(n, Some(0));
        cache.last.recorded(ts, n);
        assert!(!unchanged(&m, &py.chain, &cache.last, ts));
    }

    /// The kind word of 3.11 (`is_entry` before `owner`) and of 3.12+ (`owner` alone, the
    /// byte after it masked off) reads each frame's owner and entry flag as the two bytes say.
    #[test]
    fn the_kind_word_reads_owner_and_entry_of_each_layout() {
        let mut m = FakeMem::default();
        let frame = 0x30_000u64;
        m.region(frame, 128);
        // 3.11: is_entry 68, owner 69.
        let k311 = KindWord::of(Some(68), 69);
        m.set_u8(frame + 68, 1);
        m.set_u8(frame + 69, 2);
        let w = k311.read(&m, frame).unwrap();
        assert_eq!((k311.owner(w), k311.is_entry(w)), (2, true));
        m.set_u8(frame + 68, 0);
        let w = k311.read(&m, frame).unwrap();
        assert_eq!((k311.owner(w), k311.is_entry(w)), (2, false));
        // 3.12: owner 70, no is_entry; whatever follows owner does not count.
        let k312 = KindWord::of(None, 70);
        m.set_u8(frame + 70, 3);
        m.set_u8(frame + 71, 0x5a);
        let w = k312.read(&m, frame).unwrap();
        assert_eq!((k312.owner(w), k312.is_entry(w)), (3, false));
        m.set_u8(frame + 71, 0x11);
        assert_eq!(
            k312.read(&m, frame),
            Some(w),
            "the byte after owner is masked off"
        );
        // An entry flag after owner.
        let after = KindWord::of(Some(71), 70);
        let w = after.read(&m, frame).unwrap();
        assert_eq!((after.owner(w), after.is_entry(w)), (3, true));
    }
}
