//! The collector process: accepts traced processes on a Unix socket (many at once, one thread
//! each), applies their frames to per-process state, and writes every frame to the trace file.
//!
//! A connection that sends anything but the oomtrace protocol is dropped without affecting the
//! others. After a process says goodbye its data is flushed to the file before the connection
//! is closed: the shim waits for that close, so "the program exited" implies "its trace is on
//! disk".
//!
//! The top of the crate: owns each process's model and its analysis side by side, feeds
//! both, and hands the live lines (`report::live`) and its warnings to the caller's
//! [`Console`]; it never prints.
//!
//! Whatever its clients do, the collector stops within about 2 s of being asked
//! ([`STOP_WAIT`], [`STOP_CUT`]), and a client's partial frame costs a bounded buffer
//! (`inbox`). With `exit_when_idle`, only traced processes keep it running: a connection
//! counts once its Hello arrived (before that, for [`HELLO_WAIT`] only), and stops counting
//! while it has been silent in the middle of a frame for [`MID_FRAME_WAIT`].

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};
use oomtrace_proto::counter_page::{self, CounterPage};
use oomtrace_proto::trace_file::{self, CloseReason};
use oomtrace_proto::wire::{self, Frame, Next};

use crate::analysis::Analysis;
use crate::console::{Console, Silent};
use crate::inbox::{self, Inbox};
use crate::metrics::{Asked, ProcessSnapshot, Registry, PUBLISH_EVERY};
use crate::model::trace::{Incomplete, Trace};
use crate::model::{EndState, Error, Observer, Process};
use crate::report::live;
use crate::report::symbolize::StackSymbolizer;
use crate::trace_writer::{self, SharedFailure, TraceFile, WriterMsg};

/// After a stop was asked (not for an idle exit), how long connections are read as usual so
/// that processes which are ending can finish their trace.
pub const STOP_WAIT: Duration = Duration::from_millis(1000);

/// After a stop was asked, when every connection is cut, whatever its client still sends:
/// a process that is still running, one that exited, or one whose pid this collector cannot
/// see (another pid namespace). Its trace ends there, marked running when the trace ended.
pub const STOP_CUT: Duration = Duration::from_millis(1500);

/// With `exit_when_idle`: how long a connection that has not sent its Hello yet keeps the
/// collector running (a shim sends the Hello as soon as it connects).
pub const HELLO_WAIT: Duration = Duration::from_secs(5);

/// With `exit_when_idle`: a connection whose frame has not been whole for this long since its
/// first byte stops counting as a traced process (a shim writes whole frames, which a reading
/// collector takes at once: a frame left half-sent, or sent a byte now and then, is a stopped
/// program or a client that is not a shim). It counts again once its frames are whole.
pub const MID_FRAME_WAIT: Duration = Duration::from_secs(10);

/// With `exit_when_idle`: a connection whose peer process (SO_PEERCRED) has exited stops
/// counting once no byte came for this long: the end of its trace, if any, has been read, and
/// whatever keeps the socket open (a child that inherited it without `fork`'s handlers, a
/// process that passed it on) is not a traced process.
pub const PEER_GONE_WAIT: Duration = Duration::from_secs(1);

/// How often a connection asks whether its peer process still runs (a `/proc` read).
const PEER_CHECK_EVERY: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct Options {
    pub socket: PathBuf,
    pub output: PathBuf,
    /// Stop once every traced process has gone (after at least one came): a connection counts
    /// once its Hello arrived ([`HELLO_WAIT`] before that), and not while it is silent in the
    /// middle of a frame ([`MID_FRAME_WAIT`]).
    pub exit_when_idle: bool,
    /// How long to wait for late processes (forked children) before stopping when idle.
    pub idle_grace: Duration,
    /// With `exit_when_idle`: stop if nobody connects at all within this time.
    pub first_client_timeout: Duration,
    /// LZ4-compress chunks in the trace file.
    pub compress: bool,
    /// Never overwrite: if `output` exists, write `name.1.oomt`, `name.2.oomt`, ... instead.
    pub no_clobber: bool,
    /// Say each new finding as it happens (to `console`).
    pub live: bool,
    /// Tell each traced process, before closing its connection, when its events could not
    /// all be written (a full disk), so that its user hears it on the process's own stderr:
    /// a detached collector's stderr goes nowhere. The collector also says it once on its own
    /// stderr, whatever this says.
    pub tell_processes: bool,
    /// Where the live lines and the collector's warnings go ([`Silent`] unless set).
    pub console: Arc<dyn Console>,
    /// Where each connection publishes its process's metrics (`--metrics`), if anywhere.
    pub metrics: Option<Arc<Registry>>,
    /// Where to save the finished trace if its name vanished during the run (its directory
    /// was removed), if anywhere (see `trace_writer`).
    pub save_vanished_in: Option<PathBuf>,
}

