//! From hooks to the collector: a bounded lock-free queue, one drain thread, framed records
//! over a Unix socket (or, failing that, straight into a trace file).
//!
//! - Hooks never block on I/O. Allocation events use `try_send`; when the queue is full they
//!   are counted as lost. Frees, stack and module definitions wait up to 50 ms for room (a lost
//!   free would become a phantom leak, a lost stack definition an unknown stack), then are
//!   counted too, and later ones stop waiting until the queue has drained.
//! - The drain thread polls with a short sleep rather than parking per event (a parked
//!   receiver makes every send pay a futex wake: +280 ns/pair in the prototype); producers
//!   wake it only when the queue is a quarter full.
//! - The drain thread never blocks on a collector that does not read (stopped, or slower
//!   than the program): each socket write waits at most 20 ms, and what the socket does not
//!   take waits in the drain thread, up to 16 MiB (or twice the queue). Beyond that, new
//!   events are counted lost there, each with its kind and device, while stack and module
//!   definitions still go out. When the collector reads again, everything waiting and the
//!   `Lost` counts (sent every 500 ms when they change) reach it.
//! - If the collector goes away, the process keeps running at full speed; the drain thread
//!   discards and counts. At exit, if the end of the stream cannot get out within 2 s, the
//!   shim says so on stderr: those counts cannot reach the collector any more.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TrySendError};
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

/// Counters and signals shared by hooks and the drain thread.
pub struct Shared {
    lost_events: AtomicU64,
    lost_frees: AtomicU64,
    lost_stacks: AtomicU64,
    lost_by_device: [AtomicU64; LOST_SLOTS],
    /// A reliable send timed out: later ones do not wait until the drain thread catches up.
    congested: AtomicBool,
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
            congested: AtomicBool::new(false),
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
    fn nudge(&self, tx: &crossbeam_channel::Sender<Msg>) {
        if self.drainer_idle.load(Ordering::Relaxed) && tx.len() * 4 >= self.capacity {
            self.wake();
        }
    }
}

/// Best effort: an allocation event.
#[inline]
pub fn send_event(st: &State, ev: Event) {
    match st.tx.try_send(Msg::Event(ev)) {
        Ok(()) => st.shared.nudge(&st.tx),
        Err(_) => st.shared.count_lost(&ev),
    }
}

