//! The shim's own descriptor, kept apart from the program's: the libc functions that close or
//! replace descriptors (`close`, `close_range`, `closefrom`, `dup2`, `dup3`) are interposed
//! here.
//!
//! Why: the drain thread keeps one descriptor open for the whole run (the collector's socket,
//! or the trace file it writes itself). Daemons, sandboxes and launchers close every
//! descriptor above 2 and then open their own file, socket or pipe, which gets the freed
//! number. A shim that went on writing to "its" number would put trace frames into the
//! program's file or socket, and one that closed it after a failed write would close the
//! program's file. So:
//!
//! - The descriptor is made inside a *window* (the guard's lock held, every close-family call
//!   sent to the slow path), moved to a high number with `F_DUPFD_CLOEXEC` (below the soft
//!   `RLIMIT_NOFILE`, never raising it; where the limit is tiny it stays where it is), and its
//!   identity (device, inode, file type: `fstat`) is remembered. The drain thread's short-lived
//!   descriptors (`/proc` reads) are opened and closed inside a window too.
//! - The hooks below cost one atomic load and a compare for any other descriptor, between two
//!   counts of the calls in flight (`IN_FLIGHT`): a window opens only once every call that
//!   looked before it opened has returned. A call that
//!   would close or replace ours takes the lock, marks ours taken, then makes the real call;
//!   the drain thread holds the same lock around each non-blocking write (`Owned::sys`), so a
//!   write can never land after the program's close. Under the lock it also checks the
//!   identity first, which catches what bypasses the hooks (a raw `syscall(SYS_close)`, a close
//!   inside libc). A taken descriptor is never written to or closed again.
//! - The real functions are found with `dlsym(RTLD_NEXT)` (the raw system call if none is);
//!   their results and `errno` reach the caller unchanged. Calls from another process that
//!   shares our memory (a `vfork` child) never mark anything: its descriptor table is its own.
//! - The lock is never held across anything that blocks; a hook that cannot get it within
//!   `LOCK_GIVE_UP` goes on without it (never hang the program). Such a hook, while a window
//!   is open, may close a descriptor of the window's and let the program reuse its number: it
//!   counts itself (`GAVE_UP`), and the window's own descriptors ([`read_own`]) are then not
//!   closed (a leak of one descriptor, never the program's close). Seen once in a test run of
//!   60 programs at once on a loaded 2-core machine: the program's pipe, which got the number
//!   of a `/proc` file the drain thread was reading, was closed under it.

use std::cell::Cell;
use std::ffi::{c_int, c_uint, CStr};
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::cache_line::CacheLine;
use crate::symbols;

/// `WATCH` when the shim owns no descriptor.
const NONE: i32 = i32::MIN;
/// `WATCH` while a window is open: every close-family call takes the slow path.
const EVERY: i32 = i32::MIN + 1;

/// What the hooks compare with: our descriptor, `NONE`, or `EVERY`.
static WATCH: AtomicI32 = AtomicI32::new(NONE);
/// The descriptor the shim owns (`NONE`: none, or the program took it).
static OWNED: AtomicI32 = AtomicI32::new(NONE);
/// Bumped at every new owned descriptor, so that an old handle never acts on a new one.
static OWNED_GEN: AtomicU64 = AtomicU64::new(0);
/// The owned descriptor's identity, for the fork child (which has no handle).
static OWNED_DEV: AtomicU64 = AtomicU64::new(0);
static OWNED_INO: AtomicU64 = AtomicU64::new(0);
static OWNED_MODE: AtomicU32 = AtomicU32::new(0);
/// The process the descriptor and windows belong to.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
/// A window is open.
static WINDOW: AtomicBool = AtomicBool::new(false);
/// The guard's lock: taken by the drain thread around every write, so on a line of its own
/// (beside the hooks' mode it made every hook wait for the line; `#[used]`: see `cache_line.rs`).
#[used]
static LOCKED: CacheLine<AtomicBool> = CacheLine(AtomicBool::new(false));

