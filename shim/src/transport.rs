//! From hooks to the collector: a bounded lock-free queue, one drain thread, framed records
//! over a Unix socket (or, failing that, straight into a trace file).
//!
//! - Lossless while the collector reads. A hook whose event finds the queue full (allocations,
//!   frees, stack and module definitions alike) wakes the drain thread and waits for room on a
//!   futex the drain thread bumps as it empties the queue. Every sign of progress (room made,
//!   bytes taken by the socket or the file) restarts the wait, so a collector that is slower
//!   than the program slows the program to its pace and loses nothing.
//! - Bounded when the collector stops reading. The drain thread calls the collector *stalled*
//!   when data has waited without the socket taking a byte for `STALL_WAIT` (250 ms) while
//!   the collector's process is stopped (SIGSTOP or a debugger: state `T`/`t` of the pid that
//!   listened, from SO_PEERCRED and /proc), or for `HUNG_WAIT` (10 s) whatever it is doing: a
//!   running collector can be busy for over a second without reading (first symbolization of
//!   a large library, a debug build), and that must not cost events. Each socket write waits
//!   at most 20 ms, so the drain thread notices while blocked. From then on hooks do not
//!   wait: an event that finds the queue full is counted lost, each with its kind and device
//!   (a lost free is a lost free, not a phantom leak). Once the socket takes bytes again the
//!   stall ends and hooks wait again. A stopped collector therefore holds the program back
//!   about `STALL_WAIT` per stop. A hook also stops waiting after `WAIT_BACKSTOP` (2 s) in
//!   which the drain thread neither ran its loop nor made progress (blocked elsewhere, e.g.
//!   on a slow disk).
//! - Hooks never wait where waiting could deadlock or is pointless: on the drain thread
//!   itself, in a fork (or vfork) child still holding the parent's state, once the thread's
//!   own thread-locals are being destroyed (thread exit), once the process is finishing
//!   (`shutdown`: atexit, `_exit`), or when the drain thread has ended or the collector is
//!   gone. There the event goes in if the queue has room and is counted lost if not.
//! - The fast path is unchanged: one `try_send`, and a wake-up of the drain thread only when
//!   it sleeps and the queue is a quarter full. The drain thread polls with a short sleep
//!   rather than parking per event (a parked receiver makes every send pay a futex wake:
//!   +280 ns/pair in the prototype).
//! - What the socket does not take waits in the drain thread, up to 16 MiB (or twice the
//!   queue). At that cap the drain thread stops taking from the queue (so hooks wait) while
//!   the collector still reads; only when stalled does it take events and count them lost,
//!   while stack and module definitions still go out. When the collector reads again,
//!   everything waiting and the `Lost` counts (sent every 500 ms when they change) reach it.
//! - `flush` waits until everything queued before it has left the process; `shutdown` (exit)
//!   until the end of the stream has; both give up after their timeout passes with no
//!   progress (a collector still reading is waited for).
//! - If the collector goes away, the process keeps running at full speed; the drain thread
//!   discards and counts. At exit, if the end of the stream cannot get out (2 s without the
//!   socket taking a byte), the shim says so on stderr: those counts cannot reach the
//!   collector any more.

use std::cell::Cell;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use oomtrace_proto::trace_file;
use oomtrace_proto::wire::{self, encode, GoodbyeReason, Hello, Lost, ModuleDef};
use oomtrace_proto::{Event, EventKind, StackId};

use crate::clock::{self, Calibration};
use crate::lifecycle::State;
use crate::log;

pub enum Msg {
    Event(Event),
    Stack {
        id: u32,
        frames: Box<[u64]>,
    },
    Module(Box<ModuleDef>),
    ModuleGone(u32),
    /// A Python code object, before the first stack that names it.
    Code(Box<oomtrace_proto::python::CodeDef>),
    Marker {
        ev: Event,
        label: Box<str>,
    },
    /// Write out everything queued before this, then signal.
    Flush(Arc<Done>),
    /// Write everything, say goodbye, close, signal; the drain thread then ends.
    Shutdown(GoodbyeReason, Arc<Done>),
}

/// A one-shot signal with a bounded wait.
pub struct Done {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    pub fn new() -> Arc<Done> {
        Arc::new(Done {
            flag: Mutex::new(false),
            cv: Condvar::new(),
        })
    }
    fn set(&self) {
        if let Ok(mut f) = self.flag.lock() {
            *f = true;
        }
        self.cv.notify_all();
    }
    /// True if signalled within `timeout`.
    pub fn wait(&self, timeout: Duration) -> bool {
        let Ok(guard) = self.flag.lock() else {
            return false;
        };
        match self.cv.wait_timeout_while(guard, timeout, |f| !*f) {
            Ok((g, _)) => *g,
            Err(_) => false,
        }
    }
}

/// Lost-event slots: devices 0..15, then one for unknown/other devices.
const LOST_SLOTS: usize = 17;

/// The stall limit for a collector whose process is stopped (SIGSTOP, a debugger; state `T`
/// or `t` in /proc): data waited this long without the socket taking a byte, and hooks stop
/// waiting for room (see the module doc).
const STALL_WAIT: Duration = Duration::from_millis(250);
/// The stall limit for a collector that runs but takes nothing (hung, or its process cannot
/// be seen): a running collector can be busy for over a second without reading (the first
/// symbolization of a large library, a debug build), which must not cost events.
const HUNG_WAIT: Duration = Duration::from_secs(10);
/// How often the collector's process state is read while it takes nothing.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(100);
/// A waiting hook gives up after this long without the drain thread running its loop or
/// making progress: a drain thread blocked somewhere other than a socket write (a slow disk),
/// which the stall rule does not cover.
const WAIT_BACKSTOP: Duration = Duration::from_millis(2000);
/// A waiting hook re-checks stall, shutdown and the backstop this often.
const WAIT_SLICE: Duration = Duration::from_millis(10);
/// The drain thread tells waiting hooks about room every this many messages taken.
const ROOM_EVERY: usize = 1024;

thread_local! {
    /// Set on the drain thread: it must never wait for room in its own queue.
    static ON_DRAIN_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Touched by a thread the first time it waits; once the thread's thread-local
    /// destructors have dropped it, `try_with` fails: the thread is exiting, never wait.
    static THREAD_LIVE: Live = const { Live };
}

struct Live;

impl Drop for Live {
    fn drop(&mut self) {}
}

/// Counters and signals shared by hooks and the drain thread.
pub struct Shared {
    lost_events: AtomicU64,
    lost_frees: AtomicU64,
    lost_stacks: AtomicU64,
    lost_by_device: [AtomicU64; LOST_SLOTS],
    /// Bumped by the drain thread whenever it makes progress (room in the queue, bytes
    /// written) or its state changes; waiting hooks sleep on it (a futex word).
    progress: AtomicU32,
    /// Hooks currently waiting on `progress`.
    waiters: AtomicU32,
    /// Bumped by the drain thread once per loop: it is alive (no wake-up).
    heartbeat: AtomicU32,
    /// The collector took nothing for `STALL_WAIT` while data waited, or is gone: hooks do not
    /// wait for room (set and cleared by the drain thread).
    stalled: AtomicBool,
    /// The drain thread runs (set before it starts, cleared when it ends).
    draining: AtomicBool,
    /// `shutdown` has begun: the process is finishing; hooks do not wait any more.
    closing: AtomicBool,
    drainer: OnceLock<std::thread::Thread>,
    drainer_idle: AtomicBool,
    capacity: usize,
}

