//! A whole trace: every process of a `.oomt` file (or of a running collector), rebuilt by
//! replaying the file's records in order, each beside its observer (`Trace<Analysis>` for a
//! report, `Trace` (`()`) for accounting only). Streams the file: memory follows the live
//! state, not the file size.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use oomtrace_proto::trace_file::{
    CloseReason, FileHeader, Record, Tail, TraceReader, WriteFailure,
};
use oomtrace_proto::wire::{self, Frame};
use oomtrace_proto::Error as FormatError;
use rustc_hash::FxHashMap;

use super::{EndState, Error, Observer, Process};
use crate::snapshot;

/// Applies one frame to its process and observer: [`Observer::apply_frame`] unless a replay
/// wants to watch (see [`super::history`]).
pub type ApplyFrame<'a, O> = dyn FnMut(&mut Process, &mut O, &Frame<'_>) + 'a;

#[derive(Debug)]
pub struct Trace<O = ()> {
    pub header: FileHeader,
    /// Processes in the order their connections opened (their connection numbers): during a
    /// replay, in the order their first frames reach the file, which can differ (each
    /// connection's reader hands its chunks to the writer on its own); sorted once the file
    /// ends, so a replay lists them as the live collector does.
    pub processes: Vec<Process>,
    /// Each process's observer: `observers[i]` watched `processes[i]`.
    pub observers: Vec<O>,
    by_conn: FxHashMap<u32, usize>,
    /// The writer finished cleanly (an `End` record).
    pub complete: bool,
    pub tail: Tail,
    /// Things a reader should know (truncation, protocol errors), one sentence each.
    pub warnings: Vec<String>,
    /// The writer could not write everything (an `Incomplete` record: a full disk).
    pub incomplete: Option<Incomplete>,
}

/// What an `Incomplete` record says: the trace stops early, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomplete {
    /// When the first write failed: nothing after it is in the file.
    pub t_unix_ns: u64,
    pub cause: WriteFailure,
    /// Bytes of wire frames received from then on and never written (the shim's own writer
    /// counts only the write that failed: it encodes nothing after it).
    pub unwritten_bytes: u64,
    /// Events not written from then on, for all processes.
    pub unwritten_events: u64,
    /// The error as the writer saw it (`No space left on device`).
    pub message: String,
}

impl Incomplete {
    /// The warning a report carries: when the trace stops, why, and what is missing.
    /// `started_unix_ns` is the trace's start (its header), for a time a reader can place.
    pub fn sentence(&self, started_unix_ns: u64) -> String {
        let at = self.t_unix_ns.saturating_sub(started_unix_ns) as f64 / 1e9;
        format!(
            "the trace stops at {at:.3} s into it: {} ({}); {} events not written, and processes \
             still running then are cut short (everything before is reported)",
            self.cause.words(),
            self.message,
            self.unwritten_events,
        )
    }
}

/// Opens a trace for reading, refusing anything but a regular file: opening a FIFO would block
/// until someone writes to it, and a device never ends. The open itself never blocks
/// (O_NONBLOCK, which a regular file ignores).
fn open_regular(path: &Path) -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let t = f.metadata().map_err(|e| e.to_string())?.file_type();
    if t.is_file() {
        return Ok(f);
    }
    Err(format!(
        "it is {}, not a trace file",
        oomtrace_proto::host::file_kind::describe(&t)
    ))
}

/// How long a reader waits for a collector that still holds the writer's lock on the trace
/// (`TraceFile::hold_writer_lock`): the collector a preloaded shim starts finishes its file
/// about a second after the last program returned. Longer means a traced process is still
/// running: the trace is read as it is, and a warning says so.
const WRITER_WAIT: Duration = Duration::from_secs(5);