thread_local! {
    /// This thread holds the lock (a close made inside a window, or by a signal handler that
    /// interrupted a hook, must not wait for itself). `const`, no destructor.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// A hook that cannot get the lock within this long goes on without it.
const LOCK_GIVE_UP: Duration = Duration::from_secs(2);
/// Hooks that went on without the lock while a window was open (module comment).
static GAVE_UP: AtomicU64 = AtomicU64::new(0);
/// Close-family calls on the fast path, from their look at `WATCH` to the end of the real
/// call. A window opens only once none is left: a call that had looked before the window
/// said `EVERY` would otherwise close the descriptor the window is about to make, and the
/// program reuse its number (`Owned::create` then took the program's pipe for its socket and
/// closed it while moving it high: the program's next write failed with EBADF, about one run
/// in 100 of programs that close every descriptor right after their first CUDA calls).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// How long a window waits for the calls in flight before it gives up opening (its caller
/// then makes nothing, as when the lock could not be had).
const FLIGHT_WAIT: Duration = Duration::from_millis(200);

/// One close-family call on the fast path (see `IN_FLIGHT`): counted from before its look at
/// `WATCH`; dropped when its real call returned, or before it takes the slow path.
struct Flight;

impl Flight {
    #[inline]
    fn start() -> Flight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        Flight
    }
}

impl Drop for Flight {
    #[inline]
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held lock; released when dropped (also on unwind).
struct Held {
    /// False for a nested acquisition (this thread already holds it) or a hook that gave up.
    took: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.took {
            let _ = HOLDING.try_with(|h| h.set(false));
            LOCKED.store(false, Ordering::Release);
        }
    }
}

/// Takes the lock; None after `LOCK_GIVE_UP` without it. Spins and yields: it is held only
/// for a non-blocking system call or two (or a `/proc` read).
fn lock() -> Option<Held> {
    if HOLDING.try_with(Cell::get).unwrap_or(false) {
        return Some(Held { took: false });
    }
    let mut spins = 0u32;
    let mut since = None;
    while LOCKED
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            let start = *since.get_or_insert_with(Instant::now);
            if start.elapsed() >= LOCK_GIVE_UP {
                return None;
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else {
            std::hint::spin_loop();
        }
    }
    let _ = HOLDING.try_with(|h| h.set(true));
    Some(Held { took: true })
}

/// Whether a call on `fd` may touch what the shim owns.
#[inline]
fn watched(fd: c_int) -> bool {
    let w = WATCH.load(Ordering::SeqCst);
    w == fd || w == EVERY
}

/// Whether a call on `first..=last` may touch what the shim owns.
#[inline]
fn watched_range(first: c_uint, last: c_uint) -> bool {
    let w = WATCH.load(Ordering::SeqCst);
    w == EVERY || (w >= 0 && first <= w as c_uint && w as c_uint <= last)
}

fn rewatch() {
    let w = if WINDOW.load(Ordering::SeqCst) {
        EVERY
    } else {
        OWNED.load(Ordering::SeqCst)
    };
    WATCH.store(w, Ordering::SeqCst);
}

fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// In the slow path, under the lock: the program is closing or replacing the descriptors for
/// which `hit` is true. Ours among them is taken: never written to or closed by us again.
fn mark_taken_if(hit: impl Fn(c_int) -> bool) {
    let owned = OWNED.load(Ordering::SeqCst);
    if owned >= 0 && hit(owned) {
        OWNED.store(NONE, Ordering::SeqCst);
        rewatch();
    }
}

/// The slow path of a hook: the lock (unless it cannot be had), and, for a call of the
/// process that owns our descriptor, `mark` before or after the real `call`. Returns the real
/// call's result; `errno` is the real call's (nothing here sets it after the call).
fn slow<R>(
    mark_before: bool,
    mark: impl Fn(&R) -> bool,
    hit: impl Fn(c_int) -> bool,
    call: impl FnOnce() -> R,
) -> R {
    if OWNER_PID.load(Ordering::SeqCst) != getpid() {
        // A vfork child (or anything else sharing our memory): its descriptor table is not
        // ours to mark.
        return call();
    }
    let _held = lock();
    if _held.is_none() && WINDOW.load(Ordering::SeqCst) {
        GAVE_UP.fetch_add(1, Ordering::SeqCst);
    }
    if mark_before {
        mark_taken_if(&hit);
        return call();
    }
    let r = call();
    if mark(&r) {
        mark_taken_if(&hit);
    }
    r
}