impl std::fmt::Debug for dyn Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Console")
    }
}

impl Options {
    pub fn new(socket: PathBuf, output: PathBuf) -> Options {
        Options {
            socket,
            output,
            exit_when_idle: false,
            idle_grace: Duration::from_millis(1000),
            first_client_timeout: Duration::from_secs(60),
            compress: true,
            no_clobber: false,
            live: false,
            tell_processes: false,
            console: Arc::new(Silent),
            metrics: None,
            save_vanished_in: None,
        }
    }
}

/// A bound, not yet serving collector. Binding and serving are separate so that a daemonizing
/// caller can fork in between, while the process still has a single thread.
pub struct Collector {
    listener: UnixListener,
    trace: TraceFile,
    opts: Options,
}

/// What `serve` leaves besides the processes.
pub struct Served {
    pub trace: Trace<Analysis>,
    /// Where the trace was written; None when no process ever connected (no file was left),
    /// or when it vanished and could not be saved (`vanished`).
    pub path: Option<PathBuf>,
    /// The trace's name was gone when it was finished (see `trace_writer`).
    pub vanished: Option<trace_writer::Vanished>,
}

/// Makes room for our socket at `path`: nothing there, or a socket nobody listens on (a
/// collector that died), which is removed. Anything else is refused: a live collector, and
/// any file that is not a socket (never removed: it is not ours).
fn clear_stale_socket(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
        Ok(m) => m,
    };
    let t = meta.file_type();
    if !t.is_socket() {
        return Err(format!(
            "it is {}, not a socket: refusing to replace it",
            oomtrace_proto::host::file_kind::describe(&t)
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err("another collector is already listening there".into()),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            std::fs::remove_file(path).map_err(|e| e.to_string())
        }
        Err(e) => Err(format!(
            "a socket is there and cannot be checked ({e}): left as it is"
        )),
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Collector {
    pub fn bind(opts: Options) -> Result<Collector, Error> {
        let sock_err = |e: std::io::Error| Error::Socket {
            path: opts.socket.clone(),
            source: e.to_string(),
        };
        // The output first: a refused output leaves no socket behind.
        let mut trace = TraceFile::create(
            &opts.output,
            opts.no_clobber,
            concat!("oomtrace-collect ", env!("CARGO_PKG_VERSION")),
        )
        .map_err(|e| Error::Output {
            path: opts.output.clone(),
            source: e.to_string(),
        })?;
        trace.save_vanished_in = opts.save_vanished_in.clone();
        if opts.exit_when_idle {
            // The collector a preloaded shim starts finishes its file a moment after its
            // programs have returned (the idle grace, for late children): `oomtrace report`
            // run meanwhile waits for the finished file on this lock.
            trace.hold_writer_lock();
        }
        clear_stale_socket(&opts.socket).map_err(|source| Error::Socket {
            path: opts.socket.clone(),
            source,
        })?;
        let listener = UnixListener::bind(&opts.socket).map_err(sock_err)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Collector {
            listener,
            trace,
            opts,
        })
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Serves until `stop` is set (or, with `exit_when_idle`, until every process has gone),
    /// then finishes the trace file. Returns what was collected.
    pub fn serve(self, stop: &AtomicBool) -> Result<Trace<Analysis>, Error> {
        self.serve_written(stop).map(|s| s.trace)
    }

    /// [`Collector::serve`], also saying where the trace went (nowhere if nobody connected).
    pub fn serve_written(self, stop: &AtomicBool) -> Result<Served, Error> {
        let Collector {
            listener,
            trace: trace_file,
            opts,
        } = self;
        listener.set_nonblocking(true).map_err(|e| Error::Socket {
            path: opts.socket.clone(),
            source: e.to_string(),
        })?;
        let (wtx, wrx) = bounded::<WriterMsg>(256);
        let compress = opts.compress;
        let failure = SharedFailure::default();
        let writer_failure = failure.clone();
        let writer = std::thread::Builder::new()
            .name("oomtrace-writer".into())
            .spawn(move || trace_writer::write_loop(trace_file, wrx, compress, writer_failure))
            .map_err(|e| Error::Output {
                path: opts.output.clone(),
                source: e.to_string(),
            })?;
        if let Some(r) = &opts.metrics {
            r.set_failure(failure.clone());
        }
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(0),
            ever: AtomicBool::new(false),
            last_close: Mutex::new(Instant::now()),
            finished: Mutex::new(Vec::new()),
            shutting_down: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            inbox_budget: Arc::new(inbox::Budget::new(inbox::LARGE_FRAMES_BUDGET)),
            live: opts.live,
            console: opts.console.clone(),
            failure: failure.clone(),
            tell_processes: opts.tell_processes,
            metrics: opts.metrics.clone(),
        });
        let mut failure_said = false;
        let next_conn = AtomicU32::new(1);
        let started = Instant::now();
        let mut workers = Vec::new();
        // Connections taken after the stop was asked for (bounded: a stop is never held off).
        let mut taken_stopping = 0u32;
        loop {
            // Stopping: the connections already waiting are still taken, then no more. Their
            // processes may have ended, their whole streams waiting in the socket; dropped
            // unaccepted, they would be missing from the trace without a word.
            let stopping = stop.load(Ordering::Relaxed);
            if stopping && taken_stopping >= MAX_TAKEN_STOPPING {
                break;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    taken_stopping += u32::from(stopping);
                    let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                    // Counted from here (its Hello is on its way): the connection's `Holding`
                    // takes it back.
                    shared.active.fetch_add(1, Ordering::AcqRel);
                    let wtx = wtx.clone();
                    let shared2 = shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("oomtrace-conn-{conn}"))
                        .spawn(move || serve_connection(conn, stream, &wtx, &shared2));
                    match spawned {
                        Ok(h) => workers.push(h),
                        Err(_) => {
                            shared.active.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                }
                Err(_) if stopping => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            workers.retain(|h| !h.is_finished());
            if !failure_said {
                if let Some(f) = failure.lock().ok().and_then(|s| s.failure.clone()) {
                    opts.console.warn(&format!("oomtrace: {}", f.line()));
                    failure_said = true;
                }
            }
            if opts.exit_when_idle {
                let active = shared.active.load(Ordering::Acquire);
                let ever = shared.ever.load(Ordering::Acquire);
                let quiet_for = shared
                    .last_close
                    .lock()
                    .map(|t| t.elapsed())
                    .unwrap_or_default();
                if (ever && active == 0 && quiet_for >= opts.idle_grace)
                    || (!ever && started.elapsed() >= opts.first_client_timeout)
                {
                    break;
                }
            }
        }
        let stopping = Instant::now();
        drop(listener);
        let _ = std::fs::remove_file(&opts.socket);
        // Give processes that are still connected a moment to finish (those that are ending
        // say goodbye or close), then stop reading: at once from a process that still runs,
        // and from the others (exited: the end of their trace waits in the socket; or a pid
        // we cannot see) once their socket is empty or at the cut, whatever comes first.
        while shared.active.load(Ordering::Acquire) > 0 && stopping.elapsed() < STOP_WAIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        shared.shutting_down.store(true, Ordering::Release);
        while workers.iter().any(|h| !h.is_finished()) && stopping.elapsed() < STOP_CUT {
            std::thread::sleep(Duration::from_millis(10));
        }
        shared.cut.store(true, Ordering::Release);
        for h in workers {
            let _ = h.join();
        }
        drop(wtx);
        let written = writer.join().map_err(|_| Error::Output {
            path: opts.output.clone(),
            source: "the writer thread failed".into(),
        })?;
        if !failure_said {
            if let Some(f) = &written.failure {
                opts.console.warn(&format!("oomtrace: {}", f.line()));
            }
        }
        if let Some(v) = &written.vanished {
            opts.console.warn(&format!("oomtrace: {}", v.line()));
        }
        let mut trace = Trace::new(trace_file::FileHeader {
            version: trace_file::FILE_VERSION,
            created_unix_ns: now_ns(),
            producer: "oomtrace-collect".into(),
        });
        let mut procs = match Arc::try_unwrap(shared) {
            Ok(s) => s.finished.into_inner().unwrap_or_default(),
            Err(s) => std::mem::take(&mut *s.finished.lock().unwrap_or_else(|p| p.into_inner())),
        };
        procs.sort_by_key(|(p, _)| p.conn);
        let cut: Vec<String> = procs
            .iter()
            .filter(|(p, _)| p.end == EndState::Running)
            .map(|(p, _)| p.pid().to_string())
            .collect();
        if !cut.is_empty() {
            opts.console.warn(&format!(
                "oomtrace: stopped while {} traced process{} still connected (pid {}): {} \
                 ends here, marked running",
                cut.len(),
                if cut.len() == 1 { " was" } else { "es were" },
                cut.join(", "),
                if cut.len() == 1 {
                    "its trace"
                } else {
                    "their traces"
                },
            ));
        }
        for (p, a) in procs {
            trace.push_process(p, a);
        }
        trace.complete = true;
        if let Some(f) = &written.failure {
            let incomplete = Incomplete {
                t_unix_ns: f.t_unix_ns,
                cause: f.cause,
                unwritten_bytes: written.unwritten.bytes,
                unwritten_events: written.unwritten.events,
                message: f.error.clone(),
            };
            trace
                .warnings
                .push(incomplete.sentence(trace.header.created_unix_ns));
            trace.incomplete = Some(incomplete);
        }
        Ok(Served {
            trace,
            path: written.path,
            vanished: written.vanished,
        })
    }
}

/// At most this many connections waiting in the listen backlog are still taken once the
/// collector is asked to stop (the kernel's backlog holds at most `somaxconn` anyway).
const MAX_TAKEN_STOPPING: u32 = 4096;

struct Shared {
    active: AtomicUsize,
    ever: AtomicBool,
    /// When a connection last stopped counting in `active`.
    last_close: Mutex<Instant>,
    /// Each process that has gone, beside its analysis.
    finished: Mutex<Vec<(Process, Analysis)>>,
    /// Stop reading from processes that still run (and from silent connections).
    shutting_down: AtomicBool,
    /// Stop reading, whoever the client is ([`STOP_CUT`]).
    cut: AtomicBool,
    /// The bytes of partial frames over `inbox::FREE_BYTES`, all connections together.
    inbox_budget: Arc<inbox::Budget>,
    live: bool,
    console: Arc<dyn Console>,
    failure: SharedFailure,
    tell_processes: bool,
    metrics: Option<Arc<Registry>>,
}

/// A connection's metrics: its snapshot published at most every [`PUBLISH_EVERY`] while
/// events arrive, never per event.
struct Publisher {
    registry: Arc<Registry>,
    asked: Asked,
    last: Instant,
    /// Events applied since the last publication.
    dirty: bool,
}

impl Publisher {
    fn new(registry: Arc<Registry>) -> Publisher {
        registry.connected.fetch_add(1, Ordering::Relaxed);
        Publisher {
            registry,
            asked: Asked::default(),
            last: Instant::now(),
            dirty: false,
        }
    }

    /// Publishes if something changed and the last publication is old enough.
    fn maybe(&mut self, process: Option<&(Process, Analysis)>) {
        if self.dirty && self.last.elapsed() >= PUBLISH_EVERY {
            if let Some((p, a)) = process {
                let r = &self.registry;
                let mut s = ProcessSnapshot::of(p, a, &r.names, &mut self.asked);
                // Connected: a process that said goodbye ends with its connection.
                s.running = true;
                r.publish(s);
            }
            self.dirty = false;
            self.last = Instant::now();
        }
    }

    /// The final values, once the connection is closed.
    fn end(mut self, process: Option<(&Process, &Analysis)>) {
        if let Some((p, a)) = process {
            let r = &self.registry;
            let mut s = ProcessSnapshot::of(p, a, &r.names, &mut self.asked);
            s.running = false;
            self.registry.publish(s);
        }
        self.registry.connected.fetch_sub(1, Ordering::Relaxed);
    }
}

/// True while `pid` runs (a zombie has exited: its socket holds all it will ever send).
fn still_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x')),
        Err(_) => false,
    }
}

