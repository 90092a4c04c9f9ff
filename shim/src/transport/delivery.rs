//! Delivery: where the encoded stream goes (the connection's state machine: connecting, a
//! connected socket, the shim's own trace file, nowhere) and the stall policy (when the
//! collector is stalled, when the drain thread holds back, when events are counted lost; see
//! the transport module doc).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use oomtrace_proto::counter_page::CounterPage;
use oomtrace_proto::trace_file;
use oomtrace_proto::wire::{self, encode, Hello};
use oomtrace_proto::{Event, EventKind};

use super::fd_guard;
use super::file::{finish_failed_direct, keep_failed_direct, not_a_regular_file, DirectFile};
use super::frame::Frames;
use super::outbox::{take_page_fd, Outbox};
use super::sink::Sink;
use super::spawn::{inherited_socket, start_own_collector};
use crate::clock;
use crate::config::Config;
use crate::log;
use crate::once::OneShot;

/// The stall limit for a collector whose process is stopped (SIGSTOP, a debugger; state `T`
/// or `t` in /proc): data waited this long without the socket taking a byte, and hooks stop
/// waiting for room (see the module doc).
pub(super) const STALL_WAIT: Duration = Duration::from_millis(250);
/// The stall limit for a collector that runs but takes nothing (hung, or its process cannot
/// be seen): a running collector can be busy for over a second without reading (the first
/// symbolization of a large library, a debug build), which must not cost events.
pub(super) const HUNG_WAIT: Duration = Duration::from_secs(10);

/// Where the collector socket came from, which decides how long to keep trying it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum SocketSource {
    /// `OOMTRACE_SOCKET`: `oomtrace run` or a standalone collector; tried for 1 s.
    Configured,
    /// The collector our fork parent started: tried once, then we start our own.
    Inherited,
    /// A collector we started (it was listening before the spawn returned); tried for 5 s.
    Spawned,
}

/// Why there is no collector to connect to: fall back to writing the file at once.
pub(super) struct NoCollector(String);

/// Where the stream goes: connecting, a connected sink, the direct file, or nowhere.
pub(super) enum Conn<S> {
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
pub(super) const WRITE_CHUNK: usize = 1 << 20;
/// Bytes kept waiting for the socket (at least; twice the event queue's size if that is more:
/// a user who asked for a large buffer asked for that much slack). At this cap the drain
/// thread stops taking from the queue while the collector reads (hooks wait), and counts new
/// events lost only once the collector is stalled (`STALL_WAIT`).
const STALLED_LIMIT: usize = 16 << 20;
/// At exit, how long the end of the stream may go without the socket taking a byte.
const FINISH_WRITE_WAIT: Duration = Duration::from_millis(2000);

/// The connection and its stall state.
pub(super) struct Delivery<S: Sink> {
    ob: &'static Outbox,
    config: Config,
    /// The stream's first frame, sent at connect (or written first to the direct file).
    hello: Hello,
    /// The time source (`Instant::now`; a fake clock in tests).
    now: fn() -> Instant,
    pub(super) sink: Conn<S>,
    /// Bytes already committed to the socket stream but not yet taken by the collector: a
    /// frame partly sent must be completed before anything else, so these are never dropped
    /// while connected.
    unsent: Vec<u8>,
    /// `STALLED_LIMIT`, or twice the event queue if that is more.
    pub(super) stalled_limit: usize,
    /// The collector took nothing for `STALL_WAIT` while data waited (mirrored in
    /// `Shared::stalled`).
    stalled: bool,
    /// When the socket last took a byte, or nothing was waiting.
    last_taken: Instant,
    /// Bytes of the stream written so far (socket or file).
    sent_total: u64,
    /// A second counter page, made at connect when the first one's descriptor was gone (the
    /// program closed every descriptor before the shim first reached its collector): the
    /// drain thread copies the counts into it every round and at the end.
    mirror: Option<CounterPage>,
}

/// Which buffer `Delivery::send_counted` sends.
#[derive(Clone, Copy)]
enum Which {
    Unsent,
    Out,
}

static DETACH_SAID: OneShot = OneShot::new();
static FALLBACK_SAID: OneShot = OneShot::new();
/// The output was refused: the process runs untraced by design, not for a lost collector.
static OUTPUT_REFUSED: AtomicBool = AtomicBool::new(false);

/// The collector socket to try: configured, the one started at init, or our fork parent's;
/// `None`: start one first.
pub(super) fn socket_to_try(
    config: &Config,
    own_collector: &Option<Result<PathBuf, String>>,
) -> Option<Result<(PathBuf, SocketSource), NoCollector>> {
    match (&config.socket, own_collector, inherited_socket()) {
        (Some(p), _, _) => Some(Ok((PathBuf::from(p), SocketSource::Configured))),
        (None, Some(Ok(p)), _) => Some(Ok((p.clone(), SocketSource::Spawned))),
        (None, Some(Err(e)), _) => Some(Err(NoCollector(e.clone()))),
        (None, None, Some(p)) => Some(Ok((p.clone(), SocketSource::Inherited))),
        (None, None, None) => None,
    }
}

impl<S: Sink> Delivery<S> {
    pub(super) fn new(
        ob: &'static Outbox,
        config: Config,
        hello: Hello,
        socket: Option<Result<(PathBuf, SocketSource), NoCollector>>,
        now: Instant,
        now_fn: fn() -> Instant,
    ) -> Delivery<S> {
        Delivery {
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
            unsent: Vec::new(),
            stalled_limit: STALLED_LIMIT.max(config.buffer * oomtrace_proto::EVENT_SIZE * 2),
            stalled: false,
            last_taken: now,
            sent_total: 0,
            config,
            hello,
            mirror: None,
        }
    }