// The real functions: glibc's, found once with dlsym(RTLD_NEXT); the raw system call when
// there is none (never our own export).
static REAL_CLOSE: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSE_RANGE: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSEFROM: AtomicUsize = AtomicUsize::new(0);
static REAL_DUP2: AtomicUsize = AtomicUsize::new(0);
static REAL_DUP3: AtomicUsize = AtomicUsize::new(0);

/// The next definition of `name` (1: none; 0: not looked up yet).
fn real(slot: &AtomicUsize, name: &CStr) -> Option<usize> {
    let mut p = slot.load(Ordering::Relaxed);
    if p == 0 {
        let found = symbols::real_dlsym(libc::RTLD_NEXT, name) as usize;
        p = if found == 0 || symbols::is_ours(found) {
            1
        } else {
            found
        };
        slot.store(p, Ordering::Relaxed);
    }
    (p != 1).then_some(p)
}

fn real_close(fd: c_int) -> c_int {
    match real(&REAL_CLOSE, c"close") {
        // SAFETY: glibc's close, with the caller's argument.
        Some(f) => unsafe { std::mem::transmute::<usize, extern "C" fn(c_int) -> c_int>(f)(fd) },
        // SAFETY: the close system call; it sets errno like close.
        None => unsafe { libc::syscall(libc::SYS_close, fd) as c_int },
    }
}

/// `close`: interposed so that the program's close of the shim's descriptor is seen before
/// the number can be reused (see the module doc).
#[unsafe(no_mangle)]
pub extern "C" fn close(fd: c_int) -> c_int {
    let flight = Flight::start();
    if !watched(fd) {
        return real_close(fd);
    }
    drop(flight);
    // Linux releases the number whatever close returns: taken before the call.
    slow(true, |_| false, |o| o == fd, || real_close(fd))
}

/// `close_range`: as `close`, for a range. With `CLOSE_RANGE_CLOEXEC` nothing is closed, and
/// with `CLOSE_RANGE_UNSHARE` the caller closes in a table of its own (the drain thread keeps
/// the shared one): neither takes the shim's descriptor.
#[unsafe(no_mangle)]
pub extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let call = || match real(&REAL_CLOSE_RANGE, c"close_range") {
        // SAFETY: glibc's close_range, with the caller's arguments.
        Some(f) => unsafe {
            std::mem::transmute::<usize, extern "C" fn(c_uint, c_uint, c_int) -> c_int>(f)(
                first, last, flags,
            )
        },
        // SAFETY: the close_range system call; it sets errno like close_range.
        None => unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int },
    };
    let keeps = (flags as c_uint & (libc::CLOSE_RANGE_CLOEXEC | libc::CLOSE_RANGE_UNSHARE)) != 0;
    let flight = Flight::start();
    if keeps || !watched_range(first, last) {
        return call();
    }
    drop(flight);
    // Marked after a success only: a failed close_range (EINVAL) closes nothing.
    slow(
        false,
        |&r| r == 0,
        |o| first <= o as c_uint && o as c_uint <= last,
        call,
    )
}

/// `closefrom`: as `close`, for everything from `low` up.
#[unsafe(no_mangle)]
pub extern "C" fn closefrom(low: c_int) {
    let call = || match real(&REAL_CLOSEFROM, c"closefrom") {
        // SAFETY: glibc's closefrom, with the caller's argument.
        Some(f) => unsafe { std::mem::transmute::<usize, extern "C" fn(c_int)>(f)(low) },
        None => {
            // SAFETY: the close_range system call on [low, ~0U], which is what closefrom does.
            unsafe { libc::syscall(libc::SYS_close_range, low as c_uint, c_uint::MAX, 0) };
        }
    };
    let flight = Flight::start();
    if !watched_range(low.max(0) as c_uint, c_uint::MAX) {
        return call();
    }
    drop(flight);
    slow(true, |_| false, |o| o >= low, call)
}