/// The peer's uid, and its pid as this collector sees it (None when it cannot: the peer is
/// in a pid namespace this one does not contain), from SO_PEERCRED. The Hello's pid is the
/// process's own view, which may name another process here, or none.
fn peer_cred(stream: &UnixStream) -> Option<(u32, Option<u32>)> {
    let cred = oomtrace_proto::host::peer::peer_cred(stream.as_raw_fd())?;
    Some((cred.uid, u32::try_from(cred.pid).ok().filter(|&p| p > 0)))
}

/// Whether a connection keeps a collector that exits when idle running, kept in
/// `Shared::active` (counted at accept; given back when it stops counting and at its end).
struct Holding<'a> {
    shared: &'a Shared,
    counted: bool,
}

impl Holding<'_> {
    fn set(&mut self, counts: bool) {
        if counts == self.counted {
            return;
        }
        self.counted = counts;
        if counts {
            self.shared.active.fetch_add(1, Ordering::AcqRel);
        } else {
            if let Ok(mut t) = self.shared.last_close.lock() {
                *t = Instant::now();
            }
            self.shared.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// As a stream ends: what its process made, from its counter page when that says more than
/// the stream did (the stream was cut, or events were made after its `Made` frame), goes
/// into the model and, as a `Made` frame of its own chunk, into the trace; the writer keeps
/// the final count for its `Incomplete` record. Missing events are then counted, whatever
/// became of them.
fn account_made(
    conn: u32,
    p: &mut Process,
    a: &mut Analysis,
    page: Option<&CounterPage>,
    opened: bool,
    wtx: &Sender<WriterMsg>,
) {
    if let Some(page) = page {
        let made = page.made().load(Ordering::Acquire);
        // A value that is no `GoodbyeReason` is "still running".
        let ending = u8::try_from(page.ending().load(Ordering::Acquire)).unwrap_or(0);
        let ending_news = wire::GoodbyeReason::from_u8(ending).is_some() && p.ending.is_none();
        if p.made.is_none_or(|m| made > m) || ending_news {
            a.apply_frame(
                p,
                &Frame::Made {
                    events: made,
                    ending,
                },
            );
            if opened {
                let mut frame = Vec::new();
                wire::encode::made(&mut frame, made, ending);
                let _ = wtx.send(WriterMsg::Chunk(conn, frame, 0));
            }
        }
    }
    if let (Some(events), true) = (p.made, opened) {
        let ending = p.ending.map_or(0, |r| r as u8);
        let _ = wtx.send(WriterMsg::Made(trace_file::ConnMade {
            conn,
            events,
            ending,
        }));
    }
}

/// A connection's socket read with `recvmsg`, which also takes the counter page its shim
/// attaches to the first bytes (any other descriptor is closed at once).
struct PagedReader<'a> {
    fd: std::os::fd::RawFd,
    page: &'a mut Option<CounterPage>,
}

impl std::io::Read for PagedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        counter_page::recv_with_page(self.fd, buf, self.page)
    }
}