impl Shared {
    pub fn new(capacity: usize) -> Shared {
        Shared {
            lost_events: AtomicU64::new(0),
            lost_frees: AtomicU64::new(0),
            lost_stacks: AtomicU64::new(0),
            lost_by_device: std::array::from_fn(|_| AtomicU64::new(0)),
            progress: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            heartbeat: AtomicU32::new(0),
            stalled: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            drainer: OnceLock::new(),
            drainer_idle: AtomicBool::new(false),
            capacity,
        }
    }

    pub fn count_lost(&self, ev: &Event) {
        self.lost_events.fetch_add(1, Ordering::Relaxed);
        if ev.kind() == Some(EventKind::Free) {
            self.lost_frees.fetch_add(1, Ordering::Relaxed);
        }
        let slot = if (0..16).contains(&ev.device) {
            ev.device as usize
        } else {
            LOST_SLOTS - 1
        };
        self.lost_by_device[slot].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_lost_stack(&self) {
        self.lost_stacks.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Lost {
        let by_device = self
            .lost_by_device
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let n = c.load(Ordering::Relaxed);
                let dev = if i == LOST_SLOTS - 1 { -1 } else { i as i16 };
                (n > 0).then_some((dev, n))
            })
            .collect();
        Lost {
            events: self.lost_events.load(Ordering::Relaxed),
            frees: self.lost_frees.load(Ordering::Relaxed),
            stacks: self.lost_stacks.load(Ordering::Relaxed),
            by_device,
        }
    }

    pub fn total_lost(&self) -> u64 {
        self.lost_events.load(Ordering::Relaxed)
    }

    fn wake(&self) {
        if let Some(t) = self.drainer.get() {
            t.unpark();
        }
    }

    /// Wakes an idle drain thread once the queue is a quarter full. The length is read only
    /// when the drain thread sleeps: it lives on cache lines the drain thread is writing.
    #[inline]
    fn nudge(&self, tx: &Sender<Msg>) {
        if self.drainer_idle.load(Ordering::Relaxed) && tx.len() * 4 >= self.capacity {
            self.wake();
        }
    }

    /// The drain thread made progress (or changed state): bump the futex word and wake the
    /// hooks waiting on it, if any. SeqCst pairs with `wait_for_room`: a hook that registered
    /// as a waiter either is seen here or sees the new value before it sleeps.
    fn progressed(&self) {
        self.progress.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            futex_wake_all(&self.progress);
        }
    }

    fn set_stalled(&self, stalled: bool) {
        if self.stalled.swap(stalled, Ordering::SeqCst) != stalled {
            self.progressed();
        }
    }
}

/// Sleeps until `word` is no longer `expected`, a wake-up, or `timeout`.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 for the whole call; FUTEX_WAIT only reads it and
    // returns at once if it no longer holds `expected`; `ts` is a valid relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not access memory beyond it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Whether this thread may wait for room at all: never on the drain thread, when the drain
/// thread has ended, or in a (v)fork child that still sees the parent's state.
fn may_wait_at_all(st: &State) -> bool {
    if ON_DRAIN_THREAD.try_with(Cell::get).unwrap_or(true)
        || !st.shared.draining.load(Ordering::Acquire)
    {
        return false;
    }
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 == st.pid }
}

/// Whether a hook may wait for room: as `may_wait_at_all`, and not while the thread's
/// thread-locals are being destroyed, once the process is finishing, or while the collector
/// is stalled or gone.
fn may_wait(st: &State) -> bool {
    let sh = &st.shared;
    !sh.closing.load(Ordering::Acquire)
        && !sh.stalled.load(Ordering::Acquire)
        && THREAD_LIVE.try_with(|_| ()).is_ok()
        && may_wait_at_all(st)
}

/// The slow path of every send: the queue was full. Waits for room while the drain thread
/// makes progress (see the module doc); gives the message back if it cannot go.
/// `control` (flush, shutdown): also waits while stalled or closing (the drain thread still
/// takes messages then), giving up after `limit` in which no room was made and no byte
/// written.
#[cold]
#[inline(never)]
fn wait_for_room(st: &State, mut msg: Msg, control: Option<Duration>) -> Result<(), Msg> {
    let sh = &st.shared;
    let allowed = || match control {
        Some(_) => may_wait_at_all(st),
        None => may_wait(st),
    };
    if !allowed() {
        return Err(msg);
    }
    let limit = control.unwrap_or(WAIT_BACKSTOP);
    sh.wake();
    sh.waiters.fetch_add(1, Ordering::SeqCst);
    let mut seen = sh.progress.load(Ordering::SeqCst);
    let mut beat = sh.heartbeat.load(Ordering::Relaxed);
    let mut since = Instant::now();
    let result = loop {
        match st.tx.try_send(msg) {
            Ok(()) => break Ok(()),
            Err(TrySendError::Disconnected(m)) => break Err(m),
            Err(TrySendError::Full(m)) => msg = m,
        }
        futex_wait(&sh.progress, seen, WAIT_SLICE);
        if !allowed() {
            break Err(msg);
        }
        let now = sh.progress.load(Ordering::SeqCst);
        // A hook's wait goes on while the drain thread runs at all (it decides the stall); a
        // flush or shutdown waits only while something moves, so exit stays bounded by its
        // caller's timeout even when a running collector reads nothing.
        let now_beat = match control {
            None => sh.heartbeat.load(Ordering::Relaxed),
            Some(_) => beat,
        };
        if now != seen || now_beat != beat {
            seen = now;
            beat = now_beat;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            break Err(msg);
        }
        sh.wake();
    };
    sh.waiters.fetch_sub(1, Ordering::SeqCst);
    result
}

/// An allocation (or any event that is not a removal): waits for room like every event (see
/// the module doc); counted lost if it cannot go.
#[inline]
pub fn send_event(st: &State, ev: Event) {
    match st.tx.try_send(Msg::Event(ev)) {
        Ok(()) => st.shared.nudge(&st.tx),
        Err(TrySendError::Full(msg)) => {
            if wait_for_room(st, msg, None).is_err() {
                st.shared.count_lost(&ev);
            }
        }
        Err(TrySendError::Disconnected(_)) => st.shared.count_lost(&ev),
    }
}

/// Queues `msg`, waiting for room while the collector reads; false if it could not go.
pub fn send_reliable(st: &State, msg: Msg) -> bool {
    match st.tx.try_send(msg) {
        Ok(()) => {
            st.shared.nudge(&st.tx);
            true
        }
        Err(TrySendError::Full(msg)) => wait_for_room(st, msg, None).is_ok(),
        Err(TrySendError::Disconnected(_)) => false,
    }
}

/// A free (or other removal): as `send_event`.
pub fn send_reliable_event(st: &State, ev: Event) {
    send_event(st, ev);
}