/// `dup2`: replacing the shim's descriptor with another takes it.
#[unsafe(no_mangle)]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let call = || match real(&REAL_DUP2, c"dup2") {
        // SAFETY: glibc's dup2, with the caller's arguments.
        Some(f) => unsafe {
            std::mem::transmute::<usize, extern "C" fn(c_int, c_int) -> c_int>(f)(old, new)
        },
        // dup2(fd, fd) is fd if it is open (EBADF from fcntl otherwise).
        // SAFETY: fcntl only reads the descriptor's flags.
        None if old == new => match unsafe { libc::fcntl(old, libc::F_GETFD) } {
            -1 => -1,
            _ => old,
        },
        // SAFETY: the dup3 system call without flags is dup2 for two different numbers.
        None => unsafe { libc::syscall(libc::SYS_dup3, old, new, 0) as c_int },
    };
    let flight = Flight::start();
    if !watched(new) {
        return call();
    }
    drop(flight);
    // Marked after a success: a failed dup2 (a bad `old`) leaves `new` as it was.
    slow(false, |&r| r >= 0 && old != new, |o| o == new, call)
}

/// `dup3`: as `dup2`.
#[unsafe(no_mangle)]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let call = || match real(&REAL_DUP3, c"dup3") {
        // SAFETY: glibc's dup3, with the caller's arguments.
        Some(f) => unsafe {
            std::mem::transmute::<usize, extern "C" fn(c_int, c_int, c_int) -> c_int>(f)(
                old, new, flags,
            )
        },
        // SAFETY: the dup3 system call; it sets errno like dup3.
        None => unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) as c_int },
    };
    let flight = Flight::start();
    if !watched(new) {
        return call();
    }
    drop(flight);
    slow(false, |&r| r >= 0, |o| o == new, call)
}

/// What a descriptor is: device, inode and file type (`fstat`). A socket is on the socket
/// filesystem with an inode of its own, so a new socket never matches an old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    dev: u64,
    ino: u64,
    kind: u32,
}

impl Identity {
    pub(super) fn of(fd: RawFd) -> std::io::Result<Identity> {
        // SAFETY: stat is plain data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes only into `st`.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Identity {
            dev: st.st_dev,
            ino: st.st_ino,
            kind: st.st_mode & libc::S_IFMT,
        })
    }
}

/// Why an operation on the shim's descriptor was not made: the program closed or replaced it.
#[derive(Debug)]
pub(super) struct Taken(RawFd);

impl std::fmt::Display for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the program closed or replaced the shim's own descriptor {}",
            self.0
        )
    }
}

impl std::error::Error for Taken {}

/// The error of an operation on a descriptor the program took.
pub(super) fn taken_error(fd: RawFd) -> std::io::Error {
    std::io::Error::other(Taken(fd))
}

/// Whether `e` says the program took the descriptor.
pub(super) fn is_taken(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Taken>())
}

/// An open window: the lock held, every close-family call on the slow path. Closed (and the
/// lock released) when dropped, also on unwind.
struct Window {
    _held: Held,
}

impl Window {
    fn open() -> Option<Window> {
        let held = lock()?;
        if !held.took {
            // Already inside a window (or holding the lock) on this thread.
            return Some(Window { _held: held });
        }
        OWNER_PID.store(getpid(), Ordering::SeqCst);
        WINDOW.store(true, Ordering::SeqCst);
        rewatch();
        let window = Window { _held: held };
        // Calls that looked at `WATCH` before it said EVERY finish first (`IN_FLIGHT`).
        let start = Instant::now();
        while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
            if start.elapsed() >= FLIGHT_WAIT {
                return None; // closes the window (its drop) and releases the lock
            }
            std::thread::yield_now();
        }
        Some(window)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if self._held.took {
            WINDOW.store(false, Ordering::SeqCst);
            rewatch();
        }
    }
}

/// A window held until the value is dropped (None when the lock could not be had): for a
/// span of the drain thread's own code that `transient` cannot wrap in a closure.
pub(super) fn hold() -> Option<impl Drop> {
    Window::open()
}

/// Runs `f`, which opens and closes descriptors of its own (reads a `/proc` file), so that the
/// program cannot close one of them and have the shim then read or close the program's.
/// None when the lock could not be had.
pub(crate) fn transient<R>(f: impl FnOnce() -> R) -> Option<R> {
    let _w = Window::open()?;
    Some(f())
}