fn serve_connection(conn: u32, mut stream: UnixStream, wtx: &Sender<WriterMsg>, shared: &Shared) {
    let accepted = Instant::now();
    let mut holding = Holding {
        shared,
        counted: true,
    };
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    // Only processes of our own user may write into our trace.
    let Some((uid, peer_pid)) = peer_cred(&stream) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if uid != unsafe { libc::geteuid() } {
        return;
    }
    let mut inbox = Inbox::new(shared.inbox_budget.clone());
    let mut last_byte = accepted;
    // Since when a frame has been arriving (bytes of it waiting in the inbox), and whether the
    // peer process still runs, asked every `PEER_CHECK_EVERY` (for `exit_when_idle`).
    let mut partial_since: Option<Instant> = None;
    let mut peer_checked = accepted;
    let mut peer_alive = true;
    let mut header_ok = false;
    let mut process: Option<(Process, Analysis)> = None;
    let mut failure_said = false;
    let mut goodbye = false;
    // The peer closed its end: a stream that ended, not one the collector's stop cut.
    let mut eof = false;
    let mut opened = false;
    let mut printed = 0usize;
    let mut sym: Option<StackSymbolizer> = None;
    let mut stale_said = 0usize;
    let mut metrics = shared.metrics.clone().map(Publisher::new);
    // The process's counter page, if its shim sent one with its first bytes: what it made,
    // readable whatever becomes of the stream.
    let mut page: Option<CounterPage> = None;
    let close = |reason: CloseReason, msg: String| {
        let _ = wtx.send(WriterMsg::Close(conn, reason, msg));
    };
    let outcome: Result<(), String> = loop {
        // A process that keeps sending never times out a read: check here too, or a stopping
        // collector would wait for the program to end. A process that has exited (or one we
        // cannot see) is read until its socket is empty, up to the cut: what waits in the
        // socket is the end of its trace.
        if shared.cut.load(Ordering::Acquire)
            || (shared.shutting_down.load(Ordering::Acquire)
                && process.is_some()
                && peer_pid.is_some_and(still_running))
        {
            break Ok(());
        }
        // A traced process keeps an idle-exiting collector running; a client that never says
        // Hello, takes longer than a shim ever does to finish a frame (a stopped sender, or a
        // byte now and then), or whose process has gone (the socket kept open by another),
        // does not for long.
        if let Some(pid) = peer_pid.filter(|_| process.is_some()) {
            if peer_checked.elapsed() >= PEER_CHECK_EVERY {
                peer_checked = Instant::now();
                peer_alive = still_running(pid);
            }
        }
        holding.set(match process {
            None => accepted.elapsed() < HELLO_WAIT,
            Some(_) => {
                partial_since.is_none_or(|since| since.elapsed() < MID_FRAME_WAIT)
                    && (peer_alive || last_byte.elapsed() < PEER_GONE_WAIT)
            }
        });
        // The counter page comes with the first bytes (SCM_RIGHTS): read with `recvmsg`.
        let mut reader = PagedReader {
            fd: stream.as_raw_fd(),
            page: &mut page,
        };
        match inbox.read_from(&mut reader) {
            Ok(Some(0)) => {
                eof = true;
                break Ok(());
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                // Frames over what a shim sends, with the budget for them spent: read this
                // one more slowly (its sender blocks; nothing is dropped).
                if shared.inbox_budget.first_wait() {
                    shared.console.warn(&format!(
                        "oomtrace: clients hold partial frames over {} (a shim never sends \
                         one): they are read more slowly, {} of them at most in memory",
                        crate::units::fmt_bytes(inbox::FREE_BYTES as u64),
                        crate::units::fmt_bytes(inbox::LARGE_FRAMES_BUDGET as u64),
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if shared.shutting_down.load(Ordering::Acquire) {
                    break Ok(());
                }
                if let Some(m) = metrics.as_mut() {
                    m.maybe(process.as_ref());
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(format!("read failed: {e}")),
        }
        last_byte = Instant::now();
        let buf = inbox.bytes();
        if !header_ok {
            if buf.len() < wire::STREAM_HEADER_SIZE {
                continue;
            }
            if let Err(e) = wire::check_stream_header(buf) {
                break Err(e.to_string());
            }
            inbox.consume(wire::STREAM_HEADER_SIZE);
            header_ok = true;
        }
        let buf = inbox.bytes();
        let mut used = 0;
        let mut events = 0u64;
        // Where the Hello frame ends, in the read that brought it: sent as a chunk of its own,
        // a small record that still fits when the disk is nearly full, so that the process is
        // in the trace even if its first events are not.
        let mut hello_end = None;
        let mut failure = None;
        loop {
            match wire::next_frame(&buf[used..]) {
                Ok(Next::Frame(frame, len)) => {
                    match (&frame, process.as_mut()) {
                        (Frame::Hello(h), None) => {
                            process = Some((Process::new(conn, h.clone()), Analysis::default()));
                            hello_end = Some(used + len);
                            shared.ever.store(true, Ordering::Release);
                            holding.set(true);
                        }
                        (_, None) => {
                            failure = Some("the first frame is not a Hello".to_string());
                            break;
                        }
                        (_, Some((p, a))) => {
                            let before = p.events;
                            a.apply_frame(p, &frame);
                            events += p.events.saturating_sub(before);
                            if a.failed && !failure_said {
                                shared.console.warn(&Analysis::failure_warning(p.pid()));
                                failure_said = true;
                            }
                        }
                    }
                    if matches!(frame, Frame::Goodbye { .. }) {
                        goodbye = true;
                    }
                    used += len;
                }
                Ok(Next::Incomplete) => break,
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(m) = metrics.as_mut() {
            m.registry.events.fetch_add(events, Ordering::Relaxed);
            m.dirty = true;
            m.maybe(process.as_ref());
        }
        if let Some((p, a)) = process.as_ref().filter(|_| shared.live) {
            let alerts = &a.alerts.list;
            if alerts.len() > printed {
                let sym = sym.get_or_insert_with(StackSymbolizer::new);
                for alert in &alerts[printed..] {
                    shared.console.line(&live::line(p, alert, sym));
                }
                printed = alerts.len();
                // A module rebuilt while its process runs: its frames are unnamed, said once.
                for m in &sym.stale_modules()[stale_said..] {
                    shared
                        .console
                        .warn(&format!("oomtrace: warning: {}", m.warning()));
                }
                stale_said = sym.stale_modules().len();
            }
        }
        if used > 0 {
            if !opened {
                let _ = wtx.send(WriterMsg::Open(conn));
                opened = true;
            }
            let mut from = 0;
            if let Some(end) = hello_end.filter(|&end| end < used) {
                let _ = wtx.send(WriterMsg::Chunk(conn, buf[..end].to_vec(), 0));
                from = end;
            }
            let _ = wtx.send(WriterMsg::Chunk(conn, buf[from..used].to_vec(), events));
            inbox.consume(used);
        }
        // The age of the frame in progress counts from its first byte, not its last.
        partial_since = match (inbox.is_empty(), partial_since) {
            (true, _) => None,
            (false, None) => Some(Instant::now()),
            (false, since) => since,
        };
        if let Some(f) = failure {
            break Err(f);
        }
        if goodbye {
            break Ok(());
        }
    };
    // A stream that ended while its process runs on (the program closed or replaced the
    // shim's socket; the shim gave up on a stalled collector): what the process still makes is
    // only in its counter page. Its final count is read once the process has ended, so that
    // `lost_events` is everything it made and we never saw; a stopping collector waits no more.
    if let (true, false, Ok(()), Some(_), Some(pid)) =
        (eof, goodbye, &outcome, page.as_ref(), peer_pid)
    {
        while still_running(pid)
            && !shared.shutting_down.load(Ordering::Acquire)
            && !shared.cut.load(Ordering::Acquire)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if let Some((p, a)) = process.as_mut() {
        account_made(conn, p, a, page.as_ref(), opened, wtx);
    }
    let reason = match (&outcome, goodbye) {
        (Err(_), _) => CloseReason::ProtocolError,
        (Ok(()), true) => CloseReason::Clean,
        (Ok(()), false) if !eof && shared.shutting_down.load(Ordering::Acquire) => {
            CloseReason::CollectorShutdown
        }
        (Ok(()), false) => CloseReason::Abrupt,
    };
    if opened {
        close(reason, outcome.err().unwrap_or_default());
        // Acknowledge the goodbye only once the data is on its way to disk.
        let (ack_tx, ack_rx) = bounded(1);
        if wtx.send(WriterMsg::Sync(ack_tx)).is_ok() {
            let _ = ack_rx.recv_timeout(Duration::from_secs(5));
        }
    }
    if shared.tell_processes && opened {
        // The shim reads one line after its goodbye: what its user must hear about its trace.
        // (After the Sync above, what this connection lost is counted.)
        // A process whose records were all written before the failure hears nothing.
        // One number: every event of this process that is not in the file, those the
        // writer could not write and those that never reached it (counted in the model).
        let missing = process.as_ref().map_or(0, |(p, _)| p.lost_events());
        let told = shared.failure.lock().ok().and_then(|s| {
            let mut lost = s.unwritten.get(&conn).copied()?;
            lost.events += missing;
            s.failure.as_ref().map(|f| f.line_for(lost))
        });
        if let Some(line) = told {
            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = stream.write_all(format!("{line}\n").as_bytes());
        }
    }
    // Closed as soon as this process's records are written (the Sync above): the shim waits
    // for this close at exit, and a process must not wait for others (its parent, its
    // children) nor for the idle grace. The trace file itself is finished when the collector
    // stops; a reader meanwhile waits on the writer's lock (`TraceFile::hold_writer_lock`).
    let _ = stream.shutdown(std::net::Shutdown::Both);
    if let Some((mut p, a)) = process {
        p.end = match reason {
            CloseReason::Clean => p.end,
            CloseReason::ProtocolError => EndState::ProtocolError,
            CloseReason::Abrupt => p.end_without_goodbye(),
            CloseReason::CollectorShutdown => EndState::Running,
        };
        if let Some(m) = metrics.take() {
            m.end(Some((&p, &a)));
        }
        if let Ok(mut f) = shared.finished.lock() {
            f.push((p, a));
        }
    }
    if let Some(m) = metrics {
        m.end(None);
    }
}
