//! One traced process's connection, as an object: accepted (the peer checked), read
//! (bytes into the inbox, whole frames applied to the process's model and analysis), its side
//! outputs (the live lines, the metrics, the frames to the writer) and its finish (what the
//! process made, how the stream closed, the line the process is told, the process handed
//! over to the collector). `serve` runs one on the connection's thread; docs/ARCHITECTURE.md
//! walks a `cudaMalloc` through it.

use super::*;

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

/// Serves one connection to its end on the calling thread.
pub(super) fn serve(conn: u32, stream: UnixStream, wtx: &Sender<WriterMsg>, shared: &Shared) {
    let accepted = Instant::now();
    let holding = Holding {
        shared,
        counted: true,
    };
    let Some(mut c) = Connection::accept(conn, stream, wtx, shared, holding, accepted) else {
        return;
    };
    let outcome = c.read_to_end();
    c.finish(outcome);
}

/// What one connection reads into, and what it has made of it so far.
struct Connection<'a> {
    conn: u32,
    stream: UnixStream,
    wtx: &'a Sender<WriterMsg>,
    shared: &'a Shared,
    holding: Holding<'a>,
    /// The peer process as this collector sees it (SO_PEERCRED), when it can.
    peer_pid: Option<u32>,
    accepted: Instant,
    inbox: Inbox,
    last_byte: Instant,
    /// Since when a frame has been arriving (bytes of it waiting in the inbox), and whether
    /// the peer process still runs, asked every `PEER_CHECK_EVERY` (for `exit_when_idle`).
    partial_since: Option<Instant>,
    peer_checked: Instant,
    peer_alive: bool,
    header_ok: bool,
    process: Option<(Process, Analysis)>,
    failure_said: bool,
    goodbye: bool,
    /// The peer closed its end: a stream that ended, not one the collector's stop cut.
    eof: bool,
    /// The writer was told of this connection (its first frames came).
    opened: bool,
    /// Live lines printed so far, and the symbolizer they are named with.
    printed: usize,
    sym: Option<StackSymbolizer>,
    stale_said: usize,
    metrics: Option<Publisher>,
    /// The process's counter page, if its shim sent one with its first bytes: what it made,
    /// readable whatever becomes of the stream.
    page: Option<CounterPage>,
}

/// What one read from the socket gave.
enum Read {
    /// Bytes came.
    Bytes,
    /// Nothing now: read again.
    Again,
    /// The stream is over (the outcome says how).
    End(Result<(), String>),
}

/// What one pass over the inbox's whole frames did.
struct Applied {
    /// Bytes of whole frames taken.
    used: usize,
    /// Events among them.
    events: u64,
    /// Where the Hello frame ends, in the read that brought it.
    hello_end: Option<usize>,
    /// A frame that is not the protocol.
    failure: Option<String>,
}