    /// Connected to a collector's socket.
    pub(super) fn is_stream(&self) -> bool {
        matches!(self.sink, Conn::Stream(_))
    }

    /// Bytes of the stream written so far (socket or file).
    pub(super) fn sent_total(&self) -> u64 {
        self.sent_total
    }

    /// Connected, `STALLED_LIMIT` waiting, and the collector still reading: take nothing more
    /// from the queue until the socket has taken some.
    pub(super) fn holding_back(&self, frames: &Frames) -> bool {
        matches!(self.sink, Conn::Stream(_))
            && !self.stalled
            && self.unsent.len() + frames.out.len() >= self.stalled_limit
    }

    /// The stream position just past everything encoded so far (closes the open frame).
    pub(super) fn stream_end(&self, frames: &mut Frames) -> u64 {
        frames.close_events();
        self.sent_total + (self.unsent.len() + frames.out.len()) as u64
    }

    /// Decides whether the collector is stalled: data waiting and no byte taken for
    /// `STALL_WAIT` while its process is stopped, or for `HUNG_WAIT` whatever it does (or no
    /// collector at all), and tells the hooks when that changes.
    pub(super) fn update_stall(&mut self, frames: &Frames) {
        let now = (self.now)();
        let stalled = match &mut self.sink {
            Conn::Detached => true,
            Conn::Stream(s) => {
                if frames.out.is_empty() && self.unsent.is_empty() {
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

    /// Detached, or a stalled collector (nothing taken for `STALL_WAIT`) with
    /// `STALLED_LIMIT` waiting: events are counted lost, each with its kind and device (a lost
    /// free is a lost free, not a phantom leak); stack and module definitions still go out
    /// while stalled, so later events stay readable. A collector that still reads never gets
    /// here over the cap: the drain loop stops taking from the queue instead. Returns (events
    /// are dropped, definitions are dropped).
    #[inline]
    pub(super) fn dropping(&self, frames: &Frames) -> (bool, bool) {
        match self.sink {
            Conn::Detached => (true, true),
            Conn::Stream(_) => {
                let over =
                    self.stalled && self.unsent.len() + frames.out.len() > self.stalled_limit;
                (over, false)
            }
            _ => (false, false),
        }
    }

    /// `out` reached `WRITE_CHUNK` in a round: written, or when the socket was full what it
    /// has room for now of the committed bytes (a write that waits would wait once per chunk;
    /// the rest gathers in `out`).
    pub(super) fn write_chunk(&mut self, frames: &mut Frames) {
        if self.unsent.is_empty() {
            self.write_out(frames);
        } else {
            self.write_unsent_now(frames);
        }
    }

    /// Writes `out` to the sink (or keeps it while connecting).
    pub(super) fn write_out(&mut self, frames: &mut Frames) {
        frames.close_events();
        if self.drained(frames) {
            return;
        }
        if matches!(self.sink, Conn::Stream(_)) {
            return self.write_socket(frames);
        }
        if frames.out.is_empty() {
            return;
        }
        let result = match &mut self.sink {
            Conn::Connecting { .. } => {
                if frames.out.len() > PENDING_LIMIT {
                    self.drop_out(frames);
                }
                return;
            }
            Conn::Detached => {
                self.drop_out(frames);
                return;
            }
            Conn::Stream(_) => return,
            Conn::File(d) => {
                let mut record = Vec::with_capacity(frames.out.len() + 32);
                let _ = trace_file::write_chunk(&mut record, 0, &frames.out, false);
                d.write_record(&record)
            }
        };
        match result {
            Ok(()) => {
                self.sent_total += frames.out.len() as u64;
                frames.written();
                self.ob.shared.progressed();
            }
            Err(e) => {
                let lost_bytes = frames.out.len() as u64;
                let lost_events = frames.out_events;
                self.drop_out(frames);
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

    fn write_socket(&mut self, frames: &mut Frames) {
        let Conn::Stream(mut s) = std::mem::replace(&mut self.sink, Conn::Detached) else {
            return;
        };
        match self.send_to_socket(&mut s, frames) {
            Ok(()) => self.sink = Conn::Stream(s),
            Err(e) => {
                self.unsent.clear();
                self.drop_out(frames);
                self.detach(&format!("{e}"));
            }
        }
    }

    /// Sends what the socket takes, each write waiting at most `SOCKET_WRITE_WAIT` for room:
    /// first the committed bytes, then `out`. Frames the socket does not take wait here up to
    /// `STALLED_LIMIT` (then the drain loop holds back, or once stalled events are counted
    /// lost).
    fn send_to_socket(&mut self, s: &mut S, frames: &mut Frames) -> std::io::Result<()> {
        if !self.unsent.is_empty() {
            let n = self.send_counted(s, Which::Unsent, false, frames)?;
            self.unsent.drain(..n);
        }
        if self.unsent.is_empty() {
            let n = self.send_counted(s, Which::Out, false, frames)?;
            if n < frames.out.len() {
                self.unsent.extend_from_slice(&frames.out[n..]);
            }
            frames.written();
        }
        Ok(())
    }

    /// `send_some` of `unsent` or `out`, counting the bytes taken as progress.
    fn send_counted(
        &mut self,
        s: &mut S,
        which: Which,
        now_only: bool,
        frames: &Frames,
    ) -> std::io::Result<usize> {
        let buf = match which {
            Which::Unsent => &self.unsent,
            Which::Out => &frames.out,
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
    fn write_unsent_now(&mut self, frames: &mut Frames) {
        let Conn::Stream(mut s) = std::mem::replace(&mut self.sink, Conn::Detached) else {
            return;
        };
        match self.send_counted(&mut s, Which::Unsent, true, frames) {
            Ok(n) => {
                self.unsent.drain(..n);
                self.sink = Conn::Stream(s);
            }
            Err(e) => {
                self.unsent.clear();
                self.drop_out(frames);
                self.detach(&format!("{e}"));
            }
        }
    }

    /// Nothing is left to send.
    pub(super) fn drained(&self, frames: &Frames) -> bool {
        frames.out.is_empty() && self.unsent.is_empty()
    }

    fn drop_out(&mut self, frames: &mut Frames) {
        for _ in 0..frames.out_events {
            self.ob
                .shared
                .count_lost(&Event::new(EventKind::Alloc, oomtrace_proto::Api::Unknown));
        }
        frames.clear();
    }

    fn detach(&mut self, why: &str) {
        self.sink = Conn::Detached;
        // No collector will read the counter page: its descriptor goes back to the program.
        release_page_fd();
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
    pub(super) fn progress_connection(&mut self, finishing: bool, frames: &mut Frames) {
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
                start_own_collector(&self.config)
                    .map(|p| (p, SocketSource::Spawned))
                    .map_err(NoCollector),
            );
            *deadline = (self.now)() + Duration::from_secs(5);
        }
        let (path, source) = match socket {
            Some(Ok((path, source))) => (path.clone(), *source),
            Some(Err(NoCollector(e))) => {
                let why = format!("could not start a collector: {e}");
                self.fall_back(&why, frames);
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
                self.connected(stream, frames);
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
                    self.fall_back(&why, frames);
                } else {
                    *next_try = now + Duration::from_millis(20);
                }
            }
        }
    }

    fn connected(&mut self, mut stream: S, frames: &mut Frames) {
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
            self.drop_out(frames);
            self.detach(&format!("{e}"));
            return;
        }
        log::info(&format!("connected to the collector (pid {})", self.ob.pid));
        self.sink = Conn::Stream(stream);
    }

    /// No collector: write the trace file ourselves, in the same format a collector writes.
    fn fall_back(&mut self, why: &str, frames: &mut Frames) {
        let wanted = self.config.output_for(self.ob.pid);
        if let Some(what) = not_a_regular_file(Path::new(&wanted)) {
            // /dev/full, a FIFO, a link: never written beside (`/dev/full.1`) or through. The
            // collector refused it for the same reason (that is `why`): one line says it all.
            self.drop_out(frames);
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
                // The file carries the count in its `Made` record: no reader of the page.
                release_page_fd();
                log::warn_once(
                    &FALLBACK_SAID,
                    &format!("{why}; writing the trace directly to {}", d.path),
                );
                self.sink = Conn::File(d);
            }
            Err((path, e)) => {
                // Named as the file it was (the numbered name when one was used); nothing
                // is left there.
                self.drop_out(frames);
                self.detach(&format!(
                    "{why}; and cannot write the trace {path}: {} ({})",
                    trace_file::WriteFailure::of(&e).words(),
                    trace_file::WriteFailure::message(&e)
                ));
            }
        }
    }

    /// Copies the counts into the second counter page, if there is one.
    pub(super) fn mirror_counts(&self) {
        if let Some(m) = &self.mirror {
            m.made().store(self.ob.made(), Ordering::Release);
            m.ending().store(self.ob.ending(), Ordering::Release);
        }
    }

    /// Delivers the end of the stream (already encoded in `frames`) and closes the sink: the
    /// socket, once the collector took everything (as long as it takes bytes), or the direct
    /// file, with its closing records. False when the collector did not take the end in time
    /// (said here; nothing more is worth saying).
    pub(super) fn finish_stream(&mut self, frames: &mut Frames) -> bool {
        self.mirror_counts();
        self.write_out(frames);
        // As long as the collector takes bytes, the end of the stream is worth waiting for.
        let mut sent = self.sent_total;
        let mut since = (self.now)();
        while matches!(self.sink, Conn::Stream(_)) && !self.drained(frames) {
            self.write_out(frames);
            if self.sent_total != sent {
                sent = self.sent_total;
                since = (self.now)();
            } else if (self.now)().duration_since(since) >= FINISH_WRITE_WAIT {
                break;
            }
        }
        if matches!(self.sink, Conn::Stream(_)) && !self.drained(frames) {
            // The collector is stopped or far behind: say so. It counts what is missing from
            // the counter page (an older collector cannot).
            log::warn(&format!(
                "the collector did not take the end of this process's stream within {} ms \
                 (it took nothing for that long: stopped or overloaded): its trace ends early, \
                 and the events missing from it are counted there as lost",
                FINISH_WRITE_WAIT.as_millis(),
            ));
            self.sink = Conn::Detached;
            return false;
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
        true
    }

    /// The one line at exit when events were lost: the direct file's failure with its count,
    /// or the count after the line that said the collector was lost.
    pub(super) fn say_lost(&self, lost: u64, made: trace_file::ConnMade) {
        if let Some(line) = finish_failed_direct(self.ob.pid, lost, made) {
            log::warn(&line);
        } else if lost > 0 && DETACH_SAID.taken() && !OUTPUT_REFUSED.load(Ordering::Relaxed) {
            log::warn(&format!("{lost} events were not recorded (see above)"));
        }
    }
}

/// Closes the counter page's descriptor if it was not handed over yet (and is still ours):
/// once nobody will read the page, the process should have its descriptor back. In a window
/// of the descriptor guard, so the number cannot be closed and reused between the identity
/// check and the close.
fn release_page_fd() {
    if let Some(page) = take_page_fd() {
        let _ = fd_guard::transient(|| page.close());
    }
}