pub fn send_marker(st: &State, ev: Event, label: &str) {
    let msg = Msg::Marker {
        ev,
        label: label.into(),
    };
    if !send_reliable(st, msg) {
        st.shared.count_lost(&ev);
    }
}

/// Queues a flush or shutdown request: waits for room even while stalled (the drain thread
/// still takes messages then), up to `limit` with no progress.
fn send_control(st: &State, msg: Msg, limit: Duration) -> bool {
    match st.tx.try_send(msg) {
        Ok(()) => true,
        Err(TrySendError::Full(msg)) => wait_for_room(st, msg, Some(limit)).is_ok(),
        Err(TrySendError::Disconnected(_)) => false,
    }
}

/// Waits for `done` while the drain thread makes progress; false after `limit` without any.
fn wait_done(st: &State, done: &Done, limit: Duration) -> bool {
    let sh = &st.shared;
    let mut seen = sh.progress.load(Ordering::SeqCst);
    let mut since = Instant::now();
    loop {
        if done.wait(Duration::from_millis(50)) {
            return true;
        }
        if !sh.draining.load(Ordering::Acquire) {
            return done.wait(Duration::ZERO);
        }
        let now = sh.progress.load(Ordering::SeqCst);
        if now != seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            return false;
        }
    }
}

/// Asks the drain thread to write out what is queued; waits until it has left the process,
/// giving up after `timeout` without progress.
pub fn flush(st: &State, timeout: Duration) -> bool {
    if !may_wait_at_all(st) {
        return false;
    }
    let done = Done::new();
    if !send_control(st, Msg::Flush(done.clone()), timeout) {
        return false;
    }
    st.shared.wake();
    wait_done(st, &done, timeout)
}

/// Asks the drain thread to finish (goodbye, close); waits until it has, giving up after
/// `timeout` without progress. From here on hooks never wait for room.
pub fn shutdown(st: &State, reason: GoodbyeReason, timeout: Duration) -> bool {
    if ON_DRAIN_THREAD.try_with(Cell::get).unwrap_or(true) {
        return false;
    }
    st.shared.closing.store(true, Ordering::SeqCst);
    // Hooks already waiting re-check and stop.
    st.shared.progressed();
    let done = Done::new();
    if !send_control(st, Msg::Shutdown(reason, done.clone()), timeout) {
        return false;
    }
    st.shared.wake();
    wait_done(st, &done, timeout)
}

/// The fd of the collector socket or fallback file, closed by the fork child (the parent
/// keeps using its own copy; a child holding it open would hide the parent's EOF).
pub static SINK_FD: AtomicI32 = AtomicI32::new(-1);

/// The socket of the collector this process started, inherited by forked children so that
/// they report to the same collector.
static AUTO_SOCKET: OnceLock<PathBuf> = OnceLock::new();

/// The collector socket a fork parent started, if any.
pub fn inherited_socket() -> Option<&'static PathBuf> {
    AUTO_SOCKET.get()
}

/// Spawns this process's own collector (see `spawn_collector`) and records its socket for
/// children forked from now on.
pub fn start_own_collector(config: &crate::config::Config) -> Result<PathBuf, String> {
    let path = spawn_collector(config)?;
    let _ = AUTO_SOCKET.set(path.clone());
    Ok(path)
}

/// Starts the drain thread with all signals blocked, so signals meant for the program are
/// never delivered to it.
pub fn spawn_drainer(st: &'static State, rx: Receiver<Msg>) -> bool {
    // SAFETY: plain signal-mask calls on the current thread; restored right after.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // Before the thread exists: hooks may wait from the first event on.
    st.shared.draining.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("oomtrace-drain".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let _ = ON_DRAIN_THREAD.try_with(|f| f.set(true));
            crate::guard::catch(|| Drainer::new(st, rx).run());
            // Ended (or failed): nobody waits for room any more; waiting hooks re-check.
            st.shared.draining.store(false, Ordering::Release);
            st.shared.progressed();
        });
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    match spawned {
        Ok(handle) => {
            let _ = st.shared.drainer.set(handle.thread().clone());
            true
        }
        Err(_) => {
            st.shared.draining.store(false, Ordering::Release);
            false
        }
    }
}

/// Where the collector socket came from, which decides how long to keep trying it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SocketSource {
    /// `OOMTRACE_SOCKET`: `oomtrace run` or a standalone collector; tried for 1 s.
    Configured,
    /// The collector our fork parent started: tried once, then we start our own.
    Inherited,
    /// A collector we started (it was listening before the spawn returned); tried for 5 s.
    Spawned,
}

/// Why there is no collector to connect to: fall back to writing the file at once.
struct NoCollector(String);

enum Sink {
    /// Not connected yet; events accumulate in `out` (bounded).
    Connecting {
        /// None: start a collector first. Err: none could be started.
        socket: Option<Result<(PathBuf, SocketSource), NoCollector>>,
        deadline: Instant,
        next_try: Instant,
    },
    Socket(UnixStream),
    File(DirectFile),
    /// The collector is gone: everything is counted and dropped.
    Detached,
}

/// Bytes kept while not connected yet, before events are counted as lost.
const PENDING_LIMIT: usize = 64 << 20;
/// Writes happen at least this often when data is waiting.
const WRITE_CHUNK: usize = 1 << 20;
/// How long one write may wait for a collector that does not read (stopped, or slower than
/// the program): the drain thread never blocks longer, so it keeps emptying the queue.
const SOCKET_WRITE_WAIT: Duration = Duration::from_millis(20);
/// Bytes kept waiting for the socket (at least; twice the event queue's size if that is more:
/// a user who asked for a large buffer asked for that much slack). At this cap the drain
/// thread stops taking from the queue while the collector reads (hooks wait), and counts new
/// events lost only once the collector is stalled (`STALL_WAIT`).
const STALLED_LIMIT: usize = 16 << 20;
/// At exit, how long the end of the stream may go without the socket taking a byte.
const FINISH_WRITE_WAIT: Duration = Duration::from_millis(2000);

struct Drainer {
    st: &'static State,
    rx: Receiver<Msg>,
    sink: Sink,
    /// Encoded frames not yet written.
    out: Vec<u8>,
    /// Bytes already committed to the socket stream but not yet taken by the collector: a
    /// frame partly sent must be completed before anything else, so these are never dropped
    /// while connected.
    unsent: Vec<u8>,
    /// `STALLED_LIMIT`, or twice the event queue if that is more.
    stalled_limit: usize,
    /// The collector took nothing for `STALL_WAIT` while data waited (mirrored in
    /// `Shared::stalled`).
    stalled: bool,
    /// When the socket last took a byte, or nothing was waiting.
    last_taken: Instant,
    /// Bytes of the stream written so far (socket or file).
    sent_total: u64,
    /// The collector's pid (SO_PEERCRED: the process that listened), 0 if unknown.
    peer_pid: i32,
    peer_checked: Instant,
    peer_was_stopped: bool,
    /// Events in `out`, to count them if `out` is dropped.
    out_events: u64,
    /// Offset of the open Events frame in `out`.
    events_at: Option<usize>,
    events_in_frame: u32,
    seq: u64,
    cal: Calibration,
    /// Timestamps go out non-decreasing in queue order (the order events happened in):
    /// refining the tick rate must not make a later event look earlier.
    last_ts: u64,
    hello: Hello,
    last_lost: Lost,
    lost_checked: Instant,
    idle_rounds: u32,
}

