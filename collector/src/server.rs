//! The collector process: accepts traced processes on a Unix socket (many at once, one thread
//! each), applies their frames to per-process state, and writes every frame to the trace file.
//!
//! A connection that sends anything but the oomtrace protocol is dropped without affecting the
//! others. After a process says goodbye its data is flushed to the file before the connection
//! is closed: the shim waits for that close, so "the program exited" implies "its trace is on
//! disk".

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use oomtrace_proto::trace_file::{self, CloseReason};
use oomtrace_proto::wire::{self, Frame, Next};

use crate::state::Process;
use crate::trace::Trace;
use crate::Error;

#[derive(Clone, Debug)]
pub struct Options {
    pub socket: PathBuf,
    pub output: PathBuf,
    /// Stop once every traced process has gone (after at least one came).
    pub exit_when_idle: bool,
    /// How long to wait for late processes (forked children) before stopping when idle.
    pub idle_grace: Duration,
    /// With `exit_when_idle`: stop if nobody connects at all within this time.
    pub first_client_timeout: Duration,
    /// LZ4-compress chunks in the trace file.
    pub compress: bool,
    /// Never overwrite: if `output` exists, write `name.1.oomt`, `name.2.oomt`, ... instead.
    pub no_clobber: bool,
    /// Print each new finding on stderr as it happens.
    pub live: bool,
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
        }
    }
}

/// A bound, not yet serving collector. Binding and serving are separate so that a daemonizing
/// caller can fork in between, while the process still has a single thread.
pub struct Collector {
    listener: UnixListener,
    file: File,
    opts: Options,
}

enum WriterMsg {
    Open(u32),
    Chunk(u32, Vec<u8>),
    Close(u32, CloseReason, String),
    /// Flush to the OS, then acknowledge.
    Sync(Sender<()>),
}

/// Creates `path` for writing with mode 0600.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
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
        if opts.socket.exists() {
            // A live collector answers; a stale socket file from a dead one is replaced.
            if UnixStream::connect(&opts.socket).is_ok() {
                return Err(Error::Socket {
                    path: opts.socket.clone(),
                    source: "another collector is already listening there".into(),
                });
            }
            std::fs::remove_file(&opts.socket).map_err(sock_err)?;
        }
        let listener = UnixListener::bind(&opts.socket).map_err(sock_err)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(0o600));
        }
        let mut opts = opts;
        let mut file = if opts.no_clobber {
            trace_file::create_new(&opts.output).map(|(f, p)| {
                opts.output = p;
                f
            })
        } else {
            create_private(&opts.output)
        }
        .map_err(|e| Error::Output {
            path: opts.output.clone(),
            source: e.to_string(),
        })?;
        trace_file::write_header(
            &mut file,
            now_ns(),
            concat!("oomtrace-collect ", env!("CARGO_PKG_VERSION")),
        )
        .map_err(|e| Error::Output {
            path: opts.output.clone(),
            source: e.to_string(),
        })?;
        Ok(Collector {
            listener,
            file,
            opts,
        })
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Serves until `stop` is set (or, with `exit_when_idle`, until every process has gone),
    /// then finishes the trace file. Returns what was collected.
    pub fn serve(self, stop: &AtomicBool) -> Result<Trace, Error> {
        let Collector {
            listener,
            file,
            opts,
        } = self;
        listener.set_nonblocking(true).map_err(|e| Error::Socket {
            path: opts.socket.clone(),
            source: e.to_string(),
        })?;
        let (wtx, wrx) = bounded::<WriterMsg>(256);
        let compress = opts.compress;
        let writer = std::thread::Builder::new()
            .name("oomtrace-writer".into())
            .spawn(move || write_loop(BufWriter::with_capacity(1 << 20, file), wrx, compress))
            .map_err(|e| Error::Output {
                path: opts.output.clone(),
                source: e.to_string(),
            })?;
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(0),
            ever: AtomicBool::new(false),
            last_close: Mutex::new(Instant::now()),
            finished: Mutex::new(Vec::new()),
            shutting_down: AtomicBool::new(false),
            live: opts.live,
        });
        let next_conn = AtomicU32::new(1);
        let started = Instant::now();
        let mut workers = Vec::new();
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                    shared.active.fetch_add(1, Ordering::AcqRel);
                    shared.ever.store(true, Ordering::Release);
                    let wtx = wtx.clone();
                    let shared2 = shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("oomtrace-conn-{conn}"))
                        .spawn(move || {
                            serve_connection(conn, stream, &wtx, &shared2);
                            if let Ok(mut t) = shared2.last_close.lock() {
                                *t = Instant::now();
                            }
                            shared2.active.fetch_sub(1, Ordering::AcqRel);
                        });
                    match spawned {
                        Ok(h) => workers.push(h),
                        Err(_) => {
                            shared.active.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            workers.retain(|h| !h.is_finished());
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
        drop(listener);
        let _ = std::fs::remove_file(&opts.socket);
        // Give processes that are still connected a moment to finish, then stop reading.
        let deadline = Instant::now() + Duration::from_secs(2);
        while shared.active.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        shared.shutting_down.store(true, Ordering::Release);
        for h in workers {
            let _ = h.join();
        }
        drop(wtx);
        let write_result = writer
            .join()
            .unwrap_or_else(|_| Err("writer thread panicked".into()));
        write_result.map_err(|e| Error::Output {
            path: opts.output.clone(),
            source: e,
        })?;
        let mut trace = Trace::new(trace_file::FileHeader {
            version: trace_file::FILE_VERSION,
            created_unix_ns: now_ns(),
            producer: "oomtrace-collect".into(),
        });
        let mut procs = match Arc::try_unwrap(shared) {
            Ok(s) => s.finished.into_inner().unwrap_or_default(),
            Err(s) => std::mem::take(&mut *s.finished.lock().unwrap_or_else(|p| p.into_inner())),
        };
        procs.sort_by_key(|p| p.conn);
        for p in procs {
            trace.push_process(p);
        }
        trace.complete = true;
        Ok(trace)
    }
}