/// Waits briefly for room; false if the message could not be queued.
pub fn send_reliable(st: &State, msg: Msg) -> bool {
    match st.tx.try_send(msg) {
        Ok(()) => {
            st.shared.nudge(&st.tx);
            true
        }
        Err(TrySendError::Full(msg)) => {
            if st.shared.congested.load(Ordering::Relaxed) {
                return false;
            }
            st.shared.wake();
            match st.tx.send_timeout(msg, Duration::from_millis(50)) {
                Ok(()) => true,
                Err(_) => {
                    st.shared.congested.store(true, Ordering::Relaxed);
                    false
                }
            }
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

/// A free (or other removal): waits briefly for room, counted if it still cannot go.
pub fn send_reliable_event(st: &State, ev: Event) {
    if !send_reliable(st, Msg::Event(ev)) {
        st.shared.count_lost(&ev);
    }
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

/// Asks the drain thread to write out what is queued; waits up to `timeout`.
pub fn flush(st: &State, timeout: Duration) -> bool {
    let done = Done::new();
    if !send_reliable(st, Msg::Flush(done.clone())) {
        return false;
    }
    st.shared.wake();
    done.wait(timeout)
}

/// Asks the drain thread to finish (goodbye, close); waits up to `timeout`.
pub fn shutdown(st: &State, reason: GoodbyeReason, timeout: Duration) -> bool {
    let done = Done::new();
    // Shutdown must get through even when the queue is congested.
    st.shared.congested.store(false, Ordering::Relaxed);
    if !send_reliable(st, Msg::Shutdown(reason, done.clone())) {
        return false;
    }
    st.shared.wake();
    done.wait(timeout)
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
    let spawned = std::thread::Builder::new()
        .name("oomtrace-drain".into())
        .stack_size(256 << 10)
        .spawn(move || {
            crate::guard::catch(|| Drainer::new(st, rx).run());
        });
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    match spawned {
        Ok(handle) => {
            let _ = st.shared.drainer.set(handle.thread().clone());
            true
        }
        Err(_) => false,
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
    File(std::fs::File),
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
/// Bytes kept while the collector takes nothing (at least; twice the event queue's size if
/// that is more: a user who asked for a large buffer asked for that much slack); beyond,
/// new events are counted lost.
const STALLED_LIMIT: usize = 16 << 20;
/// At exit, how long the end of the stream may take to get out.
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

static DETACH_SAID: AtomicBool = AtomicBool::new(false);
static FALLBACK_SAID: AtomicBool = AtomicBool::new(false);

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
        let mut flushes: Vec<Arc<Done>> = Vec::new();
        loop {
            self.cal.refresh();
            let mut got = 0usize;
            let mut shutdown = None;
            while got < 200_000 {
                let Ok(msg) = self.rx.try_recv() else { break };
                got += 1;
                match msg {
                    Msg::Flush(done) => flushes.push(done),
                    Msg::Shutdown(reason, done) => {
                        shutdown = Some((reason, done));
                        break;
                    }
                    other => self.encode(other),
                }
                // While the collector takes nothing, writing per chunk would wait once per
                // message; then frames gather in `out` until the round ends.
                if self.out.len() >= WRITE_CHUNK && self.unsent.is_empty() {
                    self.write_out();
                }
            }
            if let Some((reason, done)) = shutdown {
                // Whatever other threads queued before the goodbye still goes out.
                while let Ok(msg) = self.rx.try_recv() {
                    match msg {
                        Msg::Flush(d) => flushes.push(d),
                        Msg::Shutdown(_, d) => d.set(),
                        other => self.encode(other),
                    }
                }
                self.finish(reason);
                for d in flushes.drain(..) {
                    d.set();
                }
                done.set();
                return;
            }
            self.progress_connection(false);
            self.maybe_send_lost();
            self.write_out();
            // A flush is done when its data left the process, not when a write was tried: a
            // collector that reads slowly keeps flushes waiting (their callers' wait is bounded).
            if self.drained() || !matches!(self.sink, Sink::Socket(_)) {
                for d in flushes.drain(..) {
                    d.set();
                }
            }
            if got == 0 {
                self.st.shared.congested.store(false, Ordering::Relaxed);
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

    fn close_events(&mut self) {
        if let Some(at) = self.events_at.take() {
            encode::end_events(&mut self.out, at);
            self.events_in_frame = 0;
        }
    }

    fn encode(&mut self, msg: Msg) {
        // Detached, or a collector that has fallen `STALLED_LIMIT` behind: events are counted
        // lost here, each with its kind and device (a lost free is a lost free, not a phantom
        // leak); stack and module definitions still go out, so later events stay readable.
        let stalled = matches!(self.sink, Sink::Socket(_))
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
            Sink::File(f) => trace_file::write_chunk(f, 0, &self.out, false),
        };
        match result {
            Ok(()) => {
                self.out.clear();
                self.out_events = 0;
            }
            Err(e) => {
                self.drop_out();
                self.detach(&format!("{e}"));
            }
        }
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

    /// Sends what the socket takes within `SOCKET_WRITE_WAIT`: first the committed bytes,
    /// then `out`. A collector that reads nothing costs the program nothing: frames wait here
    /// up to `STALLED_LIMIT`, after which `encode` counts new events lost instead.
    fn send_to_socket(&mut self, s: &UnixStream) -> std::io::Result<()> {
        if !self.unsent.is_empty() {
            let n = send_some(s, &self.unsent)?;
            self.unsent.drain(..n);
        }
        if self.unsent.is_empty() {
            let n = send_some(s, &self.out)?;
            if n < self.out.len() {
                self.unsent.extend_from_slice(&self.out[n..]);
            }
            self.out.clear();
            self.out_events = 0;
        }
        Ok(())
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
        SINK_FD.store(stream.as_raw_fd(), Ordering::Relaxed);
        log::info(&format!("connected to the collector (pid {})", self.st.pid));
        self.sink = Sink::Socket(stream);
    }

    /// No collector: write the trace file ourselves, in the same format a collector writes.
    fn fall_back(&mut self, why: &str) {
        let wanted = self.st.config.output_for(self.st.pid);
        // Never overwrite a trace (std opens files close-on-exec).
        match trace_file::create_new(Path::new(&wanted)) {
            Ok((mut f, path)) => {
                let path = path.display().to_string();
                let mut first = Vec::new();
                encode::hello(&mut first, &self.hello);
                let ok = trace_file::write_header(&mut f, clock::unix_ns(), "liboomtrace (direct)")
                    .and_then(|_| {
                        trace_file::write_conn_open(&mut f, 0, clock::unix_ns(), wire::WIRE_VERSION)
                    })
                    .and_then(|_| trace_file::write_chunk(&mut f, 0, &first, false));
                if let Err(e) = ok {
                    self.drop_out();
                    self.detach(&format!("{why}; and cannot write {path}: {e}"));
                    return;
                }
                log::warn_once(
                    &FALLBACK_SAID,
                    &format!("{why}; writing the trace directly to {path}"),
                );
                SINK_FD.store(f.as_raw_fd(), Ordering::Relaxed);
                self.sink = Sink::File(f);
            }
            Err(e) => {
                self.drop_out();
                self.detach(&format!("{why}; and cannot create {wanted}: {e}"));
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
        let deadline = Instant::now() + FINISH_WRITE_WAIT;
        while matches!(self.sink, Sink::Socket(_)) && !self.drained() && Instant::now() < deadline {
            self.write_out();
        }
        if matches!(self.sink, Sink::Socket(_)) && !self.drained() {
            // The collector is stopped or far behind: say so, since the counts of what is
            // missing cannot reach it any more.
            log::warn(&format!(
                "the collector did not take the end of this process's stream within {} ms \
                 (stopped or overloaded): its trace ends early; {} events were already \
                 counted lost",
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
                let mut buf = [0u8; 64];
                let _ = std::io::Read::read(&mut &s, &mut buf);
            }
            Sink::File(mut f) => {
                let _ = trace_file::write_conn_close(
                    &mut f,
                    0,
                    clock::unix_ns(),
                    trace_file::CloseReason::Clean,
                    "",
                );
                let _ = trace_file::write_end(&mut f, clock::unix_ns(), 1);
                let _ = f.flush();
            }
            _ => {}
        }
        SINK_FD.store(-1, Ordering::Relaxed);
        let lost = self.st.shared.total_lost();
        if lost > 0 && DETACH_SAID.load(Ordering::Relaxed) {
            log::warn(&format!("{lost} events were not recorded (collector lost)"));
        }
    }
}

/// Sends as much of `buf` as the socket takes before its write timeout: Ok(bytes sent). A
/// full socket is not an error; a dead collector is (MSG_NOSIGNAL: never a SIGPIPE).
fn send_some(s: &UnixStream, buf: &[u8]) -> std::io::Result<usize> {
    let mut sent = 0;
    while sent < buf.len() {
        // SAFETY: valid fd and buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf[sent..].as_ptr().cast(),
                buf.len() - sent,
                libc::MSG_NOSIGNAL,
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
    }
    Ok(sent)
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
    log::info(&format!(
        "started a collector writing {} (socket {})",
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