/// Which buffer `Drainer::send_counted` sends.
#[derive(Clone, Copy)]
enum Which {
    Unsent,
    Out,
}

static DETACH_SAID: AtomicBool = AtomicBool::new(false);
static FALLBACK_SAID: AtomicBool = AtomicBool::new(false);
/// The output was refused: the process runs untraced by design, not for a lost collector.
static OUTPUT_REFUSED: AtomicBool = AtomicBool::new(false);

fn read_cmdline() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Drainer {
    fn new(st: &'static State, rx: Receiver<Msg>) -> Drainer {
        let socket = match (&st.config.socket, &st.own_collector, AUTO_SOCKET.get()) {
            (Some(p), _, _) => Some(Ok((PathBuf::from(p), SocketSource::Configured))),
            (None, Some(Ok(p)), _) => Some(Ok((p.clone(), SocketSource::Spawned))),
            (None, Some(Err(e)), _) => Some(Err(NoCollector(e.clone()))),
            (None, None, Some(p)) => Some(Ok((p.clone(), SocketSource::Inherited))),
            (None, None, None) => None,
        };
        let now = Instant::now();
        let hello = Hello {
            pid: st.pid,
            // SAFETY: getppid has no preconditions.
            ppid: unsafe { libc::getppid() } as u32,
            start_unix_ns: clock::unix_ns(),
            flags: if st.config.stacks {
                wire::hello_flags::NATIVE_STACKS
            } else {
                0
            },
            shim_version: env!("CARGO_PKG_VERSION").into(),
            exe: std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            argv: read_cmdline(),
        };
        Drainer {
            st,
            rx,
            sink: Sink::Connecting {
                deadline: now
                    + match socket {
                        Some(Ok((_, SocketSource::Spawned))) => Duration::from_secs(5),
                        _ => Duration::from_secs(1),
                    },
                socket,
                next_try: now,
            },
            out: Vec::with_capacity(WRITE_CHUNK + 4096),
            unsent: Vec::new(),
            stalled_limit: STALLED_LIMIT.max(st.config.buffer * oomtrace_proto::EVENT_SIZE * 2),
            stalled: false,
            last_taken: now,
            sent_total: 0,
            peer_pid: 0,
            peer_checked: now,
            peer_was_stopped: false,
            out_events: 0,
            events_at: None,
            events_in_frame: 0,
            seq: 0,
            cal: st.clock_origin.clone(),
            last_ts: 0,
            hello,
            last_lost: Lost::default(),
            lost_checked: now,
            idle_rounds: 0,
        }
    }

    fn run(mut self) {
        // Flush requests, each with the stream position it waits for.
        let mut flushes: Vec<(u64, Arc<Done>)> = Vec::new();
        loop {
            self.st.shared.heartbeat.fetch_add(1, Ordering::Relaxed);
            self.cal.refresh();
            let mut got = 0usize;
            let mut shutdown = None;
            let mut held_back = false;
            while got < 200_000 {
                // At the cap, while the collector still reads: leave the rest in the queue
                // (hooks wait for room) instead of dropping it.
                if self.holding_back() {
                    held_back = true;
                    break;
                }
                let Ok(msg) = self.rx.try_recv() else { break };
                got += 1;
                match msg {
                    Msg::Flush(done) => flushes.push((self.stream_end(), done)),
                    Msg::Shutdown(reason, done) => {
                        shutdown = Some((reason, done));
                        break;
                    }
                    other => self.encode(other),
                }
                if got.is_multiple_of(ROOM_EVERY) {
                    self.st.shared.progressed();
                }
                if self.out.len() >= WRITE_CHUNK {
                    if self.unsent.is_empty() {
                        self.write_out();
                    } else {
                        // The socket was full: a write that waits would wait once per chunk;
                        // take what it has room for now and let the rest gather in `out`.
                        self.write_unsent_now();
                    }
                }
            }
            if got > 0 {
                self.st.shared.progressed();
            }
            if let Some((reason, done)) = shutdown {
                // Whatever other threads queued before the goodbye still goes out (past the
                // cap if need be: the queue bounds it).
                while let Ok(msg) = self.rx.try_recv() {
                    match msg {
                        Msg::Flush(d) => flushes.push((u64::MAX, d)),
                        Msg::Shutdown(_, d) => d.set(),
                        other => self.encode(other),
                    }
                }
                self.finish(reason);
                for (_, d) in flushes.drain(..) {
                    d.set();
                }
                done.set();
                return;
            }
            self.progress_connection(false);
            self.maybe_send_lost();
            self.write_out();
            self.update_stall();
            // A flush is done when its data left the process, not when a write was tried: a
            // collector that reads slowly keeps flushes waiting (their callers give up only
            // when nothing moves).
            if !matches!(self.sink, Sink::Socket(_)) {
                for (_, d) in flushes.drain(..) {
                    d.set();
                }
            } else if !flushes.is_empty() {
                let sent = self.sent_total;
                let drained = self.drained();
                flushes.retain(|(mark, d)| {
                    let done = sent >= *mark || drained;
                    if done {
                        d.set();
                    }
                    !done
                });
            }
            if got == 0 && !held_back {
                self.idle_rounds = self.idle_rounds.saturating_add(1);
                // 0.2 ms while busy, backing off to 5 ms when idle; producers wake us early.
                let sleep = Duration::from_micros(200 * u64::from(self.idle_rounds.min(25)));
                self.st.shared.drainer_idle.store(true, Ordering::Relaxed);
                if self.rx.is_empty() {
                    std::thread::park_timeout(sleep);
                }
                self.st.shared.drainer_idle.store(false, Ordering::Relaxed);
            } else {
                self.idle_rounds = 0;
            }
        }
    }

    /// Connected, `STALLED_LIMIT` waiting, and the collector still reading: take nothing more
    /// from the queue until the socket has taken some.
    fn holding_back(&self) -> bool {
        matches!(self.sink, Sink::Socket(_))
            && !self.stalled
            && self.unsent.len() + self.out.len() >= self.stalled_limit
    }

    /// Whether the collector's process is stopped (state `T` or `t`: SIGSTOP, a debugger), read
    /// from /proc at most every `PEER_CHECK_EVERY`. Unknown (another pid namespace, a
    /// collector that forked after `listen`, whose listening pid has gone): false.
    fn peer_stopped(&mut self, now: Instant) -> bool {
        if self.peer_pid <= 0 {
            return false;
        }
        if now.duration_since(self.peer_checked) >= PEER_CHECK_EVERY {
            self.peer_checked = now;
            self.peer_was_stopped = std::fs::read(format!("/proc/{}/stat", self.peer_pid))
                .ok()
                .and_then(|stat| {
                    // "pid (comm) S ...": the state follows the last ')'.
                    let at = stat.iter().rposition(|&c| c == b')')?;
                    stat.get(at + 2).copied()
                })
                .is_some_and(|state| state == b'T' || state == b't');
        }
        self.peer_was_stopped
    }

    /// The stream position just past everything encoded so far (closes the open frame).
    fn stream_end(&mut self) -> u64 {
        self.close_events();
        self.sent_total + (self.unsent.len() + self.out.len()) as u64
    }

    /// Decides whether the collector is stalled: data waiting and no byte taken for
    /// `STALL_WAIT` while its process is stopped, or for `HUNG_WAIT` whatever it does (or no
    /// collector at all), and tells the hooks when that changes.
    fn update_stall(&mut self) {
        let now = Instant::now();
        let stalled = match self.sink {
            Sink::Detached => true,
            Sink::Socket(_) => {
                if self.drained() {
                    self.last_taken = now;
                }
                let quiet = now.duration_since(self.last_taken);
                quiet >= HUNG_WAIT || (quiet >= STALL_WAIT && self.peer_stopped(now))
            }
            Sink::Connecting { .. } | Sink::File(_) => false,
        };
        if stalled != self.stalled {
            self.stalled = stalled;
            self.st.shared.set_stalled(stalled);
            if matches!(self.sink, Sink::Socket(_)) {
                log::info(&if stalled {
                    format!(
                        "the collector has taken nothing for {} ms: events that find the queue \
                         full are counted lost until it reads again",
                        now.duration_since(self.last_taken).as_millis()
                    )
                } else {
                    "the collector reads again: hooks wait for room again".to_string()
                });
            }
        }
    }

    fn close_events(&mut self) {
        if let Some(at) = self.events_at.take() {
            encode::end_events(&mut self.out, at);
            self.events_in_frame = 0;
        }
    }

    fn encode(&mut self, msg: Msg) {
        // Detached, or a stalled collector (nothing taken for `STALL_WAIT`) with
        // `STALLED_LIMIT` waiting: events are counted lost here, each with its kind and device
        // (a lost free is a lost free, not a phantom leak); stack and module definitions still
        // go out, so later events stay readable. A collector that still reads never gets
        // here over the cap: `run` stops taking from the queue instead.
        let stalled = matches!(self.sink, Sink::Socket(_))
            && self.stalled
            && self.unsent.len() + self.out.len() > self.stalled_limit;
        if matches!(self.sink, Sink::Detached) || stalled {
            if let Msg::Event(ev) | Msg::Marker { ev, .. } = msg {
                self.st.shared.count_lost(&ev);
                return;
            }
            if !stalled {
                return;
            }
        }
        match msg {
            Msg::Event(mut ev) => {
                if self.events_at.is_none() {
                    self.events_at = Some(encode::begin_events(&mut self.out));
                }
                self.seq += 1;
                ev.seq = self.seq;
                ev.ts_ns = self.monotonic(ev.ts_ns);
                encode::push_event(&mut self.out, &ev);
                self.out_events += 1;
                self.events_in_frame += 1;
                if self.events_in_frame >= 8192 {
                    self.close_events();
                }
            }
            Msg::Stack { id, frames } => {
                self.close_events();
                encode::stack_def(&mut self.out, StackId(id), &frames);
            }
            Msg::Module(def) => {
                self.close_events();
                encode::module_def(&mut self.out, &def);
            }
            Msg::ModuleGone(id) => {
                self.close_events();
                encode::module_gone(&mut self.out, id);
            }
            Msg::Code(def) => {
                self.close_events();
                encode::code_def(&mut self.out, &def);
            }
            Msg::Marker { ev, label } => {
                self.close_events();
                self.seq += 1;
                let ts = self.monotonic(ev.ts_ns);
                encode::marker(&mut self.out, self.seq, ts, ev.tid, ev.stack, &label);
                self.out_events += 1;
            }
            Msg::Flush(_) | Msg::Shutdown(..) => {}
        }
    }

    fn monotonic(&mut self, ticks: u64) -> u64 {
        self.last_ts = self.last_ts.max(self.cal.to_ns(ticks));
        self.last_ts
    }

    fn maybe_send_lost(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.lost_checked) < Duration::from_millis(500) {
            return;
        }
        self.lost_checked = now;
        self.push_lost_if_changed();
    }

    fn push_lost_if_changed(&mut self) {
        let lost = self.st.shared.snapshot();
        if lost != self.last_lost {
            self.close_events();
            encode::lost(&mut self.out, &lost);
            self.last_lost = lost;
        }
    }

    /// Writes `out` to the sink (or keeps it while connecting).
    fn write_out(&mut self) {
        self.close_events();
        if self.drained() {
            return;
        }
        if matches!(self.sink, Sink::Socket(_)) {
            return self.write_socket();
        }
        if self.out.is_empty() {
            return;
        }
        let result = match &mut self.sink {
            Sink::Connecting { .. } => {
                if self.out.len() > PENDING_LIMIT {
                    self.drop_out();
                }
                return;
            }
            Sink::Detached => {
                self.drop_out();
                return;
            }
            Sink::Socket(_) => return,
            Sink::File(d) => {
                let mut record = Vec::with_capacity(self.out.len() + 32);
                let _ = trace_file::write_chunk(&mut record, 0, &self.out, false);
                d.write_record(&record)
            }
        };
        match result {
            Ok(()) => {
                self.sent_total += self.out.len() as u64;
                self.out.clear();
                self.out_events = 0;
                self.st.shared.progressed();
            }
            Err(e) => {
                let lost_bytes = self.out.len() as u64;
                let lost_events = self.out_events;
                self.drop_out();
                if matches!(self.sink, Sink::File(_)) {
                    let Sink::File(mut d) = std::mem::replace(&mut self.sink, Sink::Detached)
                    else {
                        return;
                    };
                    // The file ends on its last whole record, then says why it stops there.
                    let line = d.failed(&e, lost_bytes, lost_events);
                    // What is lost from here on is this file's loss too: counted at exit.
                    let before = self.st.shared.total_lost().saturating_sub(lost_events);
                    keep_failed_direct(self.st.pid, d, before);
                    self.detach_quietly();
                    log::warn(&line);
                } else {
                    self.detach(&format!("{e}"));
                }
            }
        }
    }

    /// Stops delivering without the "lost the collector" line (the caller says what happened).
    fn detach_quietly(&mut self) {
        DETACH_SAID.store(true, Ordering::Relaxed);
        self.detach("");
    }

    fn write_socket(&mut self) {
        let Sink::Socket(s) = std::mem::replace(&mut self.sink, Sink::Detached) else {
            return;
        };
        match self.send_to_socket(&s) {
            Ok(()) => self.sink = Sink::Socket(s),
            Err(e) => {
                self.unsent.clear();
                self.drop_out();
                self.detach(&format!("{e}"));
            }
        }
    }

    /// Sends what the socket takes, each write waiting at most `SOCKET_WRITE_WAIT` for room:
    /// first the committed bytes, then `out`. Frames the socket does not take wait here up to
    /// `STALLED_LIMIT` (then `run` holds back, or once stalled `encode` counts events lost).
    fn send_to_socket(&mut self, s: &UnixStream) -> std::io::Result<()> {
        if !self.unsent.is_empty() {
            let n = self.send_counted(s, Which::Unsent, 0)?;
            self.unsent.drain(..n);
        }
        if self.unsent.is_empty() {
            let n = self.send_counted(s, Which::Out, 0)?;
            if n < self.out.len() {
                self.unsent.extend_from_slice(&self.out[n..]);
            }
            self.out.clear();
            self.out_events = 0;
        }
        Ok(())
    }

    /// `send_some` of `unsent` or `out`, counting the bytes taken as progress.
    fn send_counted(&mut self, s: &UnixStream, which: Which, flags: i32) -> std::io::Result<usize> {
        let buf = match which {
            Which::Unsent => &self.unsent,
            Which::Out => &self.out,
        };
        let shared = &self.st.shared;
        let mut taken = 0u64;
        let r = send_some(s, buf, flags, |n| {
            taken += n as u64;
            shared.progressed();
        });
        if taken > 0 {
            self.sent_total += taken;
            self.last_taken = Instant::now();
        }
        r
    }

    /// What the socket takes of `unsent` right now, without waiting.
    fn write_unsent_now(&mut self) {
        let Sink::Socket(s) = std::mem::replace(&mut self.sink, Sink::Detached) else {
            return;
        };
        match self.send_counted(&s, Which::Unsent, libc::MSG_DONTWAIT) {
            Ok(n) => {
                self.unsent.drain(..n);
                self.sink = Sink::Socket(s);
            }
            Err(e) => {
                self.unsent.clear();
                self.drop_out();
                self.detach(&format!("{e}"));
            }
        }
    }

    /// Nothing is left to send.
    fn drained(&self) -> bool {
        self.out.is_empty() && self.unsent.is_empty()
    }

    fn drop_out(&mut self) {
        for _ in 0..self.out_events {
            self.st
                .shared
                .count_lost(&Event::new(EventKind::Alloc, oomtrace_proto::Api::Unknown));
        }
        self.out.clear();
        self.out_events = 0;
        self.events_at = None;
        self.events_in_frame = 0;
    }

    fn detach(&mut self, why: &str) {
        self.sink = Sink::Detached;
        SINK_FD.store(-1, Ordering::Relaxed);
        // Nothing will be delivered any more: hooks stop waiting for room.
        self.stalled = true;
        self.st.shared.set_stalled(true);
        log::warn_once(
            &DETACH_SAID,
            &format!(
                "lost the collector ({why}); the program continues untraced and lost events are counted"
            ),
        );
    }

    /// Moves `Connecting` forward: start a collector if there is none, try to connect, and
    /// when that cannot work fall back to writing the trace file directly. `finishing` = at
    /// exit: one last attempt, then the fallback at once (the program is waiting).
    fn progress_connection(&mut self, finishing: bool) {
        let Sink::Connecting {
            socket,
            deadline,
            next_try,
        } = &mut self.sink
        else {
            return;
        };
        let now = Instant::now();
        if now < *next_try && !finishing {
            return;
        }
        if socket.is_none() {
            // Our fork parent's collector has gone (below): start our own.
            *socket = Some(
                start_own_collector(&self.st.config)
                    .map(|p| (p, SocketSource::Spawned))
                    .map_err(NoCollector),
            );
            *deadline = Instant::now() + Duration::from_secs(5);
        }
        let (path, source) = match socket {
            Some(Ok((path, source))) => (path.clone(), *source),
            Some(Err(NoCollector(e))) => {
                let why = format!("could not start a collector: {e}");
                self.fall_back(&why);
                return;
            }
            None => return,
        };
        match UnixStream::connect(&path) {
            Ok(stream) => self.connected(stream),
            // Our fork parent's collector has gone: start our own.
            Err(_) if source == SocketSource::Inherited => {
                *socket = None;
                *next_try = now;
            }
            Err(e) if finishing || now >= *deadline => {
                let why = format!("cannot connect to the collector at {}: {e}", path.display());
                self.fall_back(&why);
            }
            Err(_) => *next_try = now + Duration::from_millis(20),
        }
    }

    fn connected(&mut self, stream: UnixStream) {
        let mut head = wire::stream_header().to_vec();
        encode::hello(&mut head, &self.hello);
        if let Err(e) = send_all(&stream, &head) {
            self.drop_out();
            self.detach(&format!("{e}"));
            return;
        }
        let _ = stream.set_write_timeout(Some(SOCKET_WRITE_WAIT));
        self.peer_pid = peer_pid(&stream);
        SINK_FD.store(stream.as_raw_fd(), Ordering::Relaxed);
        log::info(&format!("connected to the collector (pid {})", self.st.pid));
        self.sink = Sink::Socket(stream);
    }

    /// No collector: write the trace file ourselves, in the same format a collector writes.
    fn fall_back(&mut self, why: &str) {
        let wanted = self.st.config.output_for(self.st.pid);
        if let Some(what) = not_a_regular_file(Path::new(&wanted)) {
            // /dev/full, a FIFO, a link: never written beside (`/dev/full.1`) or through. The
            // collector refused it for the same reason (that is `why`): one line says it all.
            self.drop_out();
            OUTPUT_REFUSED.store(true, Ordering::Relaxed);
            self.detach_quietly();
            log::warn(&format!(
                "not tracing: the output {wanted} (OOMTRACE_OUTPUT) is {what}; the program runs \
                 untraced"
            ));
            return;
        }
        // Never overwrite a trace (std opens files close-on-exec).
        let mut first = Vec::new();
        let _ = trace_file::write_header(&mut first, clock::unix_ns(), "liboomtrace (direct)");
        let _ = trace_file::write_conn_open(&mut first, 0, clock::unix_ns(), wire::WIRE_VERSION);
        let mut hello = Vec::new();
        encode::hello(&mut hello, &self.hello);
        let _ = trace_file::write_chunk(&mut first, 0, &hello, false);
        match DirectFile::create(Path::new(&wanted), &first) {
            Ok(d) => {
                log::warn_once(
                    &FALLBACK_SAID,
                    &format!("{why}; writing the trace directly to {}", d.path),
                );
                SINK_FD.store(d.file.as_raw_fd(), Ordering::Relaxed);
                self.sink = Sink::File(d);
            }
            Err((path, e)) => {
                // Named as the file it was (the numbered name when one was used); nothing
                // is left there.
                self.drop_out();
                self.detach(&format!(
                    "{why}; and cannot write the trace {path}: {} ({})",
                    trace_file::WriteFailure::of(&e).words(),
                    trace_file::WriteFailure::message(&e)
                ));
            }
        }
    }

    fn finish(&mut self, reason: GoodbyeReason) {
        // Twice: an inherited socket that fails turns into starting our own collector.
        self.progress_connection(true);
        self.progress_connection(true);
        self.push_lost_if_changed();
        self.close_events();
        encode::goodbye(&mut self.out, reason, self.seq);
        self.write_out();
        // As long as the collector takes bytes, the end of the stream is worth waiting for.
        let mut sent = self.sent_total;
        let mut since = Instant::now();
        while matches!(self.sink, Sink::Socket(_)) && !self.drained() {
            self.write_out();
            if self.sent_total != sent {
                sent = self.sent_total;
                since = Instant::now();
            } else if since.elapsed() >= FINISH_WRITE_WAIT {
                break;
            }
        }
        if matches!(self.sink, Sink::Socket(_)) && !self.drained() {
            // The collector is stopped or far behind: say so, since the counts of what is
            // missing cannot reach it any more.
            log::warn(&format!(
                "the collector did not take the end of this process's stream within {} ms \
                 (it took nothing for that long: stopped or overloaded): its trace ends early; \
                 {} events were already counted lost",
                FINISH_WRITE_WAIT.as_millis(),
                self.st.shared.total_lost()
            ));
            self.sink = Sink::Detached;
            SINK_FD.store(-1, Ordering::Relaxed);
            return;
        }
        match std::mem::replace(&mut self.sink, Sink::Detached) {
            Sink::Socket(s) => {
                // Wait (bounded) for the collector to close its end: it does so after the
                // process's data is in the trace file, so "program exited" implies "trace
                // written" for whoever reads it next.
                let _ = s.shutdown(std::net::Shutdown::Write);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                // Before closing, the collector may send one line this process's user must
                // hear (its trace could not all be written: a full disk). Then EOF.
                let mut said = Vec::new();
                let mut buf = [0u8; 512];
                while said.len() < 4096 {
                    match std::io::Read::read(&mut &s, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => said.extend_from_slice(&buf[..n]),
                    }
                }
                let said = String::from_utf8_lossy(&said);
                if let Some(line) = said.lines().map(str::trim).find(|l| !l.is_empty()) {
                    // Printed on the user's terminal: no control characters (a path may hold
                    // anything).
                    let line: String = line.chars().filter(|c| !c.is_control()).collect();
                    log::warn(&line);
                }
            }
            Sink::File(mut d) => {
                let mut tail = Vec::new();
                let _ = trace_file::write_conn_close(
                    &mut tail,
                    0,
                    clock::unix_ns(),
                    trace_file::CloseReason::Clean,
                    "",
                );
                let _ = trace_file::write_end(&mut tail, clock::unix_ns(), 1);
                if let Err(e) = d.write_record(&tail) {
                    log::warn(&d.failed(&e, 0, 0));
                }
            }
            _ => {}
        }
        SINK_FD.store(-1, Ordering::Relaxed);
        let lost = self.st.shared.total_lost();
        finish_failed_direct(self.st.pid, lost);
        if lost > 0
            && DETACH_SAID.load(Ordering::Relaxed)
            && !OUTPUT_REFUSED.load(Ordering::Relaxed)
        {
            log::warn(&format!("{lost} events were not recorded (see above)"));
        }
    }
}