impl<'a> Connection<'a> {
    /// The connection, once its peer is one of our own user's processes (only those may
    /// write into our trace); `None` drops it.
    fn accept(
        conn: u32,
        stream: UnixStream,
        wtx: &'a Sender<WriterMsg>,
        shared: &'a Shared,
        holding: Holding<'a>,
        accepted: Instant,
    ) -> Option<Connection<'a>> {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let (uid, peer_pid) = peer_cred(&stream)?;
        // SAFETY: geteuid has no preconditions.
        if uid != unsafe { libc::geteuid() } {
            return None;
        }
        Some(Connection {
            conn,
            stream,
            wtx,
            shared,
            holding,
            peer_pid,
            accepted,
            inbox: Inbox::new(shared.inbox_budget.clone()),
            last_byte: accepted,
            partial_since: None,
            peer_checked: accepted,
            peer_alive: true,
            header_ok: false,
            process: None,
            failure_said: false,
            goodbye: false,
            eof: false,
            opened: false,
            printed: 0,
            sym: None,
            stale_said: 0,
            metrics: shared.metrics.clone().map(Publisher::new),
            page: None,
        })
    }

    /// Reads and applies until the stream ends, the collector stops, or a frame is not the
    /// protocol.
    fn read_to_end(&mut self) -> Result<(), String> {
        loop {
            // A process that keeps sending never times out a read: check here too, or a
            // stopping collector would wait for the program to end. A process that has exited
            // (or one we cannot see) is read until its socket is empty, up to the cut: what
            // waits in the socket is the end of its trace.
            if self.shared.cut.load(Ordering::Acquire)
                || (self.shared.shutting_down.load(Ordering::Acquire)
                    && self.process.is_some()
                    && self.peer_pid.is_some_and(still_running))
            {
                return Ok(());
            }
            self.hold_if_traced();
            match self.read() {
                Read::Bytes => {}
                Read::Again => continue,
                Read::End(outcome) => return outcome,
            }
            self.last_byte = Instant::now();
            if !self.header_ok {
                let buf = self.inbox.bytes();
                if buf.len() < wire::STREAM_HEADER_SIZE {
                    continue;
                }
                if let Err(e) = wire::check_stream_header(buf) {
                    return Err(e.to_string());
                }
                self.inbox.consume(wire::STREAM_HEADER_SIZE);
                self.header_ok = true;
            }
            let applied = self.apply();
            self.side_outputs(applied.events);
            self.write(&applied);
            // The age of the frame in progress counts from its first byte, not its last.
            self.partial_since = match (self.inbox.is_empty(), self.partial_since) {
                (true, _) => None,
                (false, None) => Some(Instant::now()),
                (false, since) => since,
            };
            if let Some(f) = applied.failure {
                return Err(f);
            }
            if self.goodbye {
                return Ok(());
            }
        }
    }

    /// A traced process keeps an idle-exiting collector running; a client that never says
    /// Hello, takes longer than a shim ever does to finish a frame (a stopped sender, or a
    /// byte now and then), or whose process has gone (the socket kept open by another), does
    /// not for long.
    fn hold_if_traced(&mut self) {
        if let Some(pid) = self.peer_pid.filter(|_| self.process.is_some()) {
            if self.peer_checked.elapsed() >= PEER_CHECK_EVERY {
                self.peer_checked = Instant::now();
                self.peer_alive = still_running(pid);
            }
        }
        let counts = match self.process {
            None => self.accepted.elapsed() < HELLO_WAIT,
            Some(_) => {
                self.partial_since
                    .is_none_or(|since| since.elapsed() < MID_FRAME_WAIT)
                    && (self.peer_alive || self.last_byte.elapsed() < PEER_GONE_WAIT)
            }
        };
        self.holding.set(counts);
    }

    /// One read from the socket into the inbox.
    fn read(&mut self) -> Read {
        // The counter page comes with the first bytes (SCM_RIGHTS): read with `recvmsg`.
        let mut reader = PagedReader {
            fd: self.stream.as_raw_fd(),
            page: &mut self.page,
        };
        match self.inbox.read_from(&mut reader) {
            Ok(Some(0)) => {
                self.eof = true;
                Read::End(Ok(()))
            }
            Ok(Some(_)) => Read::Bytes,
            Ok(None) => {
                // Frames over what a shim sends, with the budget for them spent: read this
                // one more slowly (its sender blocks; nothing is dropped).
                if self.shared.inbox_budget.first_wait() {
                    self.shared.console.warn(&format!(
                        "oomtrace: clients hold partial frames over {} (a shim never sends \
                         one): they are read more slowly, {} of them at most in memory",
                        crate::units::fmt_bytes(inbox::FREE_BYTES as u64),
                        crate::units::fmt_bytes(inbox::LARGE_FRAMES_BUDGET as u64),
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
                Read::Again
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if self.shared.shutting_down.load(Ordering::Acquire) {
                    return Read::End(Ok(()));
                }
                if let Some(m) = self.metrics.as_mut() {
                    m.maybe(self.process.as_ref());
                }
                Read::Again
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Read::Again,
            Err(e) => Read::End(Err(format!("read failed: {e}"))),
        }
    }

    /// The inbox's whole frames applied to the process (the first one must be its Hello).
    fn apply(&mut self) -> Applied {
        let buf = self.inbox.bytes();
        let mut applied = Applied {
            used: 0,
            events: 0,
            // Where the Hello frame ends, in the read that brought it: sent as a chunk of its
            // own, a small record that still fits when the disk is nearly full, so that the
            // process is in the trace even if its first events are not.
            hello_end: None,
            failure: None,
        };
        loop {
            match wire::next_frame(&buf[applied.used..]) {
                Ok(Next::Frame(frame, len)) => {
                    match (&frame, self.process.as_mut()) {
                        (Frame::Hello(h), None) => {
                            self.process =
                                Some((Process::new(self.conn, h.clone()), Analysis::default()));
                            applied.hello_end = Some(applied.used + len);
                            self.shared.ever.store(true, Ordering::Release);
                            self.holding.set(true);
                        }
                        (_, None) => {
                            applied.failure = Some("the first frame is not a Hello".to_string());
                            break;
                        }
                        (_, Some((p, a))) => {
                            let before = p.events;
                            a.apply_frame(p, &frame);
                            applied.events += p.events.saturating_sub(before);
                            if a.failed && !self.failure_said {
                                self.shared
                                    .console
                                    .warn(&Analysis::failure_warning(p.pid()));
                                self.failure_said = true;
                            }
                        }
                    }
                    if matches!(frame, Frame::Goodbye { .. }) {
                        self.goodbye = true;
                    }
                    applied.used += len;
                }
                Ok(Next::Incomplete) => break,
                Err(e) => {
                    applied.failure = Some(e.to_string());
                    break;
                }
            }
        }
        applied
    }

    /// What else the frames just applied make: the metrics, the live lines.
    fn side_outputs(&mut self, events: u64) {
        if let Some(m) = self.metrics.as_mut() {
            m.registry.events.fetch_add(events, Ordering::Relaxed);
            m.dirty = true;
            m.maybe(self.process.as_ref());
        }
        if let Some((p, a)) = self.process.as_ref().filter(|_| self.shared.live) {
            let alerts = &a.alerts.list;
            if alerts.len() > self.printed {
                let sym = self.sym.get_or_insert_with(StackSymbolizer::new);
                for alert in &alerts[self.printed..] {
                    self.shared.console.line(&live::line(p, alert, sym));
                }
                self.printed = alerts.len();
                // A module rebuilt while its process runs: its frames are unnamed, said once.
                for m in &sym.stale_modules()[self.stale_said..] {
                    self.shared
                        .console
                        .warn(&format!("oomtrace: warning: {}", m.warning()));
                }
                self.stale_said = sym.stale_modules().len();
            }
        }
    }

    /// The frames just applied, to the writer (the Hello in a chunk of its own).
    fn write(&mut self, applied: &Applied) {
        let used = applied.used;
        if used == 0 {
            return;
        }
        if !self.opened {
            let _ = self.wtx.send(WriterMsg::Open(self.conn));
            self.opened = true;
        }
        let buf = self.inbox.bytes();
        let mut from = 0;
        if let Some(end) = applied.hello_end.filter(|&end| end < used) {
            let _ = self
                .wtx
                .send(WriterMsg::Chunk(self.conn, buf[..end].to_vec(), 0));
            from = end;
        }
        let _ = self.wtx.send(WriterMsg::Chunk(
            self.conn,
            buf[from..used].to_vec(),
            applied.events,
        ));
        self.inbox.consume(used);
    }

    /// The stream is over: what its process made, how it closed, what the process is told;
    /// the process goes to the collector's finished ones.
    fn finish(mut self, outcome: Result<(), String>) {
        let (conn, wtx, shared) = (self.conn, self.wtx, self.shared);
        // A stream that ended while its process runs on (the program closed or replaced the
        // shim's socket; the shim gave up on a stalled collector): what the process still
        // makes is only in its counter page. Its final count is read once the process has
        // ended, so that `lost_events` is everything it made and we never saw; a stopping
        // collector waits no more.
        if let (true, false, Ok(()), Some(_), Some(pid)) = (
            self.eof,
            self.goodbye,
            &outcome,
            self.page.as_ref(),
            self.peer_pid,
        ) {
            while still_running(pid)
                && !shared.shutting_down.load(Ordering::Acquire)
                && !shared.cut.load(Ordering::Acquire)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if let Some((p, a)) = self.process.as_mut() {
            account_made(conn, p, a, self.page.as_ref(), self.opened, wtx);
        }
        let reason = match (&outcome, self.goodbye) {
            (Err(_), _) => CloseReason::ProtocolError,
            (Ok(()), true) => CloseReason::Clean,
            (Ok(()), false) if !self.eof && shared.shutting_down.load(Ordering::Acquire) => {
                CloseReason::CollectorShutdown
            }
            (Ok(()), false) => CloseReason::Abrupt,
        };
        if self.opened {
            let _ = wtx.send(WriterMsg::Close(
                conn,
                reason,
                outcome.err().unwrap_or_default(),
            ));
            // Acknowledge the goodbye only once the data is on its way to disk.
            let (ack_tx, ack_rx) = bounded(1);
            if wtx.send(WriterMsg::Sync(ack_tx)).is_ok() {
                let _ = ack_rx.recv_timeout(Duration::from_secs(5));
            }
        }
        if shared.tell_processes && self.opened {
            // The shim reads one line after its goodbye: what its user must hear about its
            // trace. (After the Sync above, what this connection lost is counted.) A process
            // whose records were all written before the failure hears nothing. One number:
            // every event of this process that is not in the file, those the writer could not
            // write and those that never reached it (counted in the model).
            let missing = self.process.as_ref().map_or(0, |(p, _)| p.lost_events());
            let told = shared.failure.lock().ok().and_then(|s| {
                let mut lost = s.unwritten.get(&conn).copied()?;
                lost.events += missing;
                s.failure.as_ref().map(|f| f.line_for(lost))
            });
            if let Some(line) = told {
                let _ = self
                    .stream
                    .set_write_timeout(Some(Duration::from_millis(200)));
                let _ = self.stream.write_all(format!("{line}\n").as_bytes());
            }
        }
        // Closed as soon as this process's records are written (the Sync above): the shim
        // waits for this close at exit, and a process must not wait for others (its parent,
        // its children) nor for the idle grace. The trace file itself is finished when the
        // collector stops; a reader meanwhile waits on the writer's lock
        // (`TraceFile::hold_writer_lock`).
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let metrics = self.metrics.take();
        if let Some((mut p, a)) = self.process.take() {
            p.end = match reason {
                CloseReason::Clean => p.end,
                CloseReason::ProtocolError => EndState::ProtocolError,
                CloseReason::Abrupt => p.end_without_goodbye(),
                CloseReason::CollectorShutdown => EndState::Running,
            };
            if let Some(m) = metrics {
                m.end(Some((&p, &a)));
            }
            if let Ok(mut f) = shared.finished.lock() {
                f.push((p, a));
            }
        } else if let Some(m) = metrics {
            m.end(None);
        }
    }
}
