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

mod connection;

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
        let header = trace_file.header.clone();
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
                        .spawn(move || connection::serve(conn, stream, &wtx, &shared2));
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
        // The file's own header: what the collector saw reads as the file does.
        let mut trace = Trace::new(header);
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