/// The trace file the shim writes itself when no collector can run: whole records at known
/// offsets, and room reserved past the end (as the collector does, see
/// collector/src/trace_writer.rs), so that when the disk fills up the file still ends on a
/// whole record followed by an `Incomplete` record that says why.
struct DirectFile {
    file: std::fs::File,
    path: String,
    /// Bytes of the file that are whole records.
    written: u64,
    /// `fallocate` works on this filesystem.
    can_reserve: bool,
    /// What the `Incomplete` record says, once a write failed.
    failure: Option<DirectFailure>,
}

/// Why and when the direct file stops, and what was lost (see [`DirectFile::failed`]).
struct DirectFailure {
    t_unix_ns: u64,
    cause: trace_file::WriteFailure,
    message: String,
    lost_bytes: u64,
    lost_events: u64,
}

/// A direct file whose write failed, kept open until exit so that its `Incomplete` record can
/// then count every event lost since (not only the failed write's): the pid that wrote it,
/// the file, and the events counted lost before the failure. Only the drain thread of that
/// process touches it; a fork child sees another pid and leaves it alone, and `try_lock`
/// never waits on a lock that a fork copied while held.
static FAILED_DIRECT: std::sync::Mutex<Option<(u32, DirectFile, u64)>> =
    std::sync::Mutex::new(None);