/// Set by [`read_without_waiting`]: readers do not wait for a writer at all.
static NO_WAIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, this process reads a trace a collector is still writing as it is at once,
/// without waiting for the writer (the warning still says so): for a program that reads its
/// own trace while it runs (`oomtrace.trace()` in Python, `report --no-wait`).
pub fn read_without_waiting() {
    NO_WAIT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Waits (at most [`WRITER_WAIT`]) until no collector holds the writer's lock on `f`; false
/// if one still does. A shared lock, kept while the file is read; a filesystem without locks
/// never waits.
fn wait_for_writer(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    let started = Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own; it only takes an advisory lock.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return true;
        }
        let e = std::io::Error::last_os_error();
        let waited_enough =
            NO_WAIT.load(std::sync::atomic::Ordering::Relaxed) || started.elapsed() >= WRITER_WAIT;
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || waited_enough {
            return e.raw_os_error() != Some(libc::EWOULDBLOCK);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl<O: Observer + Default> Trace<O> {
    pub fn new(header: FileHeader) -> Trace<O> {
        Trace {
            header,
            processes: Vec::new(),
            observers: Vec::new(),
            by_conn: FxHashMap::default(),
            complete: false,
            tail: Tail::Open,
            warnings: Vec::new(),
            incomplete: None,
        }
    }

    /// Reads a trace file. A truncated tail is not an error (see `tail` and `warnings`);
    /// a bad header or a damaged record is.
    pub fn load(path: &Path) -> Result<Trace<O>, Error> {
        Trace::load_with_progress(path, &mut |_, _| {})
    }

    /// [`Trace::load`], telling `progress(bytes read, file size)` as the file is read (about
    /// every MiB), so that a front end can show progress; this library never prints.
    pub fn load_with_progress(
        path: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Trace<O>, Error> {
        Trace::load_with(path, &mut |p, o, f| o.apply_frame(p, f), progress)
    }

    /// [`Trace::load_with_progress`], each frame applied by `apply`.
    pub fn load_with(
        path: &Path,
        apply: &mut ApplyFrame<'_, O>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Trace<O>, Error> {
        let f = open_regular(path).map_err(|e| Error::Open {
            path: path.to_path_buf(),
            source: e,
        })?;
        if let Some(trace) = Trace::load_snapshot(path, &f, apply, progress)? {
            return Ok(trace);
        }
        let finished = wait_for_writer(&f);
        let total = f.metadata().map_or(0, |m| m.len());
        let mut at = |done: u64| progress(done, total.max(done));
        let mut trace = Trace::read_pipelined(BufReader::with_capacity(1 << 20, f), apply, &mut at)
            .map_err(|e| match e {
                Error::Format(inner) => Error::BadTrace {
                    path: path.to_path_buf(),
                    source: inner,
                },
                other => other,
            })?;
        if !finished {
            trace
                .warnings
                .push(if NO_WAIT.load(std::sync::atomic::Ordering::Relaxed) {
                    "a collector is still writing this trace: it is read as it is now".to_owned()
                } else {
                    format!(
                    "a collector is still writing this trace (waited {} s for it to finish): it \
                     is read as it is now",
                    WRITER_WAIT.as_secs()
                )
                });
        }
        Ok(trace)
    }

    /// A PyTorch memory snapshot (a pickle) read as the trace it makes
    /// (`crate::snapshot`), its limits the trace's first warning; `None` for a file that is
    /// not a pickle.
    fn load_snapshot(
        path: &Path,
        f: &File,
        apply: &mut ApplyFrame<'_, O>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Option<Trace<O>>, Error> {
        use std::io::{Seek, SeekFrom};
        let bad = |source: String| Error::BadSnapshot {
            path: path.to_path_buf(),
            source,
        };
        let mut f = f;
        let mut head = [0u8; 2];
        let n = f.read(&mut head).map_err(|e| bad(e.to_string()))?;
        f.seek(SeekFrom::Start(0)).map_err(|e| bad(e.to_string()))?;
        if !snapshot::is_pickle(&head[..n]) {
            return Ok(None);
        }
        let size = f.metadata().map_or(0, |m| m.len());
        if size > snapshot::MAX_SNAPSHOT_BYTES {
            return Err(bad(format!(
                "a snapshot of {size} bytes is larger than the {} this reader takes",
                snapshot::MAX_SNAPSHOT_BYTES
            )));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        f.take(snapshot::MAX_SNAPSHOT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(e.to_string()))?;
        progress(bytes.len() as u64 / 2, bytes.len() as u64);
        let converted = snapshot::convert(&bytes, &path.display().to_string()).map_err(bad)?;
        drop(bytes);
        let mut trace = Trace::read_with(converted.trace.as_slice(), apply)
            .map_err(|e| bad(format!("its trace could not be replayed: {e}")))?;
        progress(size, size);
        trace.warnings.insert(0, converted.limits);
        Ok(Some(trace))
    }

    pub fn read<R: Read>(r: R) -> Result<Trace<O>, Error> {
        Trace::read_with(r, &mut |p, o, f| o.apply_frame(p, f))
    }

    /// [`Trace::read`], each frame applied by `apply`.
    pub fn read_with<R: Read>(r: R, apply: &mut ApplyFrame<'_, O>) -> Result<Trace<O>, Error> {
        let mut reader = TraceReader::new(r)?;
        let mut trace = Trace::new(reader.header.clone());
        while let Some(rec) = reader.next_record()? {
            trace.apply_record_recycling(rec, apply, &mut |frames| reader.recycle(frames))?;
        }
        trace.finish(reader.tail())
    }

    /// [`Trace::read_with`], the file read, decompressed and checked on a thread of its own
    /// while this one replays: on two cores a report takes the longer of the two, not their
    /// sum. Records come in order, a few ahead at most (memory stays bounded); their
    /// buffers go back to the reader once replayed.
    /// `progress(bytes)` is told the bytes replayed so far, about every record.
    fn read_pipelined<R: Read + Send>(
        r: R,
        apply: &mut ApplyFrame<'_, O>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Trace<O>, Error> {
        /// Records read ahead of the replay.
        const AHEAD: usize = 4;
        let mut reader = TraceReader::new(r)?;
        let mut trace = Trace::new(reader.header.clone());
        let (tx, rx) = crossbeam_channel::bounded::<(Result<Record, FormatError>, u64)>(AHEAD);
        let (give_back, taken_back) = crossbeam_channel::bounded::<Vec<u8>>(AHEAD + 2);
        std::thread::scope(|scope| {
            let read = std::thread::Builder::new()
                .name("oomtrace-read".into())
                .spawn_scoped(scope, move || {
                    loop {
                        for frames in taken_back.try_iter() {
                            reader.recycle(frames);
                        }
                        let next = reader.next_record().transpose();
                        let last = !matches!(next, Some(Ok(_)));
                        // The replay stopped (an error): nobody reads on.
                        if let Some(rec) = next {
                            if tx.send((rec, reader.offset())).is_err() {
                                break;
                            }
                        }
                        if last {
                            break;
                        }
                    }
                    reader.tail()
                })
                .map_err(|e| FormatError::Io(format!("cannot start a thread to read: {e}")))?;
            let replayed = (|| {
                for (rec, offset) in &rx {
                    trace.apply_record_recycling(rec?, apply, &mut |frames| {
                        let _ = give_back.try_send(frames);
                    })?;
                    progress(offset);
                }
                Ok(())
            })();
            drop(rx);
            let tail = read
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            replayed.map(|()| tail)
        })
        .and_then(|tail| trace.finish(tail))
    }

    /// The trace once its last record is replayed and the file ended with `tail`: the
    /// warnings a reader should know.
    fn finish(self, tail: Tail) -> Result<Trace<O>, Error> {
        let mut trace = self;
        trace.tail = tail;
        trace.sort_by_connection();
        if let Tail::Truncated { offset, bytes } = trace.tail {
            trace.warnings.push(format!(
                "the trace ends in the middle of a record at byte {offset} ({bytes} bytes of it present): \
                 its writer was killed or is still writing; everything before it is reported"
            ));
        }
        let implausible: Vec<String> = trace
            .processes
            .iter()
            .filter_map(Process::implausible_device_warning)
            .collect();
        trace.warnings.extend(implausible);
        if let Some(inc) = &trace.incomplete {
            let warning = inc.sentence(trace.header.created_unix_ns);
            trace.warnings.push(warning);
        }
        // Without an end marker the writer may still be running (a collector waits a moment
        // for late children) or was killed; that matters only for processes whose stream has
        // not ended.
        // (A trace cut short by a full disk has said so above, for all of them.)
        if !trace.complete && trace.incomplete.is_none() {
            for p in trace
                .processes
                .iter()
                .filter(|p| p.end == EndState::Running)
            {
                trace.warnings.push(format!(
                    "process {} was still connected when the trace ends (its collector is still \
                     running or was killed): its last events may be missing",
                    p.pid()
                ));
            }
        }
        Ok(trace)
    }

    /// Orders processes (with their observers) by connection number, the order the live
    /// collector hands them over in (`server`): a forked child's first chunk can reach the file
    /// before its parent's.
    fn sort_by_connection(&mut self) {
        if self.processes.windows(2).all(|w| w[0].conn < w[1].conn) {
            return;
        }
        let mut pairs: Vec<(Process, O)> = std::mem::take(&mut self.processes)
            .into_iter()
            .zip(std::mem::take(&mut self.observers))
            .collect();
        pairs.sort_by_key(|(p, _)| p.conn);
        self.by_conn.clear();
        for (p, o) in pairs {
            self.push_process(p, o);
        }
    }

    pub fn apply_record(&mut self, rec: Record) -> Result<(), Error> {
        self.apply_record_with(rec, &mut |p, o, f| o.apply_frame(p, f))
    }

    /// [`Trace::apply_record`], each frame applied by `apply`.
    pub fn apply_record_with(
        &mut self,
        rec: Record,
        apply: &mut ApplyFrame<'_, O>,
    ) -> Result<(), Error> {
        self.apply_record_recycling(rec, apply, &mut drop)
    }

    /// [`Trace::apply_record_with`], a chunk's buffer handed to `recycle` once replayed.
    fn apply_record_recycling(
        &mut self,
        rec: Record,
        apply: &mut ApplyFrame<'_, O>,
        recycle: &mut dyn FnMut(Vec<u8>),
    ) -> Result<(), Error> {
        match rec {
            Record::ConnOpen { .. } => {}
            Record::Chunk { conn, frames } => {
                self.apply_chunk_with(conn, &frames, apply)?;
                recycle(frames);
            }
            Record::ConnClose {
                conn,
                reason,
                message,
                ..
            } => {
                if let Some(&i) = self.by_conn.get(&conn) {
                    let p = &mut self.processes[i];
                    match reason {
                        CloseReason::Clean | CloseReason::Abrupt => {
                            if p.end == EndState::Running {
                                p.end = p.end_without_goodbye();
                            }
                        }
                        CloseReason::ProtocolError => {
                            p.end = EndState::ProtocolError;
                            self.warnings.push(format!(
                                "process {} was dropped for a protocol error: {message}",
                                p.pid()
                            ));
                        }
                        CloseReason::CollectorShutdown => {}
                    }
                }
            }
            Record::End { .. } => self.complete = true,
            Record::Incomplete {
                t_unix_ns,
                cause,
                unwritten_bytes,
                unwritten_events,
                message,
                made,
            } => {
                // What each process cut short made: its missing events are then counted.
                for m in &made {
                    if let Some(&i) = self.by_conn.get(&m.conn) {
                        self.processes[i].learn_made(m.events, m.ending);
                    }
                }
                self.incomplete = Some(Incomplete {
                    t_unix_ns,
                    cause,
                    unwritten_bytes,
                    unwritten_events,
                    message,
                })
            }
            Record::Unknown { .. } => {}
        }
        Ok(())
    }

    /// Applies whole wire frames of connection `conn`.
    pub fn apply_chunk(&mut self, conn: u32, frames: &[u8]) -> Result<(), Error> {
        self.apply_chunk_with(conn, frames, &mut |p, o, f| o.apply_frame(p, f))
    }

    /// [`Trace::apply_chunk`], each frame after the Hello applied by `apply`.
    pub fn apply_chunk_with(
        &mut self,
        conn: u32,
        frames: &[u8],
        apply: &mut ApplyFrame<'_, O>,
    ) -> Result<(), Error> {
        for frame in wire::frames(frames) {
            let frame = frame?;
            match (&frame, self.by_conn.get(&conn)) {
                (Frame::Hello(h), None) => {
                    self.by_conn.insert(conn, self.processes.len());
                    self.processes.push(Process::new(conn, h.clone()));
                    self.observers.push(O::default());
                }
                (_, Some(&i)) => apply(&mut self.processes[i], &mut self.observers[i], &frame),
                (_, None) => {
                    return Err(Error::Format(oomtrace_proto::Error::Malformed(
                        "a connection's first frame is not a Hello",
                    )))
                }
            }
        }
        Ok(())
    }

    /// Adds a process tracked elsewhere, with its observer (the live collector hands its
    /// processes over).
    pub fn push_process(&mut self, p: Process, o: O) {
        self.by_conn.insert(p.conn, self.processes.len());
        self.processes.push(p);
        self.observers.push(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oomtrace_proto::trace_file as tf;
    use oomtrace_proto::wire::{encode, GoodbyeReason, Hello};
    use oomtrace_proto::{Api, Event, EventKind};

    fn file(goodbye: bool) -> Vec<u8> {
        let mut f = Vec::new();
        tf::write_header(&mut f, 1, "test").unwrap();
        tf::write_conn_open(&mut f, 3, 1, 1).unwrap();
        let mut frames = Vec::new();
        encode::hello(
            &mut frames,
            &Hello {
                pid: 77,
                argv: vec!["app".into()],
                ..Default::default()
            },
        );
        let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
        e.ptr = 0x10;
        e.size = 4096;
        e.device = 0;
        encode::events(&mut frames, &[e]);
        if goodbye {
            encode::goodbye(&mut frames, GoodbyeReason::Exit, 1);
        }
        tf::write_chunk(&mut f, 3, &frames, true).unwrap();
        tf::write_conn_close(&mut f, 3, 2, tf::CloseReason::Clean, "").unwrap();
        tf::write_end(&mut f, 3, 1).unwrap();
        f
    }

    #[test]
    fn replays_processes() {
        let t: Trace = Trace::read(&file(true)[..]).unwrap();
        assert!(t.complete && t.warnings.is_empty());
        let p = &t.processes[0];
        assert_eq!(p.pid(), 77);
        assert_eq!(p.devices[&0].live_bytes, 4096);
        assert_eq!(p.end, EndState::Exited(Some(GoodbyeReason::Exit)));
        let t: Trace = Trace::read(&file(false)[..]).unwrap();
        assert_eq!(t.processes[0].end, EndState::Abrupt);
    }

    /// A stream cut before its goodbye, whose process said (Made) it made 5 events and had
    /// begun its exit: 4 are missing, and it is not called killed.
    #[test]
    fn a_cut_stream_counts_what_its_process_made_and_did_not_deliver() {
        let mut f = Vec::new();
        tf::write_header(&mut f, 1, "test").unwrap();
        let mut frames = Vec::new();
        encode::hello(&mut frames, &Hello::default());
        let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
        e.size = 1;
        encode::events(&mut frames, &[e]);
        encode::made(&mut frames, 5, GoodbyeReason::Exit as u8);
        tf::write_chunk(&mut f, 3, &frames, false).unwrap();
        tf::write_conn_close(&mut f, 3, 2, tf::CloseReason::Abrupt, "").unwrap();
        // Another process, cut by a full disk: its count is in the Incomplete record.
        let mut frames = Vec::new();
        encode::hello(&mut frames, &Hello::default());
        encode::events(&mut frames, &[e, e]);
        tf::write_chunk(&mut f, 4, &frames, false).unwrap();
        tf::write_incomplete(
            &mut f,
            3,
            tf::WriteFailure::DiskFull,
            0,
            0,
            "",
            &[tf::ConnMade {
                conn: 4,
                events: 9,
                ending: 0,
            }],
        )
        .unwrap();
        let t: Trace = Trace::read(&f[..]).unwrap();
        let p = &t.processes[0];
        assert_eq!((p.received(), p.lost_events()), (1, 4));
        assert_eq!(p.end, EndState::Unheard(GoodbyeReason::Exit));
        let q = &t.processes[1];
        assert_eq!((q.received(), q.lost_events()), (2, 7));
        assert_eq!(q.end, EndState::Running);
    }

    /// A forked child's first chunk can reach the file before its parent's (each connection's
    /// reader hands its chunks to the writer on its own): the replay lists processes by
    /// connection, as the live collector hands them over, and a later chunk still finds its
    /// process.
    #[test]
    fn processes_are_listed_by_connection_whatever_reached_the_file_first() {
        let chunk = |pid: u32, size: u64| {
            let mut frames = Vec::new();
            encode::hello(
                &mut frames,
                &Hello {
                    pid,
                    ..Default::default()
                },
            );
            let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
            e.ptr = 0x10;
            e.size = size;
            e.device = 0;
            encode::events(&mut frames, &[e]);
            frames
        };
        let mut f = Vec::new();
        tf::write_header(&mut f, 1, "test").unwrap();
        tf::write_chunk(&mut f, 5, &chunk(200, 5), false).unwrap();
        tf::write_chunk(&mut f, 4, &chunk(100, 4), false).unwrap();
        let mut more = Vec::new();
        let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
        e.ptr = 0x20;
        e.size = 50;
        e.device = 0;
        encode::events(&mut more, &[e]);
        tf::write_chunk(&mut f, 5, &more, false).unwrap();
        tf::write_end(&mut f, 3, 2).unwrap();
        let t: Trace = Trace::read(&f[..]).unwrap();
        let listed: Vec<(u32, u32, u64)> = t
            .processes
            .iter()
            .map(|p| (p.conn, p.pid(), p.devices[&0].live_bytes))
            .collect();
        assert_eq!(listed, [(4, 100, 4), (5, 200, 55)]);
    }

    #[test]
    fn truncated_file_keeps_what_was_written() {
        let full = file(true);
        let t: Trace = Trace::read(&full[..full.len() - 3]).unwrap();
        assert!(!t.complete);
        assert_eq!(t.processes[0].devices[&0].live_bytes, 4096);
        assert!(matches!(t.tail, Tail::Truncated { .. }));
        assert_eq!(t.warnings.len(), 1);
    }
}