struct Shared {
    active: AtomicUsize,
    ever: AtomicBool,
    last_close: Mutex<Instant>,
    finished: Mutex<Vec<Process>>,
    shutting_down: AtomicBool,
    live: bool,
}

fn write_loop(
    mut out: BufWriter<File>,
    rx: Receiver<WriterMsg>,
    compress: bool,
) -> Result<(), String> {
    let mut conns = 0u32;
    let mut dirty = false;
    let mut last_flush = Instant::now();
    loop {
        let msg = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => Some(m),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        };
        dirty |= msg.is_some();
        let r = match msg {
            Some(WriterMsg::Open(conn)) => {
                conns += 1;
                trace_file::write_conn_open(&mut out, conn, now_ns(), wire::WIRE_VERSION)
            }
            Some(WriterMsg::Chunk(conn, bytes)) => {
                trace_file::write_chunk(&mut out, conn, &bytes, compress)
            }
            Some(WriterMsg::Close(conn, reason, msg)) => {
                trace_file::write_conn_close(&mut out, conn, now_ns(), reason, &msg)
            }
            Some(WriterMsg::Sync(ack)) => {
                let r = out.flush();
                let _ = ack.send(());
                r
            }
            None => Ok(()),
        };
        r.map_err(|e| e.to_string())?;
        // Readable while being written: at most ~100 ms of data sits in the buffer.
        if dirty && last_flush.elapsed() >= Duration::from_millis(100) {
            out.flush().map_err(|e| e.to_string())?;
            dirty = false;
            last_flush = Instant::now();
        }
    }
    trace_file::write_end(&mut out, now_ns(), conns).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())
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

/// The peer's uid, from SO_PEERCRED.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid fd and out-parameters of the right size.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

fn serve_connection(conn: u32, mut stream: UnixStream, wtx: &Sender<WriterMsg>, shared: &Shared) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    // Only processes of our own user may write into our trace.
    // SAFETY: geteuid has no preconditions.
    if peer_uid(&stream) != Some(unsafe { libc::geteuid() }) {
        return;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut header_ok = false;
    let mut process: Option<Process> = None;
    let mut goodbye = false;
    let mut opened = false;
    let mut chunk = vec![0u8; 256 << 10];
    let mut printed = 0usize;
    let mut sym: Option<crate::symbolize::StackSymbolizer> = None;
    let close = |reason: CloseReason, msg: String| {
        let _ = wtx.send(WriterMsg::Close(conn, reason, msg));
    };
    let outcome: Result<(), String> = loop {
        // A process that keeps sending never times out a read: check here too, or a stopping
        // collector would wait for the program to end. A process that has exited is read to
        // its end instead: what waits in the socket is the end of its trace.
        if shared.shutting_down.load(Ordering::Acquire)
            && process.as_ref().is_some_and(|p| still_running(p.pid()))
        {
            break Ok(());
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if shared.shutting_down.load(Ordering::Acquire) {
                    break Ok(());
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(format!("read failed: {e}")),
        };
        buf.extend_from_slice(&chunk[..n]);
        if !header_ok {
            if buf.len() < wire::STREAM_HEADER_SIZE {
                continue;
            }
            if let Err(e) = wire::check_stream_header(&buf) {
                break Err(e.to_string());
            }
            buf.drain(..wire::STREAM_HEADER_SIZE);
            header_ok = true;
        }
        let mut used = 0;
        let mut failure = None;
        loop {
            match wire::next_frame(&buf[used..]) {
                Ok(Next::Frame(frame, len)) => {
                    match (&frame, process.as_mut()) {
                        (Frame::Hello(h), None) => process = Some(Process::new(conn, h.clone())),
                        (_, None) => {
                            failure = Some("the first frame is not a Hello".to_string());
                            break;
                        }
                        (_, Some(p)) => p.apply_guarded(&frame),
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
        if let Some(p) = process.as_ref().filter(|_| shared.live) {
            let alerts = &p.detect.alerts.list;
            if alerts.len() > printed {
                let sym = sym.get_or_insert_with(crate::symbolize::StackSymbolizer::new);
                let mut err = std::io::stderr().lock();
                for a in &alerts[printed..] {
                    let _ = writeln!(err, "{}", crate::live::line(p, a, sym));
                }
                printed = alerts.len();
            }
        }
        if used > 0 {
            if !opened {
                let _ = wtx.send(WriterMsg::Open(conn));
                opened = true;
            }
            let _ = wtx.send(WriterMsg::Chunk(conn, buf[..used].to_vec()));
            buf.drain(..used);
        }
        if let Some(f) = failure {
            break Err(f);
        }
        if goodbye {
            break Ok(());
        }
    };
    let reason = match (&outcome, goodbye) {
        (Err(_), _) => CloseReason::ProtocolError,
        (Ok(()), true) => CloseReason::Clean,
        (Ok(()), false) if shared.shutting_down.load(Ordering::Acquire) => {
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
    let _ = stream.shutdown(std::net::Shutdown::Both);
    if let Some(mut p) = process {
        p.end = match reason {
            CloseReason::Clean => p.end,
            CloseReason::ProtocolError => crate::state::EndState::ProtocolError,
            CloseReason::Abrupt => crate::state::EndState::Abrupt,
            CloseReason::CollectorShutdown => crate::state::EndState::Running,
        };
        if let Ok(mut f) = shared.finished.lock() {
            f.push(p);
        }
    }
}