fn keep_failed_direct(pid: u32, file: DirectFile, lost_before: u64) {
    if let Ok(mut kept) = FAILED_DIRECT.try_lock() {
        *kept = Some((pid, file, lost_before));
    }
}

/// At exit: the failed direct file's last record counts all that was lost since its failure.
fn finish_failed_direct(pid: u32, lost_now: u64) {
    let Ok(mut kept) = FAILED_DIRECT.try_lock() else {
        return;
    };
    if kept.as_ref().is_some_and(|(p, _, _)| *p == pid) {
        if let Some((_, mut file, before)) = kept.take() {
            file.recount(lost_now.saturating_sub(before));
        }
    }
}

/// Room kept allocated past the end of the direct file for the `Incomplete` and `End` records.
const DIRECT_RESERVE: u64 = 16 << 10;

impl DirectFile {
    /// Creates the file: `path`, or the first free numbered name beside it (a trace is never
    /// overwritten), with its first records. A file that cannot take them is removed: it is
    /// ours and holds nothing.
    fn create(wanted: &Path, first: &[u8]) -> Result<DirectFile, (String, std::io::Error)> {
        use std::os::unix::fs::FileExt;
        let (file, path) =
            trace_file::create_new(wanted).map_err(|e| (wanted.display().to_string(), e))?;
        let mut d = DirectFile {
            file,
            path: path.display().to_string(),
            written: 0,
            can_reserve: true,
            failure: None,
        };
        let result = d
            .reserve(first.len() as u64)
            .and_then(|_| d.file.write_all_at(first, 0));
        if let Err(e) = result {
            let _ = std::fs::remove_file(&path);
            return Err((d.path, e));
        }
        d.written = first.len() as u64;
        Ok(d)
    }