/// Reads the file at `path` whole with a descriptor of the drain thread's own (a `/proc`
/// file), in a window. The descriptor is closed only if it is still the file opened and no
/// hook went on without the lock meanwhile; otherwise it is left open (module comment). None
/// when the lock could not be had.
pub(crate) fn read_own(path: &std::path::Path) -> Option<std::io::Result<Vec<u8>>> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let _w = Window::open()?;
    let gave_up = GAVE_UP.load(Ordering::SeqCst);
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return Some(Err(e)),
    };
    let identity = Identity::of(file.as_raw_fd()).ok();
    let mut buf = Vec::new();
    let read = file.read_to_end(&mut buf);
    close_own(file.into_raw_fd(), identity, gave_up);
    Some(read.map(|_| buf))
}

/// Closes `fd`, a window's own descriptor opened as `identity` when `GAVE_UP` read
/// `gave_up`, if it still is that and no hook has gone on without the lock since.
fn close_own(fd: RawFd, identity: Option<Identity>, gave_up: u64) {
    if GAVE_UP.load(Ordering::SeqCst) == gave_up
        && identity.is_some()
        && Identity::of(fd).ok() == identity
    {
        real_close(fd);
    }
}

/// How many descriptors the process could still open below its soft `RLIMIT_NOFILE`, and
/// that limit (None for no limit, or when it cannot be told). Counted once, when tracing
/// would start: the directory read of `/proc/self/fd` runs in a window (its own descriptor
/// is closed before the program could reuse the number), and a table already full (the read
/// itself fails with `EMFILE`) is none free.
pub(crate) fn free_descriptors() -> Option<(u64, u64)> {
    // SAFETY: rlimit is plain data; all-zero is a valid value.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes only into `rl`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0
        || rl.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let limit = rl.rlim_cur;
    let open = transient(|| {
        let gave_up = GAVE_UP.load(Ordering::SeqCst);
        // SAFETY: a NUL-terminated path; the descriptor is ours until `close_own`.
        let fd = unsafe {
            libc::open(
                c"/proc/self/fd".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let full = std::io::Error::last_os_error().raw_os_error() == Some(libc::EMFILE);
            return full.then_some(limit);
        }
        let identity = Identity::of(fd).ok();
        let count = count_entries(fd, limit);
        close_own(fd, identity, gave_up);
        count
    })??;
    Some((limit.saturating_sub(open), limit))
}

/// The descriptor numbers under `limit` listed in the directory open at `fd` (`/proc/self/fd`),
/// less the directory's own descriptor. `fd` is read with `getdents64` (no directory stream,
/// whose close the window could not check) and left open.
fn count_entries(fd: RawFd, limit: u64) -> Option<u64> {
    let mut buf = [0u8; 4096];
    let mut count = 0u64;
    loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return None;
        }
        if n == 0 {
            break;
        }
        let mut at = 0usize;
        while at + 19 < n as usize {
            // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen == 0 {
                return None;
            }
            let name = &buf[at + 19..(at + reclen).min(n as usize)];
            let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
            if let Some(fd) = std::str::from_utf8(name)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
            {
                if fd < limit {
                    count += 1;
                }
            }
            at += reclen;
        }
    }
    Some(count.saturating_sub(1))
}

/// The lowest number the shim's descriptor is moved to: just under the soft RLIMIT_NOFILE,
/// at most 4096 (the kernel sizes the descriptor table to the highest number in use). None
/// with a tiny limit (the descriptor stays where it is).
fn high_floor() -> Option<c_int> {
    // SAFETY: rlimit is plain data; all-zero is a valid value.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes only into `rl`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return None;
    }
    let top = rl.rlim_cur.min(4096) as c_int;
    (top >= 64).then(|| top - 32)
}

/// The shim's own descriptor: made in a window, moved high, its identity remembered. Every
/// operation on it goes through [`Owned::sys`]; dropping it closes it only if it is still
/// ours.
#[derive(Debug)]
pub(super) struct Owned {
    fd: RawFd,
    gen: u64,
    identity: Identity,
}

