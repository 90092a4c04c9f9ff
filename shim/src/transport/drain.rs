//! The drain thread: takes messages from the outbox, encodes them into wire frames, and
//! delivers them to the collector's socket, or to the shim's own trace file when no collector
//! can run. It alone decides when the collector is stalled (see the transport module doc).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oomtrace_proto::counter_page::CounterPage;
use oomtrace_proto::trace_file;
use oomtrace_proto::wire::{self, encode, GoodbyeReason, Hello, Lost};
use oomtrace_proto::{Event, EventKind, StackId};

use super::fd_guard;
use super::file::{finish_failed_direct, keep_failed_direct, not_a_regular_file, DirectFile};
use super::outbox::{take_page_fd, Done, Msg, Outbox, ON_DRAIN_THREAD};
use super::ring::Receiver;
use super::sink::Sink;
use super::socket::UnixSink;
use super::spawn::{inherited_socket, start_own_collector};
use crate::clock::{self, Calibration};
use crate::config::Config;
use crate::log;
use crate::once::OneShot;

/// What the drain thread needs to know of the process besides its outbox.
pub struct DrainSetup {
    pub config: Config,
    /// The collector this process started at init (plain LD_PRELOAD): its socket, or why not.
    pub own_collector: Option<Result<PathBuf, String>>,
    /// The clock origin, taken before this process's first event was stamped.
    pub clock_origin: Calibration,
}

/// The stall limit for a collector whose process is stopped (SIGSTOP, a debugger; state `T`
/// or `t` in /proc): data waited this long without the socket taking a byte, and hooks stop
/// waiting for room (see the module doc).
const STALL_WAIT: Duration = Duration::from_millis(250);
/// The stall limit for a collector that runs but takes nothing (hung, or its process cannot
/// be seen): a running collector can be busy for over a second without reading (the first
/// symbolization of a large library, a debug build), which must not cost events.
const HUNG_WAIT: Duration = Duration::from_secs(10);
/// How long the drain thread sleeps after emptying the queue (and the step of its back-off
/// when idle): about 1,000 rounds a second at most, each taking a batch, encoding it into one
/// buffer and sending it in one `send`. The queue absorbs what comes meanwhile (65,536
/// messages by default: 13 ms at 5 M events/s); a quarter full, a hook wakes the drain thread.
const BATCH_WAIT: Duration = Duration::from_millis(1);
/// The drain thread tells waiting hooks about room every this many messages taken.
const ROOM_EVERY: usize = 1024;