    /// Keeps `bytes` plus the reserve allocated after the last whole record, without
    /// changing the file's size. A filesystem without `fallocate` just goes without.
    fn reserve(&mut self, bytes: u64) -> std::io::Result<()> {
        if !self.can_reserve {
            return Ok(());
        }
        let e = loop {
            // SAFETY: fallocate on our own open file; KEEP_SIZE leaves its size unchanged, so
            // a reader never sees the reserved bytes.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    self.written as libc::off_t,
                    (bytes + DIRECT_RESERVE) as libc::off_t,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            // Interrupted by one of the program's signals: not a failed trace.
            if e.kind() != std::io::ErrorKind::Interrupted {
                break e;
            }
        };
        // Only a full disk (or file size limit) is a failure; EOPNOTSUPP, ENOSYS and the like
        // mean no reservations on this filesystem, and a real problem shows in the write.
        if trace_file::WriteFailure::of(&e) == trace_file::WriteFailure::Other {
            self.can_reserve = false;
            return Ok(());
        }
        Err(e)
    }

    fn write_record(&mut self, record: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        // A failed reservation writes nothing: the file still ends on a whole record.
        self.reserve(record.len() as u64)?;
        if let Err(e) = self.file.write_all_at(record, self.written) {
            // Part of the record may be there: cut back to the last whole one.
            let _ = self.file.set_len(self.written);
            return Err(e);
        }
        self.written += record.len() as u64;
        Ok(())
    }