impl Owned {
    /// Makes the descriptor with `make` (inside a window) and keeps it. One at a time: the
    /// previous one must have been dropped.
    pub(super) fn create<T>(
        make: impl FnOnce() -> std::io::Result<(OwnedFd, T)>,
    ) -> std::io::Result<(Owned, T)> {
        let Some(_w) = Window::open() else {
            return Err(std::io::ErrorKind::WouldBlock.into());
        };
        if OWNED.load(Ordering::SeqCst) != NONE {
            return Err(std::io::Error::other("the shim already holds a descriptor"));
        }
        let (fd, extra) = make()?;
        let low = fd.into_raw_fd();
        let identity = match Identity::of(low) {
            Ok(id) => id,
            Err(e) => {
                real_close(low);
                return Err(e);
            }
        };
        let fd = move_high(low, identity);
        let gen = OWNED_GEN.fetch_add(1, Ordering::SeqCst) + 1;
        OWNED_DEV.store(identity.dev, Ordering::SeqCst);
        OWNED_INO.store(identity.ino, Ordering::SeqCst);
        OWNED_MODE.store(identity.kind, Ordering::SeqCst);
        OWNED.store(fd, Ordering::SeqCst);
        // The window's end publishes it to the hooks (`rewatch`).
        Ok((Owned { fd, gen, identity }, extra))
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    pub(super) fn identity(&self) -> Identity {
        self.identity
    }

    /// Still ours, checked under the lock: not taken through a hook, and still the same file.
    fn check(&self) -> std::io::Result<()> {
        if OWNED.load(Ordering::SeqCst) != self.fd || OWNED_GEN.load(Ordering::SeqCst) != self.gen {
            return Err(taken_error(self.fd));
        }
        if Identity::of(self.fd).ok() != Some(self.identity) {
            // Closed or replaced past the hooks (a raw system call): the number is not ours.
            OWNED.store(NONE, Ordering::SeqCst);
            rewatch();
            return Err(taken_error(self.fd));
        }
        Ok(())
    }

    /// Runs `op` on the descriptor under the lock, if it is still ours: Ok(what it returned)
    /// or Err(errno). `op` must not block (a send with MSG_DONTWAIT, a `pwrite`). Err(taken)
    /// when the program took it; WouldBlock when the lock could not be had. After a failure
    /// the identity is checked again: a descriptor replaced between the check and the call
    /// is "taken", not the operation's failure.
    pub(super) fn sys(&self, op: impl FnOnce(RawFd) -> isize) -> std::io::Result<usize> {
        let Some(_held) = lock() else {
            return Err(std::io::ErrorKind::WouldBlock.into());
        };
        self.check()?;
        let r = op(self.fd);
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted
        {
            self.check()?;
        }
        Err(e)
    }
}

impl Drop for Owned {
    /// Closes the descriptor if it is still ours; a taken one is only forgotten.
    fn drop(&mut self) {
        // Without the lock nothing is closed: a leak, never someone else's close.
        let Some(_held) = lock() else { return };
        if self.check().is_ok() {
            OWNED.store(NONE, Ordering::SeqCst);
            rewatch();
            real_close(self.fd);
        }
    }
}

/// Moves `low` to a high number (close-on-exec), unless the limit is tiny or no number is
/// free there; either way the result is close-on-exec. Called in a window.
fn move_high(low: RawFd, identity: Identity) -> RawFd {
    if let Some(floor) = high_floor().filter(|&f| f > low) {
        // SAFETY: fcntl on a descriptor we hold.
        let high = unsafe { libc::fcntl(low, libc::F_DUPFD_CLOEXEC, floor) };
        if high >= 0 {
            if Identity::of(high).ok() == Some(identity) {
                real_close(low);
                return high;
            }
            real_close(high);
        }
    }
    // SAFETY: fcntl on a descriptor we hold.
    unsafe { libc::fcntl(low, libc::F_SETFD, libc::FD_CLOEXEC) };
    low
}

/// In a fork child: close the child's copy of the parent's descriptor (a child holding it
/// would hide the parent's end of stream from the collector), if it still is that, and forget
/// it; the parent's lock and windows mean nothing here.
pub fn close_inherited_sink() {
    LOCKED.store(false, Ordering::SeqCst);
    // Calls in flight on the parent's other threads are not in flight here.
    IN_FLIGHT.store(0, Ordering::SeqCst);
    let _ = HOLDING.try_with(|h| h.set(false));
    WINDOW.store(false, Ordering::SeqCst);
    let fd = OWNED.swap(NONE, Ordering::SeqCst);
    WATCH.store(NONE, Ordering::SeqCst);
    OWNER_PID.store(0, Ordering::SeqCst);
    if fd >= 0 {
        let was = Identity {
            dev: OWNED_DEV.load(Ordering::SeqCst),
            ino: OWNED_INO.load(Ordering::SeqCst),
            kind: OWNED_MODE.load(Ordering::SeqCst),
        };
        if Identity::of(fd).ok() == Some(was) {
            real_close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The guard in this test process (whose `close` and friends are the hooks above, since
    //! the test binary defines them).

    use std::os::fd::AsRawFd;

    use super::*;

    /// One test at a time owns the one descriptor.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn owned_file(dir: &std::path::Path, name: &str) -> Owned {
        let path = dir.join(name);
        let (o, ()) = Owned::create(|| {
            let f = std::fs::File::create(&path)?;
            Ok((OwnedFd::from(f), ()))
        })
        .expect("create");
        o
    }

    fn dir(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("oomtrace-fdguard-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn is_open(fd: RawFd) -> bool {
        // SAFETY: fcntl only reads the descriptor's flags.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    fn write(o: &Owned, b: &[u8]) -> std::io::Result<usize> {
        // SAFETY: write of a valid buffer to the descriptor `with` hands over.
        o.sys(|fd| unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) })
    }

    /// A window waits for the close-family calls that looked at `WATCH` before it opened
    /// (one of them could close what the window makes); one that never ends makes the window
    /// give up, never hang.
    #[test]
    fn a_window_opens_once_the_calls_in_flight_have_returned() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let stuck = Flight::start();
        let started = Instant::now();
        assert!(Window::open().is_none(), "opened over a call in flight");
        assert!(started.elapsed() >= FLIGHT_WAIT);
        assert!(!WINDOW.load(Ordering::SeqCst), "the window was left open");
        let ending = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(stuck);
        });
        let w = Window::open().expect("opens once the call returned");
        assert_eq!(IN_FLIGHT.load(Ordering::SeqCst), 0);
        drop(w);
        ending.join().unwrap();
    }

    /// A window's own descriptor whose number the program closed and reused (a hook that
    /// gave up waiting for the window let it) is never closed: neither when it names another
    /// file now, nor, once a hook gave up, even when it names the same.
    #[test]
    fn a_windows_own_descriptor_is_closed_only_while_it_is_ours() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let d = dir("close-own");
        // High numbers, which the other tests' threads never get (the lowest free is taken).
        let at_high = |fd: RawFd| {
            // SAFETY: fcntl and close on a descriptor this test opened.
            let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 900) };
            real_close(fd);
            assert!(high >= 900);
            high
        };
        let first = at_high(
            std::fs::File::create(d.join("first"))
                .unwrap()
                .into_raw_fd(),
        );
        let identity = Identity::of(first).ok();
        real_close(first);
        // The program's file gets the number.
        let programs = at_high(
            std::fs::File::create(d.join("programs"))
                .unwrap()
                .into_raw_fd(),
        );
        assert_eq!(programs, first, "the lowest free number from 900 is reused");
        close_own(first, identity, GAVE_UP.load(Ordering::SeqCst));
        assert!(is_open(programs), "the program's descriptor was closed");
        real_close(programs);
        // Still the same file, but a hook went on without the lock: left open.
        let own = std::fs::File::open(d.join("first")).unwrap().into_raw_fd();
        let identity = Identity::of(own).ok();
        let before = GAVE_UP.load(Ordering::SeqCst);
        GAVE_UP.fetch_add(1, Ordering::SeqCst);
        close_own(own, identity, before);
        assert!(is_open(own), "closed after a hook gave up");
        // Without either: closed.
        close_own(own, identity, GAVE_UP.load(Ordering::SeqCst));
        assert!(!is_open(own));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The drain thread's reads leave no descriptor behind, and the free count sees the
    /// program's own.
    #[test]
    fn own_reads_and_the_free_count_leave_nothing_open() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let open_now = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let before = open_now();
        let cmdline = read_own(std::path::Path::new("/proc/self/cmdline"))
            .expect("the lock")
            .expect("read");
        assert!(!cmdline.is_empty());
        let (free, limit) = free_descriptors().expect("a limit");
        assert_eq!(open_now(), before);
        // std's read_dir holds one descriptor of its own while counting.
        assert!(
            free < limit && limit - free >= before as u64 - 1,
            "{free} {limit} {before}"
        );
    }

    #[test]
    fn the_descriptor_is_moved_high_and_close_on_exec() {
        let _s = SERIAL.lock().unwrap();
        let d = dir("high");
        let o = owned_file(&d, "a");
        if let Some(floor) = high_floor() {
            assert!(o.fd() >= floor, "{} < {floor}", o.fd());
        }
        // SAFETY: fcntl on our descriptor.
        let flags = unsafe { libc::fcntl(o.fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert_eq!(write(&o, b"ours").unwrap(), 4);
        drop(o);
        assert_eq!(std::fs::read(d.join("a")).unwrap(), b"ours");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_close_through_the_hook_takes_it_and_the_new_owner_is_never_touched() {
        let _s = SERIAL.lock().unwrap();
        let d = dir("hook");
        let o = owned_file(&d, "ours");
        // The program closes it (through the hook: this test binary defines `close`) and
        // makes the number its own.
        assert_eq!(close(o.fd()), 0);
        let theirs = std::fs::File::create(d.join("theirs")).unwrap();
        // SAFETY: dup2 of a descriptor we hold onto the freed number.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), o.fd()) }, o.fd());
        let e = write(&o, b"trace frames").unwrap_err();
        assert!(is_taken(&e), "{e}");
        let fd = o.fd();
        // Dropping ours must not close the program's descriptor.
        drop(o);
        assert!(is_open(fd), "the program's descriptor was closed");
        assert_eq!(std::fs::read(d.join("theirs")).unwrap(), b"");
        assert_eq!(close(fd), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_raw_close_past_the_hooks_is_caught_by_the_identity() {
        let _s = SERIAL.lock().unwrap();
        let d = dir("raw");
        let o = owned_file(&d, "ours");
        let fd = o.fd();
        // SAFETY: the raw system calls a program might make, past every hook.
        unsafe {
            libc::syscall(libc::SYS_close, fd);
            let theirs = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            assert!(theirs >= 0);
            libc::syscall(libc::SYS_dup3, theirs, fd, 0);
            libc::syscall(libc::SYS_close, theirs);
        }
        assert!(is_taken(&write(&o, b"x").unwrap_err()));
        drop(o);
        assert!(is_open(fd), "the program's descriptor was closed");
        assert_eq!(close(fd), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn close_range_and_dup2_onto_it_take_it_cloexec_does_not() {
        let _s = SERIAL.lock().unwrap();
        let d = dir("range");
        let o = owned_file(&d, "ours");
        let fd = o.fd() as c_uint;
        assert_eq!(close_range(fd, fd, libc::CLOSE_RANGE_CLOEXEC as c_int), 0);
        assert_eq!(write(&o, b"still ours").unwrap(), 10);
        assert_eq!(close_range(fd, c_uint::MAX, 0), 0);
        assert!(is_taken(&write(&o, b"x").unwrap_err()));
        drop(o);

        let o = owned_file(&d, "ours2");
        let null = std::fs::File::open("/dev/null").unwrap();
        // A failed dup2 changes nothing.
        assert_eq!(dup2(-5, o.fd()), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(write(&o, b"ok").unwrap(), 2);
        assert_eq!(dup2(null.as_raw_fd(), o.fd()), o.fd());
        assert!(is_taken(&write(&o, b"x").unwrap_err()));
        let fd = o.fd();
        drop(o);
        assert!(is_open(fd), "the program's descriptor was closed");
        assert_eq!(close(fd), 0);
        assert_eq!(std::fs::read(d.join("ours")).unwrap(), b"still ours");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn hooks_keep_results_and_errno() {
        let _s = SERIAL.lock().unwrap();
        assert_eq!(close(-1), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(dup3(0, 0, 0), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(close_range(10, 5, 0), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