/// Starts the drain thread with all signals blocked, so signals meant for the program are
/// never delivered to it.
pub fn spawn_drainer(ob: &'static Outbox, rx: Receiver, setup: DrainSetup) -> bool {
    // SAFETY: sigset_t is a plain bit array; all-zero is a valid (empty) set.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal-mask calls on the current thread with valid sets; the old mask is
    // restored right after the spawn.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // Before the thread exists: hooks may wait from the first event on.
    ob.shared.draining.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("oomtrace-drain".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let _ = ON_DRAIN_THREAD.try_with(|f| f.set(true));
            crate::guard::catch(|| Drainer::<UnixSink>::new(ob, setup, Instant::now).run(rx));
            // Ended (or failed): nobody waits for room any more; waiting hooks re-check.
            ob.shared.draining.store(false, Ordering::Release);
            ob.shared.progressed();
        });
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    match spawned {
        Ok(handle) => {
            let _ = ob.shared.drainer.set(handle.thread().clone());
            true
        }
        Err(_) => {
            ob.shared.draining.store(false, Ordering::Release);
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

/// Where the stream goes: connecting, a connected sink, the direct file, or nowhere.
enum Conn<S> {
    /// Not connected yet; events accumulate in `out` (bounded).
    Connecting {
        /// None: start a collector first. Err: none could be started.
        socket: Option<Result<(PathBuf, SocketSource), NoCollector>>,
        deadline: Instant,
        next_try: Instant,
    },
    Stream(S),
    File(DirectFile),
    /// The collector is gone: everything is counted and dropped.
    Detached,
}

/// Bytes kept while not connected yet, before events are counted as lost.
const PENDING_LIMIT: usize = 64 << 20;
/// Writes happen at least this often when data is waiting.
const WRITE_CHUNK: usize = 1 << 20;
/// Bytes kept waiting for the socket (at least; twice the event queue's size if that is more:
/// a user who asked for a large buffer asked for that much slack). At this cap the drain
/// thread stops taking from the queue while the collector reads (hooks wait), and counts new
/// events lost only once the collector is stalled (`STALL_WAIT`).
const STALLED_LIMIT: usize = 16 << 20;
/// At exit, how long the end of the stream may go without the socket taking a byte.
const FINISH_WRITE_WAIT: Duration = Duration::from_millis(2000);

struct Drainer<S: Sink> {
    ob: &'static Outbox,
    setup: DrainSetup,
    sink: Conn<S>,
    /// The time source (`Instant::now`; a fake clock in tests).
    now: fn() -> Instant,
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
    /// Flush requests, each with the stream position it waits for.
    flushes: Vec<(u64, Arc<Done>)>,
    /// A second counter page, made at connect when the first one's descriptor was gone (the
    /// program closed every descriptor before the shim first reached its collector): the
    /// drain thread copies the counts into it every round and at the end.
    mirror: Option<CounterPage>,
}

/// What one round of the drain loop did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// Shut down: the stream has ended.
    Finished,
    /// Took nothing from the queue: sleep a little.
    Idle,
    /// Took messages and emptied the queue: sleep `BATCH_WAIT` while the next batch
    /// gathers.
    CaughtUp,
    /// Took a full round's worth, or held back at the cap: go on at once.
    Busy,
}

/// Which buffer `Drainer::send_counted` sends.
#[derive(Clone, Copy)]
enum Which {
    Unsent,
    Out,
}

static DETACH_SAID: OneShot = OneShot::new();
static FALLBACK_SAID: OneShot = OneShot::new();
/// The output was refused: the process runs untraced by design, not for a lost collector.
static OUTPUT_REFUSED: AtomicBool = AtomicBool::new(false);

fn read_cmdline() -> Vec<String> {
    fd_guard::transient(|| std::fs::read("/proc/self/cmdline"))
        .and_then(Result::ok)
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The launcher's variables (rank, world size, ...) as the process started with them. Read
/// from `/proc/self/environ`, not `getenv`: this runs on the drain thread while the program
/// may be calling `setenv`, and launchers set these before `exec`.
fn read_launch_vars() -> Vec<(String, String)> {
    use oomtrace_proto::launch::{LAUNCH_VARS, MAX_VALUE};
    let Some(Ok(environ)) = fd_guard::transient(|| std::fs::read("/proc/self/environ")) else {
        return Vec::new();
    };
    environ
        .split(|&c| c == 0)
        .filter_map(|entry| {
            let eq = entry.iter().position(|&c| c == b'=')?;
            let (name, value) = (&entry[..eq], &entry[eq + 1..]);
            let name = LAUNCH_VARS.iter().find(|n| n.as_bytes() == name)?;
            let value = &value[..value.len().min(MAX_VALUE)];
            Some((
                name.to_string(),
                String::from_utf8_lossy(value).into_owned(),
            ))
        })
        .collect()
}

/// The host's name, "" when unreadable (a trace from many nodes tells them apart by it).
fn read_host() -> String {
    fd_guard::transient(|| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .and_then(Result::ok)
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

impl<S: Sink> Drainer<S> {
    fn new(ob: &'static Outbox, setup: DrainSetup, now_fn: fn() -> Instant) -> Drainer<S> {
        let socket = match (
            &setup.config.socket,
            &setup.own_collector,
            inherited_socket(),
        ) {
            (Some(p), _, _) => Some(Ok((PathBuf::from(p), SocketSource::Configured))),
            (None, Some(Ok(p)), _) => Some(Ok((p.clone(), SocketSource::Spawned))),
            (None, Some(Err(e)), _) => Some(Err(NoCollector(e.clone()))),
            (None, None, Some(p)) => Some(Ok((p.clone(), SocketSource::Inherited))),
            (None, None, None) => None,
        };
        let now = now_fn();
        let hello = Hello {
            pid: ob.pid,
            // SAFETY: getppid has no preconditions.
            ppid: unsafe { libc::getppid() } as u32,
            start_unix_ns: clock::unix_ns(),
            flags: if setup.config.stacks {
                wire::hello_flags::NATIVE_STACKS
            } else {
                0
            },
            shim_version: env!("CARGO_PKG_VERSION").into(),
            exe: std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            argv: read_cmdline(),
            start_mono_ns: clock::monotonic_ns(),
            host: read_host(),
            launch: read_launch_vars(),
        };
        Drainer {
            ob,
            now: now_fn,
            sink: Conn::Connecting {
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
            stalled_limit: STALLED_LIMIT.max(setup.config.buffer * oomtrace_proto::EVENT_SIZE * 2),
            stalled: false,
            last_taken: now,
            sent_total: 0,
            out_events: 0,
            events_at: None,
            events_in_frame: 0,
            seq: 0,
            cal: setup.clock_origin.clone(),
            setup,
            last_ts: 0,
            hello,
            last_lost: Lost::default(),
            lost_checked: now,
            idle_rounds: 0,
            flushes: Vec::new(),
            mirror: None,
        }
    }

    /// Drains `rx` (the outbox's one receiver) until the shutdown.
    fn run(mut self, mut rx: Receiver) {
        loop {
            let sleep = match self.round(&mut rx) {
                Round::Finished => return,
                Round::Busy => {
                    self.idle_rounds = 0;
                    continue;
                }
                // Caught up: let the next batch gather instead of chasing the producers one
                // message at a time (each message would then cost a cache-line transfer per
                // slot, and each round a `send` of a few hundred bytes and a collector wake-up).
                Round::CaughtUp => {
                    self.idle_rounds = 0;
                    BATCH_WAIT
                }
                Round::Idle => {
                    self.idle_rounds = self.idle_rounds.saturating_add(1);
                    // Backing off to 5 ms when idle.
                    BATCH_WAIT * self.idle_rounds.min(5)
                }
            };
            // Producers wake us early: a hook that finds the queue a quarter full (`nudge`),
            // one waiting for room, a flush, the shutdown.
            self.ob.shared.drainer_idle.store(true, Ordering::SeqCst);
            if rx.len() * 4 < self.ob.shared.capacity {
                std::thread::park_timeout(sleep);
            }
            self.ob.shared.drainer_idle.store(false, Ordering::Relaxed);
        }
    }

    /// One turn of the drain loop: take what the queue holds (up to the cap), write, decide
    /// the stall, answer flushes. Never sleeps (`run` does, between idle rounds).
    fn round(&mut self, rx: &mut Receiver) -> Round {
        let mut flushes = std::mem::take(&mut self.flushes);
        self.ob.shared.heartbeat.fetch_add(1, Ordering::Relaxed);
        self.cal.refresh();
        self.mirror_counts();
        let mut got = 0usize;
        let mut shutdown = None;
        let mut held_back = false;
        let mut emptied = false;
        while got < 200_000 {
            // At the cap, while the collector still reads: leave the rest in the queue
            // (hooks wait for room) instead of dropping it.
            if self.holding_back() {
                held_back = true;
                break;
            }
            let Some(head) = rx.head() else {
                emptied = true;
                break;
            };
            got += 1;
            // Events (nearly every message) are encoded where they lie in the queue.
            if let Msg::Event(ev) = head.msg() {
                self.encode_event(ev);
                drop(head);
            } else {
                match head.take() {
                    Msg::Flush(done) => flushes.push((self.stream_end(), done)),
                    Msg::Shutdown(reason, done) => {
                        shutdown = Some((reason, done));
                        break;
                    }
                    other => self.encode(other),
                }
            }
            if got.is_multiple_of(ROOM_EVERY) {
                self.ob.shared.progressed();
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
            self.ob.shared.progressed();
        }
        if let Some((reason, done)) = shutdown {
            // Whatever other threads queued before the goodbye still goes out (past the
            // cap if need be: the queue bounds it).
            while let Some(msg) = rx.try_recv() {
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
            return Round::Finished;
        }
        self.progress_connection(false);
        self.maybe_send_lost();
        self.write_out();
        self.update_stall();
        // A flush is done when its data left the process, not when a write was tried: a
        // collector that reads slowly keeps flushes waiting (their callers give up only
        // when nothing moves).
        if !matches!(self.sink, Conn::Stream(_)) {
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
        self.flushes = flushes;
        if got == 0 && !held_back {
            Round::Idle
        } else if emptied && self.ob.shared.waiters.load(Ordering::Relaxed) == 0 {
            Round::CaughtUp
        } else {
            Round::Busy
        }
    }

    /// Connected, `STALLED_LIMIT` waiting, and the collector still reading: take nothing more
    /// from the queue until the socket has taken some.
    fn holding_back(&self) -> bool {
        matches!(self.sink, Conn::Stream(_))
            && !self.stalled
            && self.unsent.len() + self.out.len() >= self.stalled_limit
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
        let now = (self.now)();
        let stalled = match &mut self.sink {
            Conn::Detached => true,
            Conn::Stream(s) => {
                if self.out.is_empty() && self.unsent.is_empty() {
                    self.last_taken = now;
                }
                let quiet = now.duration_since(self.last_taken);
                quiet >= HUNG_WAIT || (quiet >= STALL_WAIT && s.reader_stopped(now))
            }
            Conn::Connecting { .. } | Conn::File(_) => false,
        };
        if stalled != self.stalled {
            self.stalled = stalled;
            self.ob.shared.set_stalled(stalled);
            if matches!(self.sink, Conn::Stream(_)) {
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

    /// Detached, or a stalled collector (nothing taken for `STALL_WAIT`) with
    /// `STALLED_LIMIT` waiting: events are counted lost, each with its kind and device (a lost
    /// free is a lost free, not a phantom leak); stack and module definitions still go out
    /// while stalled, so later events stay readable. A collector that still reads never gets
    /// here over the cap: `round` stops taking from the queue instead. Returns (events are
    /// dropped, definitions are dropped).
    #[inline]
    fn dropping(&self) -> (bool, bool) {
        match self.sink {
            Conn::Detached => (true, true),
            Conn::Stream(_) => {
                let over = self.stalled && self.unsent.len() + self.out.len() > self.stalled_limit;
                (over, false)
            }
            _ => (false, false),
        }
    }

    /// One event into the open Events frame of `out` (the hot path: nearly every message).
    #[inline]
    fn encode_event(&mut self, ev: &Event) {
        if self.dropping().0 {
            self.ob.shared.count_lost(ev);
            return;
        }
        if self.events_at.is_none() {
            self.events_at = Some(encode::begin_events(&mut self.out));
        }
        self.seq += 1;
        let mut ev = *ev;
        ev.seq = self.seq;
        ev.ts_ns = self.monotonic(ev.ts_ns);
        encode::push_event(&mut self.out, &ev);
        self.out_events += 1;
        self.events_in_frame += 1;
        if self.events_in_frame >= 8192 {
            self.close_events();
        }
    }

    fn encode(&mut self, msg: Msg) {
        let (drop_events, drop_defs) = self.dropping();
        if drop_events {
            if let Msg::Event(ev) | Msg::Marker { ev, .. } = msg {
                self.ob.shared.count_lost(&ev);
                return;
            }
            if drop_defs {
                return;
            }
        }
        match msg {
            Msg::Event(ev) => self.encode_event(&ev),
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
            Msg::Launch(vars) => {
                self.close_events();
                encode::launch(&mut self.out, &vars);
            }
            Msg::TorchMemory(mut m) => {
                self.close_events();
                m.ts_ns = self.monotonic(m.ts_ns);
                encode::torch_memory(&mut self.out, &m);
            }
            Msg::Flush(_) | Msg::Shutdown(..) => {}
        }
    }

    fn monotonic(&mut self, ticks: u64) -> u64 {
        self.last_ts = self.last_ts.max(self.cal.to_ns(ticks));
        self.last_ts
    }

    fn maybe_send_lost(&mut self) {
        let now = (self.now)();
        if now.duration_since(self.lost_checked) < Duration::from_millis(500) {
            return;
        }
        self.lost_checked = now;
        self.push_lost_if_changed();
    }

    fn push_lost_if_changed(&mut self) {
        let lost = self.ob.shared.snapshot();
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
        if matches!(self.sink, Conn::Stream(_)) {
            return self.write_socket();
        }
        if self.out.is_empty() {
            return;
        }
        let result = match &mut self.sink {
            Conn::Connecting { .. } => {
                if self.out.len() > PENDING_LIMIT {
                    self.drop_out();
                }
                return;
            }
            Conn::Detached => {
                self.drop_out();
                return;
            }
            Conn::Stream(_) => return,
            Conn::File(d) => {
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
                self.ob.shared.progressed();
            }
            Err(e) => {
                let lost_bytes = self.out.len() as u64;
                let lost_events = self.out_events;
                self.drop_out();
                if matches!(self.sink, Conn::File(_)) {
                    let Conn::File(mut d) = std::mem::replace(&mut self.sink, Conn::Detached)
                    else {
                        return;
                    };
                    // The file ends on its last whole record, then says why it stops there.
                    d.failed(&e, lost_bytes, lost_events);
                    // What is lost from here on is this file's loss too: counted, and said in
                    // one line, at exit.
                    let before = self.ob.shared.total_lost().saturating_sub(lost_events);
                    keep_failed_direct(self.ob.pid, d, before);
                    self.detach_quietly();
                } else {
                    self.detach(&format!("{e}"));
                }
            }
        }
    }

    /// Stops delivering without the "lost the collector" line (the caller says what happened).
    fn detach_quietly(&mut self) {
        DETACH_SAID.first();
        self.detach("");
    }

    fn write_socket(&mut self) {
        let Conn::Stream(mut s) = std::mem::replace(&mut self.sink, Conn::Detached) else {
            return;
        };
        match self.send_to_socket(&mut s) {
            Ok(()) => self.sink = Conn::Stream(s),
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
    fn send_to_socket(&mut self, s: &mut S) -> std::io::Result<()> {
        if !self.unsent.is_empty() {
            let n = self.send_counted(s, Which::Unsent, false)?;
            self.unsent.drain(..n);
        }
        if self.unsent.is_empty() {
            let n = self.send_counted(s, Which::Out, false)?;
            if n < self.out.len() {
                self.unsent.extend_from_slice(&self.out[n..]);
            }
            self.out.clear();
            self.out_events = 0;
        }
        Ok(())
    }

    /// `send_some` of `unsent` or `out`, counting the bytes taken as progress.
    fn send_counted(&mut self, s: &mut S, which: Which, now_only: bool) -> std::io::Result<usize> {
        let buf = match which {
            Which::Unsent => &self.unsent,
            Which::Out => &self.out,
        };
        let shared = &self.ob.shared;
        let mut taken = 0u64;
        let r = s.send(buf, now_only, &mut |n| {
            taken += n as u64;
            shared.progressed();
        });
        if taken > 0 {
            self.sent_total += taken;
            self.last_taken = (self.now)();
        }
        r
    }

    /// What the socket takes of `unsent` right now, without waiting.
    fn write_unsent_now(&mut self) {
        let Conn::Stream(mut s) = std::mem::replace(&mut self.sink, Conn::Detached) else {
            return;
        };
        match self.send_counted(&mut s, Which::Unsent, true) {
            Ok(n) => {
                self.unsent.drain(..n);
                self.sink = Conn::Stream(s);
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
            self.ob
                .shared
                .count_lost(&Event::new(EventKind::Alloc, oomtrace_proto::Api::Unknown));
        }
        self.out.clear();
        self.out_events = 0;
        self.events_at = None;
        self.events_in_frame = 0;
    }

    fn detach(&mut self, why: &str) {
        self.sink = Conn::Detached;
        // Nothing will be delivered any more: hooks stop waiting for room.
        self.stalled = true;
        self.ob.shared.set_stalled(true);
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
        let Conn::Connecting {
            socket,
            deadline,
            next_try,
        } = &mut self.sink
        else {
            return;
        };
        let now = (self.now)();
        if now < *next_try && !finishing {
            return;
        }
        if socket.is_none() {
            // Our fork parent's collector has gone (below): start our own.
            *socket = Some(
                start_own_collector(&self.setup.config)
                    .map(|p| (p, SocketSource::Spawned))
                    .map_err(NoCollector),
            );
            *deadline = (self.now)() + Duration::from_secs(5);
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
        // Connect and send the stream's first bytes (Hello, counter page) in one window of the
        // descriptor guard: a program closing every descriptor in between would take a
        // connection the collector never heard a word on (no process in its trace, and a
        // detached collector waiting a minute for a first one).
        let window = fd_guard::hold();
        match S::connect(&path) {
            Ok(stream) => {
                self.connected(stream);
                drop(window);
            }
            Err(e) => {
                drop(window);
                if source == SocketSource::Inherited {
                    // Our fork parent's collector has gone: start our own.
                    *socket = None;
                    *next_try = now;
                } else if finishing || now >= *deadline {
                    let why = format!("cannot connect to the collector at {}: {e}", path.display());
                    self.fall_back(&why);
                } else {
                    *next_try = now + Duration::from_millis(20);
                }
            }
        }
    }

    fn connected(&mut self, mut stream: S) {
        let mut head = wire::stream_header().to_vec();
        encode::hello(&mut head, &self.hello);
        // The counter page goes with the first bytes, then its descriptor is closed (the
        // mapping stays); one the program closed and reused is neither sent nor closed. All
        // of it in a window of the descriptor guard, so the program cannot close and reuse the
        // number between the identity check and the send or the close.
        let page = take_page_fd();
        let mut mirror = None;
        let started = fd_guard::transient(|| {
            let page = page.filter(|p| p.still_ours()).or_else(|| {
                // The first page's descriptor is gone (closed with every other): a fresh page
                // carries copies of the counts (`mirror_counts`).
                let (fresh, fd) = CounterPage::create().ok()?;
                mirror = Some(fresh);
                Some(fd)
            });
            let started = stream.start(&head, page.map(|p| p.fd));
            if let Some(p) = page {
                p.close();
            }
            started
        })
        .unwrap_or_else(|| stream.start(&head, None));
        self.mirror = mirror;
        self.mirror_counts();
        if let Err(e) = started {
            self.drop_out();
            self.detach(&format!("{e}"));
            return;
        }
        log::info(&format!("connected to the collector (pid {})", self.ob.pid));
        self.sink = Conn::Stream(stream);
    }

    /// No collector: write the trace file ourselves, in the same format a collector writes.
    fn fall_back(&mut self, why: &str) {
        let wanted = self.setup.config.output_for(self.ob.pid);
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
                self.sink = Conn::File(d);
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

    /// Copies the counts into the second counter page, if there is one.
    fn mirror_counts(&self) {
        if let Some(m) = &self.mirror {
            m.made().store(self.ob.made(), Ordering::Release);
            m.ending().store(self.ob.ending(), Ordering::Release);
        }
    }

    fn finish(&mut self, reason: GoodbyeReason) {
        // Twice: an inherited socket that fails turns into starting our own collector.
        self.progress_connection(true);
        self.progress_connection(true);
        self.push_lost_if_changed();
        self.close_events();
        // What this process made, delivered or not: the reader counts as lost what it did
        // not receive of it, whatever happened on the way.
        encode::made(&mut self.out, self.ob.made(), reason as u8);
        encode::goodbye(&mut self.out, reason, self.seq);
        self.mirror_counts();
        self.write_out();
        // As long as the collector takes bytes, the end of the stream is worth waiting for.
        let mut sent = self.sent_total;
        let mut since = (self.now)();
        while matches!(self.sink, Conn::Stream(_)) && !self.drained() {
            self.write_out();
            if self.sent_total != sent {
                sent = self.sent_total;
                since = (self.now)();
            } else if (self.now)().duration_since(since) >= FINISH_WRITE_WAIT {
                break;
            }
        }
        if matches!(self.sink, Conn::Stream(_)) && !self.drained() {
            // The collector is stopped or far behind: say so. It counts what is missing from
            // the counter page (an older collector cannot).
            log::warn(&format!(
                "the collector did not take the end of this process's stream within {} ms \
                 (it took nothing for that long: stopped or overloaded): its trace ends early, \
                 and the events missing from it are counted there as lost",
                FINISH_WRITE_WAIT.as_millis(),
            ));
            self.sink = Conn::Detached;
            return;
        }
        match std::mem::replace(&mut self.sink, Conn::Detached) {
            Conn::Stream(s) => {
                self.ob.shared.end_delivered.store(true, Ordering::Release);
                // The collector closes its end once this process's data is in the trace
                // file; before that it may send one line this process's user must hear.
                let said = s.close();
                if let Some(line) = said.lines().map(str::trim).find(|l| !l.is_empty()) {
                    // Printed on the user's terminal: no control characters (a path may hold
                    // anything).
                    let line: String = line.chars().filter(|c| !c.is_control()).collect();
                    log::warn(&line);
                }
            }
            Conn::File(mut d) => {
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
                    // Said below, with the count.
                    d.failed(&e, 0, 0);
                    keep_failed_direct(self.ob.pid, d, self.ob.shared.total_lost());
                }
            }
            _ => {}
        }
        let waits = self.ob.shared.waits.load(Ordering::Relaxed);
        if waits > 0 {
            log::info(&format!(
                "hooks found the queue full {waits} times and waited {} ms in all for the \
                 collector",
                self.ob.shared.waited_ns.load(Ordering::Relaxed) / 1_000_000
            ));
        }
        let lost = self.ob.shared.total_lost();
        let made = trace_file::ConnMade {
            conn: 0,
            events: self.ob.made(),
            ending: reason as u8,
        };
        if let Some(line) = finish_failed_direct(self.ob.pid, lost, made) {
            log::warn(&line);
        } else if lost > 0 && DETACH_SAID.taken() && !OUTPUT_REFUSED.load(Ordering::Relaxed) {
            log::warn(&format!("{lost} events were not recorded (see above)"));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The drain loop against an in-memory sink and a fake clock: no collector, no socket,
    //! no sleeping.

    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::sync::OnceLock;

    use oomtrace_proto::Api;

    use super::*;

    static BASE: OnceLock<Instant> = OnceLock::new();
    thread_local! {
        static ELAPSED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    fn fake_now() -> Instant {
        *BASE.get_or_init(Instant::now) + ELAPSED.with(Cell::get)
    }

    fn advance(d: Duration) {
        ELAPSED.with(|e| e.set(e.get() + d));
    }

    /// A reader that takes at most `room` more bytes, and may be "stopped".
    struct MemSink {
        got: Rc<RefCell<Vec<u8>>>,
        room: Rc<Cell<usize>>,
        stopped: bool,
    }

    impl Sink for MemSink {
        fn connect(_: &Path) -> std::io::Result<MemSink> {
            Err(std::io::ErrorKind::NotFound.into())
        }
        fn start(&mut self, head: &[u8], _page: Option<i32>) -> std::io::Result<()> {
            self.got.borrow_mut().extend_from_slice(head);
            Ok(())
        }
        fn send(
            &mut self,
            buf: &[u8],
            _now_only: bool,
            taken: &mut dyn FnMut(usize),
        ) -> std::io::Result<usize> {
            let n = buf.len().min(self.room.get());
            if n > 0 {
                self.room.set(self.room.get() - n);
                self.got.borrow_mut().extend_from_slice(&buf[..n]);
                taken(n);
            }
            Ok(n)
        }
        fn reader_stopped(&mut self, _now: Instant) -> bool {
            self.stopped
        }
        fn close(self) -> String {
            String::new()
        }
    }

    struct Rig {
        d: Drainer<MemSink>,
        rx: Receiver,
        ob: &'static Outbox,
        got: Rc<RefCell<Vec<u8>>>,
        room: Rc<Cell<usize>>,
    }

    /// A drainer connected to a `MemSink` that takes nothing yet, with a 4 KiB cap.
    fn rig(stopped: bool) -> Rig {
        let (ob, rx) = Outbox::create(1 << 16, std::process::id());
        let mut config = Config::from_env();
        config.socket = Some("/nonexistent/oomtrace-test.sock".into());
        let setup = DrainSetup {
            config,
            own_collector: None,
            clock_origin: Calibration::new(),
        };
        let mut d = Drainer::<MemSink>::new(ob, setup, fake_now);
        let got = Rc::new(RefCell::new(Vec::new()));
        let room = Rc::new(Cell::new(0));
        d.sink = Conn::Stream(MemSink {
            got: got.clone(),
            room: room.clone(),
            stopped,
        });
        d.stalled_limit = 4096;
        Rig {
            d,
            rx,
            ob,
            got,
            room,
        }
    }

    impl Rig {
        fn round(&mut self) -> Round {
            self.d.round(&mut self.rx)
        }
    }

    fn alloc(device: i16) -> Event {
        let mut ev = Event::new(EventKind::Alloc, Api::cuMemAlloc_v2);
        ev.device = device;
        ev.size = 4096;
        ev
    }

    fn free(device: i16) -> Event {
        let mut ev = Event::new(EventKind::Free, Api::cuMemFree_v2);
        ev.device = device;
        ev
    }

    fn stalled(ob: &Outbox) -> bool {
        ob.shared.stalled.load(Ordering::SeqCst)
    }

    #[test]
    fn a_stopped_collector_costs_events_only_after_the_stall_time() {
        let mut r = rig(true);
        for _ in 0..1000 {
            r.ob.send_event(alloc(0));
        }
        // At the cap the drain thread holds back: the rest waits in the queue, nothing lost.
        assert_eq!(r.round(), Round::Busy);
        assert!(!r.ob.ring.is_empty());
        advance(STALL_WAIT / 2);
        r.round();
        assert_eq!(r.ob.total_lost(), 0);
        assert!(!stalled(r.ob));
        // Nothing taken for the stall time: stalled; from the next round on, events that do
        // not fit are counted lost (each one), instead of waiting.
        advance(STALL_WAIT);
        r.round();
        assert!(stalled(r.ob));
        assert_eq!(r.ob.total_lost(), 0);
        let queued = r.ob.ring.len() as u64;
        r.round();
        assert!(r.ob.ring.is_empty());
        assert_eq!(r.ob.total_lost(), queued);
        // The collector reads again: the stall ends, hooks wait again.
        r.room.set(usize::MAX);
        r.round();
        assert!(!stalled(r.ob));
        assert!(!r.got.borrow().is_empty());
    }

    #[test]
    fn a_running_collector_that_reads_nothing_is_stalled_only_after_the_hung_time() {
        let mut r = rig(false);
        for _ in 0..200 {
            r.ob.send_event(alloc(1));
        }
        r.round();
        advance(STALL_WAIT * 4);
        r.round();
        assert!(
            !stalled(r.ob),
            "a busy collector is not stalled after STALL_WAIT"
        );
        advance(HUNG_WAIT);
        r.round();
        assert!(stalled(r.ob));
        r.round();
        assert!(r.ob.total_lost() > 0);
    }

    #[test]
    fn losses_are_counted_by_kind_and_device() {
        let mut r = rig(false);
        r.d.sink = Conn::Detached;
        r.ob.send_event(alloc(0));
        r.ob.send_event(free(3));
        r.ob.send_event(free(3));
        r.ob.send_event(alloc(40)); // beyond the per-device slots: "other"
        r.round();
        let lost = r.ob.shared.snapshot();
        assert_eq!(lost.events, 4);
        assert_eq!(lost.frees, 2);
        assert_eq!(lost.stacks, 0);
        assert_eq!(lost.by_device, vec![(0, 1), (3, 2), (-1, 1)]);
        r.ob.count_lost_stack();
        assert_eq!(r.ob.shared.snapshot().stacks, 1);
        assert_eq!(r.ob.total_lost(), 4);
    }

    #[test]
    fn a_flush_is_done_when_the_sink_took_everything_before_it() {
        let mut r = rig(false);
        for _ in 0..10 {
            r.ob.send_event(alloc(0));
        }
        let done = Done::new();
        assert!(r.ob.ring.push(Msg::Flush(done.clone())).is_ok());
        r.round();
        assert!(!done.wait(Duration::ZERO), "nothing was taken yet");
        // The sink takes part of it: still not done.
        r.room.set(100);
        r.round();
        assert!(!done.wait(Duration::ZERO));
        r.room.set(usize::MAX);
        r.round();
        assert!(done.wait(Duration::ZERO));
        assert!(r.got.borrow().len() >= 10 * oomtrace_proto::EVENT_SIZE);
        assert_eq!(r.ob.total_lost(), 0);
    }

    #[test]
    fn a_flush_without_a_stream_is_answered_at_once() {
        let mut r = rig(false);
        r.d.sink = Conn::Detached;
        let done = Done::new();
        assert!(r.ob.ring.push(Msg::Flush(done.clone())).is_ok());
        r.round();
        assert!(done.wait(Duration::ZERO));
    }

    #[test]
    fn shutdown_writes_everything_queued_before_it_then_ends() {
        let mut r = rig(false);
        r.room.set(usize::MAX);
        for _ in 0..5 {
            r.ob.send_event(free(0));
        }
        let done = Done::new();
        assert!(r
            .ob
            .ring
            .push(Msg::Shutdown(GoodbyeReason::Exit, done.clone()))
            .is_ok());
        assert_eq!(r.round(), Round::Finished);
        assert!(done.wait(Duration::ZERO));
        assert!(r.got.borrow().len() >= 5 * oomtrace_proto::EVENT_SIZE);
        assert_eq!(r.ob.total_lost(), 0);
        // Just before the goodbye: what the process made, and that it is exiting.
        let got = r.got.borrow();
        let frames: Vec<_> = wire::frames(&got).collect::<Result<_, _>>().unwrap();
        assert!(
            matches!(
                frames[frames.len() - 2..],
                [
                    wire::Frame::Made {
                        events: 5,
                        ending: 1
                    },
                    wire::Frame::Goodbye { .. }
                ]
            ),
            "{frames:?}"
        );
    }

    #[test]
    fn a_torch_reading_follows_its_marker_on_the_events_clock_and_is_no_event() {
        let mut r = rig(false);
        r.room.set(usize::MAX);
        let mut mark = Event::new(EventKind::Marker, Api::oomtrace_mark);
        mark.ts_ns = crate::clock::ticks();
        r.ob.send_marker(mark, "step");
        let reading = wire::TorchMemory {
            ts_ns: crate::clock::ticks(),
            device: 2,
            allocated: 10 << 20,
            max_allocated: 30 << 20,
            reserved: 64 << 20,
        };
        assert!(r.ob.send_reliable(Msg::TorchMemory(reading)));
        let done = Done::new();
        assert!(r
            .ob
            .ring
            .push(Msg::Shutdown(GoodbyeReason::Exit, done.clone()))
            .is_ok());
        assert_eq!(r.round(), Round::Finished);
        let got = r.got.borrow();
        let frames: Vec<_> = wire::frames(&got).collect::<Result<_, _>>().unwrap();
        let at = frames
            .iter()
            .position(|f| matches!(f, wire::Frame::Marker { .. }))
            .expect("the marker");
        let (wire::Frame::Marker { ts_ns: mark_ts, .. }, wire::Frame::TorchMemory(m)) =
            (&frames[at], &frames[at + 1])
        else {
            panic!("the reading does not follow its marker: {frames:?}");
        };
        assert_eq!(
            (m.device, m.allocated, m.max_allocated, m.reserved),
            (2, 10 << 20, 30 << 20, 64 << 20)
        );
        assert!(m.ts_ns >= *mark_ts, "{} < {mark_ts}", m.ts_ns);
        // Made counts the marker only: a reading is not an event a reader could miss.
        assert!(
            frames
                .iter()
                .any(|f| matches!(f, wire::Frame::Made { events: 1, .. })),
            "{frames:?}"
        );
    }
}