    /// After a failed write: an `Incomplete` record (in the reserved room) says why the trace
    /// stops, then the `End`. Returns the one line to print: the file, the cause, what was lost.
    fn failed(&mut self, e: &std::io::Error, lost_bytes: u64, lost_events: u64) -> String {
        let failure = DirectFailure {
            t_unix_ns: clock::unix_ns(),
            cause: trace_file::WriteFailure::of(e),
            message: trace_file::WriteFailure::message(e),
            lost_bytes,
            lost_events,
        };
        let line = format!(
            "the trace {} is incomplete: {} ({}); {lost_events} events not written, and the \
             program continues untraced",
            self.path,
            failure.cause.words(),
            failure.message
        );
        self.failure = Some(failure);
        self.write_last_records();
        line
    }

    /// At exit, after a failure: `lost_events` in all were not written.
    fn recount(&mut self, lost_events: u64) {
        if let Some(f) = &mut self.failure {
            f.lost_events = f.lost_events.max(lost_events);
            self.write_last_records();
        }
    }

    /// The `Incomplete` and `End` records after the last whole record. Always the same length
    /// (the counts are fixed-size), so a rewrite fits where the first one did.
    fn write_last_records(&mut self) {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.failure else { return };
        let mut rec = Vec::new();
        let _ = trace_file::write_incomplete(
            &mut rec,
            f.t_unix_ns,
            f.cause,
            f.lost_bytes,
            f.lost_events,
            &f.message,
        );
        let _ = trace_file::write_end(&mut rec, clock::unix_ns(), 1);
        if self.file.write_all_at(&rec, self.written).is_err() {
            // No room even for that: the file ends on its last whole record.
            let _ = self.file.set_len(self.written);
        }
    }
}

/// What `path` is when it exists and is not a regular file (a trace is never written into
/// or beside a device, a FIFO, a directory or a link).
fn not_a_regular_file(path: &Path) -> Option<String> {
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    let what = oomtrace_proto::file_kind::describe(&t);
    if t.is_file() {
        None
    } else if t.is_symlink() || t.is_dir() {
        Some(what.to_string())
    } else {
        Some(format!("{what}, not a regular file"))
    }
}

/// Sends as much of `buf` as the socket takes before its write timeout (or at once, with
/// `MSG_DONTWAIT` in `flags`), and for at most about `SOCKET_WRITE_WAIT` in all, so that the
/// drain thread gets back to the queue while a slow collector catches up (hooks waiting for
/// room then get some every ~20 ms, not once the whole backlog is out): Ok(bytes sent);
/// `taken` hears of every write that took bytes. A full socket is not an error; a dead
/// collector is (MSG_NOSIGNAL: never a SIGPIPE).
fn send_some(
    s: &UnixStream,
    buf: &[u8],
    flags: i32,
    mut taken: impl FnMut(usize),
) -> std::io::Result<usize> {
    let start = Instant::now();
    let mut sent = 0;
    while sent < buf.len() {
        // SAFETY: valid fd and buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf[sent..].as_ptr().cast(),
                buf.len() - sent,
                libc::MSG_NOSIGNAL | flags,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => return Ok(sent),
                _ => return Err(e),
            }
        }
        sent += n as usize;
        taken(n as usize);
        if start.elapsed() >= SOCKET_WRITE_WAIT {
            break;
        }
    }
    Ok(sent)
}

/// The pid of the process that listened on the other end (SO_PEERCRED), 0 if unknown.
fn peer_pid(s: &UnixStream) -> i32 {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid fd and out-parameters of the right size.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        cred.pid
    } else {
        0
    }
}

/// `send` with MSG_NOSIGNAL: a dead collector must be an error, never a SIGPIPE for the host.
fn send_all(s: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: valid fd and buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// The `oomtrace` binary: `OOMTRACE_COLLECTOR`, else next to liboomtrace.so, else on PATH.
fn find_collector() -> Option<PathBuf> {
    let executable = |p: &Path| {
        CString::new(p.as_os_str().as_encoded_bytes())
            // SAFETY: valid C string.
            .map(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
            .unwrap_or(false)
    };
    if let Some(dir) = own_dir() {
        let p = dir.join("oomtrace");
        if executable(&p) {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("oomtrace"))
        .find(|p| executable(p))
}

/// The directory liboomtrace.so was loaded from.
fn own_dir() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr on one of our own functions.
    if unsafe { libc::dladdr(find_collector as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    let p = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let p = PathBuf::from(p.to_string_lossy().into_owned());
    let p = std::fs::canonicalize(&p).unwrap_or(p);
    p.parent().map(Path::to_path_buf)
}

/// A fresh 0700 directory for the collector's socket.
fn private_dir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let template = base.join("oomtrace-XXXXXX");
    let mut bytes = template.into_os_string().into_encoded_bytes();
    bytes.push(0);
    // SAFETY: a writable NUL-terminated template.
    let p = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    bytes.pop();
    // SAFETY: mkdtemp filled in the template with path bytes.
    Ok(PathBuf::from(unsafe {
        std::ffi::OsString::from_encoded_bytes_unchecked(bytes)
    }))
}

/// Starts `oomtrace collect --detach` for this process and returns its socket. The collector
/// daemonizes once its socket is listening, so the command returning means it is ready, and it
/// is never left as a child of the program (whose own `wait` calls must not see it).
fn spawn_collector(config: &crate::config::Config) -> Result<PathBuf, String> {
    let exe = config
        .collector
        .as_ref()
        .map(PathBuf::from)
        .or_else(find_collector)
        .ok_or("no `oomtrace` binary next to liboomtrace.so or on PATH (set OOMTRACE_COLLECTOR)")?;
    let dir = private_dir().map_err(|e| format!("cannot create a private directory: {e}"))?;
    let socket = dir.join("collector.sock");
    // SAFETY: getpid has no preconditions.
    let output = config.output_for(unsafe { libc::getpid() } as u32);
    let output = std::env::current_dir()
        .map(|d| d.join(&output))
        .unwrap_or_else(|_| PathBuf::from(&output));
    let started = std::process::Command::new(&exe)
        .arg("collect")
        .arg("--socket")
        .arg(&socket)
        .arg("--output")
        .arg(&output)
        .arg("--detach")
        .arg("--exit-when-idle")
        // Processes sharing an output name (exec under the same pid, several ranks with one
        // OOMTRACE_OUTPUT) each get their own file instead of overwriting each other's.
        .arg("--no-clobber")
        .arg("--quiet")
        .env_remove("LD_PRELOAD")
        .env_remove("OOMTRACE_SOCKET")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    let failure = match started {
        Err(e) => Some(format!("cannot run {}: {e}", exe.display())),
        Ok(r) if !r.status.success() => {
            let msg = String::from_utf8_lossy(&r.stderr);
            let line = msg.lines().next().unwrap_or("").trim().to_string();
            Some(format!(
                "{} exited with {}: {line}",
                exe.display(),
                r.status
            ))
        }
        Ok(_) => None,
    };
    if let Some(why) = failure {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(why);
    }
    // The collector picks the name when the first process connects (no-clobber: a numbered
    // one if this is taken); it names the file it used in anything it says.
    log::info(&format!(
        "started a collector for {} (or the first free numbered name beside it; socket {})",
        output.display(),
        socket.display()
    ));
    Ok(socket)
}

/// Used by the fork child: forget the parent's sink without touching its state.
pub fn close_inherited_sink() {
    let fd = SINK_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: closes the child's copy of the parent's socket or file; the parent's copy
        // stays open.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
}
