//! The collector's trace file, from the first byte to the last: where it may be written, how
//! it comes into being, and what happens when the disk fills up.
//!
//! - **Only regular files.** An output that exists and is a symlink, a directory, a device, a
//!   FIFO or a socket is refused before anything runs ([`check_output`]): oomtrace never
//!   writes through a link and never replaces what it did not create.
//! - **Nothing until there is something to write.** The trace is created under a temporary
//!   name beside the output (`.NAME.oomtrace-PID.tmp`, exclusive, 0600, its header written
//!   and its reserve allocated) when the collector starts, so an unwritable directory or a
//!   full disk fails at once; it is moved into place when the first traced process connects
//!   (rename, which replaces a regular file; with no-clobber, a hard link to the first free
//!   name, so an existing file is never replaced), and removed if none ever does: a program
//!   that never touches CUDA leaves no file.
//! - **Whole records, and room for the last word.** Records are built in memory and written
//!   whole at known offsets. Before each write the writer reserves the bytes it is about to
//!   write plus [`RESERVE`] past the end of the file (`fallocate` with `KEEP_SIZE`); when the
//!   disk is full the reservation fails first, the records that still fit are written one by
//!   one (a process's Hello is a record of its own, so the process is in the trace), the file
//!   ends on a whole record, and the reserved room holds an `Incomplete` record (when, the
//!   cause, the bytes and events not written) and the `End`. From then on records are counted per connection, not written, so the
//!   connections are never held back. On a filesystem without `fallocate` the same happens on
//!   the failed write itself (the file is cut back to the last whole record), as room allows.
//! - **Locked while written, when it finishes after its programs.** The collector a preloaded
//!   shim starts lets each program return once its records are written, then finishes the
//!   file a moment later (after its idle grace); it holds an exclusive `flock` on the file
//!   until then, and the trace reader waits on it (bounded) before reading.
//! - **A trace whose directory vanished is kept.** If the trace's name is gone when it is
//!   finished (its directory was removed during the run: the file was unlinked while open),
//!   and the collector was given a place for that (`oomtrace run`'s: the temp dir), the whole
//!   file is copied there under the first free name (exclusive, 0600) from the descriptor the
//!   collector still holds, and the collector says where; otherwise it says why it is lost.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use oomtrace_proto::trace_file::{self, CloseReason, ConnMade, WriteFailure};
use oomtrace_proto::wire;
use rustc_hash::FxHashMap;

/// Room kept allocated past the end of the file for the `Incomplete` and `End` records.
pub const RESERVE: u64 = 64 << 10;
/// How long the writer lets chunks gather once they flow (see [`write_loop`]).
const BATCH_PAUSE: Duration = Duration::from_micros(500);

/// What the connections send the writer thread.
pub enum WriterMsg {
    Open(u32),
    /// Whole wire frames of a connection, and how many events they hold.
    Chunk(u32, Vec<u8>, u64),
    Close(u32, CloseReason, String),
    /// What a connection's process made, as its stream ended (its last `Made` frame, as
    /// already sent in its chunks): kept for the `Incomplete` record, should the end of that
    /// stream not be written.
    Made(ConnMade),
    /// Flush to the OS, then acknowledge.
    Sync(Sender<()>),
}

/// Why the trace could not be written whole.
#[derive(Clone, Debug)]
pub struct Failure {
    pub cause: WriteFailure,
    /// The error in words (`No space left on device`).
    pub error: String,
    /// Where the trace is (the name it was given when placed).
    pub path: PathBuf,
    /// When the first write failed.
    pub t_unix_ns: u64,
}

impl Failure {
    /// One line for the collector's user: what was lost and why.
    pub fn line(&self) -> String {
        format!(
            "the trace {} is incomplete: {} ({}); events from then on are not written",
            self.path.display(),
            self.cause.words(),
            self.error
        )
    }

    /// One line for the user of one traced process: what of its trace was lost and why.
    pub fn line_for(&self, lost: Unwritten) -> String {
        let what = if lost.events > 0 {
            format!("{} events of this process were not written", lost.events)
        } else {
            "the end of this process was not recorded".to_string()
        };
        format!(
            "the trace {} is incomplete: {} ({}); {what}",
            self.path.display(),
            self.cause.words(),
            self.error
        )
    }
}

/// What one connection sent that could not be written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unwritten {
    /// Records: chunks, and the connection's ConnClose.
    pub records: u64,
    pub bytes: u64,
    pub events: u64,
}

impl Unwritten {
    fn add(&mut self, bytes: u64, events: u64) {
        self.records += 1;
        self.bytes += bytes;
        self.events += events;
    }
}

/// The writer's failure, shared with the connections (each tells its process what it lost)
/// and the accept loop (which says it once).
#[derive(Debug, Default)]
pub struct FailureState {
    pub failure: Option<Failure>,
    /// Per connection, what could not be written (no entry: all of it was).
    pub unwritten: FxHashMap<u32, Unwritten>,
}

pub type SharedFailure = Arc<Mutex<FailureState>>;

/// Refuses an output that exists and is not a regular file (see the module comment).
pub fn check_output(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(m) => {
            let t = m.file_type();
            if t.is_file() {
                return Ok(());
            }
            let what = oomtrace_proto::host::file_kind::describe(&t);
            Err(if t.is_symlink() {
                format!("it is {what} (oomtrace does not write through links: name its target)")
            } else if t.is_dir() {
                format!("it is {what}")
            } else {
                format!("it is {what}, not a regular file")
            })
        }
    }
}

/// The trace file before and after it is moved into place.
pub struct TraceFile {
    file: File,
    tmp: PathBuf,
    dest: PathBuf,
    no_clobber: bool,
    /// Where the file is now, once placed.
    placed: Option<PathBuf>,
    /// Bytes written at creation (the header).
    header_len: u64,
    /// The header written: a report of the collector's own models names the same producer
    /// and start as one read from the file.
    pub header: trace_file::FileHeader,
    /// Where a finished trace whose name vanished is saved, if anywhere ([`Vanished`]).
    pub save_vanished_in: Option<PathBuf>,
}

/// The trace's name was gone when it was finished (its directory was removed while the
/// collector wrote it).
#[derive(Clone, Debug)]
pub struct Vanished {
    /// The name it had.
    pub was: PathBuf,
    /// Where a copy was saved, or why there is none (empty: none was asked for).
    pub saved: Result<PathBuf, String>,
}

impl Vanished {
    /// One line for the collector's user.
    pub fn line(&self) -> String {
        let gone = match self.was.parent() {
            Some(d) if !d.as_os_str().is_empty() && !d.exists() => {
                format!("its directory {} was removed during the run", d.display())
            }
            _ => "it was removed during the run".to_string(),
        };
        match &self.saved {
            Ok(p) => format!(
                "the trace {} is gone ({gone}); saved it to {} instead",
                self.was.display(),
                p.display()
            ),
            Err(why) if why.is_empty() => {
                format!("the trace {} is gone ({gone})", self.was.display())
            }
            Err(why) => format!(
                "the trace {} is gone ({gone}), and no copy could be saved: {why}",
                self.was.display()
            ),
        }
    }
}

impl TraceFile {
    /// Creates the temporary file beside `dest` with its header and its reserve (see the
    /// module comment).
    pub fn create(dest: &Path, no_clobber: bool, producer: &str) -> io::Result<TraceFile> {
        check_output(dest).map_err(io::Error::other)?;
        let name = dest
            .file_name()
            .ok_or_else(|| io::Error::other("the output names no file"))?
            .to_string_lossy()
            .into_owned();
        let mut last = None;
        for n in 0..100u32 {
            let tmp = dest.with_file_name(format!(
                ".{name}.oomtrace-{}{}.tmp",
                std::process::id(),
                if n == 0 {
                    String::new()
                } else {
                    format!("-{n}")
                }
            ));
            // Readable too: a trace whose name vanishes is copied out through it.
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
            {
                Ok(file) => {
                    let mut tf = TraceFile {
                        file,
                        tmp,
                        dest: dest.to_path_buf(),
                        no_clobber,
                        placed: None,
                        header_len: 0,
                        header: trace_file::FileHeader {
                            version: trace_file::FILE_VERSION,
                            created_unix_ns: now_ns(),
                            producer: producer.to_owned(),
                        },
                        save_vanished_in: None,
                    };
                    // On error, dropping `tf` removes the temporary file.
                    let mut header = Vec::new();
                    trace_file::write_header(
                        &mut header,
                        tf.header.created_unix_ns,
                        &tf.header.producer,
                    )?;
                    tf.file.write_all_at(&header, 0)?;
                    tf.header_len = header.len() as u64;
                    match reserve(&tf.file, tf.header_len, RESERVE) {
                        Err(e) if out_of_room(&e) => return Err(e),
                        _ => {}
                    }
                    return Ok(tf);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
    }

    /// Takes the writer's lock on the file (`flock`, exclusive), released when the collector
    /// closes it, finished or killed: a reader that finds it held knows the trace is still
    /// being written and waits for it ([`crate::model::trace::Trace::load`]). Best effort: a
    /// filesystem without locks just means readers do not wait.
    pub fn hold_writer_lock(&self) {
        // SAFETY: flock on the descriptor this TraceFile owns; it only sets an advisory lock.
        let _ = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    }

    /// Moves the file to its name; returns the path used.
    fn place(&mut self) -> io::Result<PathBuf> {
        if let Some(p) = &self.placed {
            return Ok(p.clone());
        }
        let path = if self.no_clobber {
            self.link_to_free_name()
        } else {
            // Checked again: something that is not a regular file may have appeared there
            // since the collector started (rename would replace it). Never written beside it.
            check_output(&self.dest)
                .map_err(io::Error::other)
                .and_then(|()| std::fs::rename(&self.tmp, &self.dest))
                .map(|()| self.dest.clone())
        };
        let path = match path {
            Ok(path) => path,
            // The directory was removed before the first process connected: the open file
            // still takes every record, and is saved at the end like a trace whose name
            // vanished later (`keep_if_vanished`), never lost as "could not be written".
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.unlinked() => self.dest.clone(),
            Err(e) => return Err(e),
        };
        self.placed = Some(path.clone());
        Ok(path)
    }

    /// Whether the open file has no name left (its directory was removed).
    fn unlinked(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().is_ok_and(|m| m.nlink() == 0)
    }

    /// `link` never replaces an existing name: the first of `dest`, `dest.1`, ... that is free.
    /// Where hard links are not supported (vfat, some network filesystems), a rename that
    /// refuses to replace (`RENAME_NOREPLACE`) does the same.
    fn link_to_free_name(&self) -> io::Result<PathBuf> {
        let mut candidate = self.dest.clone();
        for n in 1..10_000 {
            let placed = match std::fs::hard_link(&self.tmp, &candidate) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&self.tmp);
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(e),
                Err(link_error) => rename_noreplace(&self.tmp, &candidate).map_err(|e| {
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        e
                    } else {
                        link_error
                    }
                }),
            };
            match placed {
                Ok(()) => return Ok(candidate),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    candidate = trace_file::numbered_path(&self.dest, n)
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free file name",
        ))
    }

    /// The path the trace has now (the temporary one until placed).
    pub fn path(&self) -> &Path {
        self.placed.as_deref().unwrap_or(&self.tmp)
    }

    /// Whether the placed file is still the one under its name: false once it was unlinked
    /// (its directory removed) or replaced by another file.
    fn still_named(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(open), Some(path)) = (self.file.metadata(), &self.placed) else {
            return true;
        };
        open.nlink() > 0
            && std::fs::metadata(path).is_ok_and(|m| m.dev() == open.dev() && m.ino() == open.ino())
    }

    /// A finished trace whose name vanished: copied whole into `save_vanished_in` (the first
    /// free name there, never replacing anything), from the descriptor still open. None while
    /// the file still has its name.
    fn keep_if_vanished(&mut self) -> Option<Vanished> {
        if self.still_named() {
            return None;
        }
        let was = self.placed.clone()?;
        let saved = match &self.save_vanished_in {
            // A standalone or the shim's collector: nobody to report from a copy.
            None => Err(String::new()),
            Some(dir) => self.copy_into(dir, &was),
        };
        if let Ok(p) = &saved {
            self.placed = Some(p.clone());
        }
        Some(Vanished { was, saved })
    }

    fn copy_into(&self, dir: &Path, was: &Path) -> Result<PathBuf, String> {
        let name = was
            .file_name()
            .ok_or_else(|| "the trace names no file".to_string())?;
        let dest = dir.join(name);
        let mut last = String::new();
        for n in 0..1000 {
            let candidate = if n == 0 {
                dest.clone()
            } else {
                trace_file::numbered_path(&dest, n)
            };
            let mut out = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&candidate)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    last = format!("{}: {e}", candidate.display());
                    continue;
                }
                Err(e) => return Err(format!("cannot create {}: {e}", candidate.display())),
            };
            let mut from = &self.file;
            let copied = io::Seek::seek(&mut from, io::SeekFrom::Start(0))
                .and_then(|_| io::copy(&mut from, &mut out))
                .and_then(|_| out.sync_all());
            return match copied {
                Ok(()) => Ok(candidate),
                Err(e) => {
                    // Half a copy is ours to remove.
                    let _ = std::fs::remove_file(&candidate);
                    Err(format!("cannot write {}: {e}", candidate.display()))
                }
            };
        }
        Err(format!("no free name: {last}"))
    }
}

impl Drop for TraceFile {
    /// A trace never moved into place (nobody connected, or the collector failed to start)
    /// is only our temporary file: removed, so nothing is left behind.
    fn drop(&mut self) {
        if self.placed.is_none() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `rename(from, to)` that fails with `AlreadyExists` instead of replacing `to`.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::other("a path with a NUL byte"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two valid NUL-terminated paths, relative to the working directory (AT_FDCWD).
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A failed reservation that means the disk (or the file's limit) is full. Anything else
/// (EOPNOTSUPP, ENOSYS on a filesystem without `fallocate`) means reserving cannot work here:
/// the writer goes on without it, and a real problem shows in the write itself.
fn out_of_room(e: &io::Error) -> bool {
    WriteFailure::of(e) != WriteFailure::Other
}

/// Keeps `[offset, offset + bytes)` of `file` allocated without changing its size.
fn reserve(file: &File, offset: u64, bytes: u64) -> io::Result<()> {
    loop {
        // SAFETY: fallocate on a file we own, open for writing; KEEP_SIZE leaves its size as
        // it is, so readers never see the reserved bytes.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                bytes as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // A signal (Ctrl-C stopping the collector) is not a failed trace: try again.
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The writer thread's file: whole records at known offsets, a reserve, and the failure.
struct Writer {
    trace: TraceFile,
    /// Whole records built but not written yet.
    pending: Vec<u8>,
    /// The chunks and ConnClose records in `pending`: where each ends in `pending`, its
    /// connection, bytes and events (counted as unwritten if it is not written).
    pending_chunks: Vec<(usize, u32, u64, u64)>,
    /// Bytes of the file that are whole records.
    written: u64,
    /// `fallocate` works here (it does on ext4, xfs, btrfs, tmpfs).
    can_reserve: bool,
    failed: Option<Failure>,
    /// All connections together: what could not be written.
    unwritten: Unwritten,
    shared: SharedFailure,
    /// What each ended connection's process made (see `WriterMsg::Made`).
    made: FxHashMap<u32, ConnMade>,
}

impl Writer {
    fn chunk(&mut self, conn: u32, bytes: &[u8], events: u64, compress: bool) {
        if self.failed.is_some() {
            self.count_unwritten(conn, bytes.len() as u64, events);
        } else {
            trace_file::append_chunk(&mut self.pending, conn, bytes, compress);
            self.pending_chunks
                .push((self.pending.len(), conn, bytes.len() as u64, events));
        }
    }

    /// A connection's ConnClose record; counted as unwritten like a chunk (no bytes, no
    /// events), so that a connection whose end is lost is told so.
    fn close(&mut self, conn: u32, reason: CloseReason, msg: &str) {
        if self.failed.is_some() {
            self.count_unwritten(conn, 0, 0);
        } else {
            let _ = trace_file::write_conn_close(&mut self.pending, conn, now_ns(), reason, msg);
            self.pending_chunks.push((self.pending.len(), conn, 0, 0));
        }
    }

    fn count_unwritten(&mut self, conn: u32, bytes: u64, events: u64) {
        self.unwritten.add(bytes, events);
        if let Ok(mut s) = self.shared.lock() {
            s.unwritten.entry(conn).or_default().add(bytes, events);
        }
    }

    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if self.failed.is_some() {
            self.drop_pending();
            return;
        }
        let len = self.pending.len() as u64;
        if self.can_reserve {
            if let Err(e) = reserve(&self.trace.file, self.written, len + RESERVE) {
                if !out_of_room(&e) {
                    self.can_reserve = false;
                } else {
                    // No room for all of it: as many whole records as fit, each with the
                    // reserve kept behind it. The file still ends on a whole record, with
                    // room for the Incomplete record.
                    let done = self.write_what_fits();
                    self.pending.drain(..done);
                    self.pending_chunks.retain(|&(end, ..)| end > done);
                    self.fail(e, false);
                    return;
                }
            }
        }
        match self.trace.file.write_all_at(&self.pending, self.written) {
            Ok(()) => {
                self.written += len;
                self.pending.clear();
                self.pending_chunks.clear();
            }
            Err(e) => self.fail(e, true),
        }
    }

    /// Writes the whole records at the start of `pending` that fit with the reserve behind
    /// them; returns the bytes of `pending` written.
    fn write_what_fits(&mut self) -> usize {
        let mut done = 0usize;
        while let Some(head) = self.pending.get(done..done + 4) {
            let mut len = [0u8; 4];
            len.copy_from_slice(head);
            let end = done + 4 + u32::from_le_bytes(len) as usize;
            let Some(record) = self.pending.get(done..end) else {
                break;
            };
            if reserve(
                &self.trace.file,
                self.written,
                record.len() as u64 + RESERVE,
            )
            .is_err()
            {
                break;
            }
            if self.trace.file.write_all_at(record, self.written).is_err() {
                let _ = self.trace.file.set_len(self.written);
                break;
            }
            self.written += record.len() as u64;
            done = end;
        }
        done
    }

    /// Counts what `pending` held as not written.
    fn drop_pending(&mut self) {
        for (_, conn, bytes, events) in std::mem::take(&mut self.pending_chunks) {
            self.count_unwritten(conn, bytes, events);
        }
        self.pending.clear();
    }

    fn fail(&mut self, e: io::Error, cut_back: bool) {
        if cut_back {
            // A half-written record would read as a killed writer: end on the last whole one.
            let _ = self.trace.file.set_len(self.written);
        }
        let failure = Failure {
            cause: WriteFailure::of(&e),
            error: WriteFailure::message(&e),
            path: self.trace.path().to_path_buf(),
            t_unix_ns: now_ns(),
        };
        if let Ok(mut s) = self.shared.lock() {
            s.failure = Some(failure.clone());
        }
        self.failed = Some(failure);
        self.drop_pending();
        // Said at once, so a collector killed later still leaves the reason in the file.
        self.write_incomplete(None);
    }

    /// The trace now has its final name: a failure names that.
    fn placed(&mut self) {
        let path = self.trace.path().to_path_buf();
        if let Some(f) = &mut self.failed {
            f.path = path.clone();
        }
        if let Ok(mut s) = self.shared.lock() {
            if let Some(f) = &mut s.failure {
                f.path = path;
            }
        }
    }

    /// The Incomplete record (and the End, at the finish) in the reserved room after the
    /// last whole record; rewritten in place with the final counts at the finish (same
    /// length: the counts are fixed-size), so it never needs room the reserve lacks.
    fn write_incomplete(&mut self, end_conns: Option<u32>) {
        let Some(failure) = &self.failed else { return };
        // What made each process some of whose records are not in the file: a reader then
        // counts its missing events exactly.
        let mut made: Vec<ConnMade> = match self.shared.lock() {
            Ok(s) => s
                .unwritten
                .keys()
                .filter_map(|conn| self.made.get(conn).copied())
                .collect(),
            Err(_) => Vec::new(),
        };
        made.sort_unstable_by_key(|m| m.conn);
        let mut tail = Vec::new();
        let _ = trace_file::write_incomplete(
            &mut tail,
            failure.t_unix_ns,
            failure.cause,
            self.unwritten.bytes,
            self.unwritten.events,
            &failure.error,
            &made,
        );
        if let Some(conns) = end_conns {
            let _ = trace_file::write_end(&mut tail, now_ns(), conns);
        }
        if self.trace.file.write_all_at(&tail, self.written).is_err() {
            // No room even for that: the file ends on its last whole record.
            let _ = self.trace.file.set_len(self.written);
        }
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What the writer thread leaves: where the trace is, if anywhere, and what went wrong.
pub struct Written {
    /// None when no process ever connected (the temporary file was removed), or when the
    /// trace vanished and no copy could be saved (`vanished`).
    pub path: Option<PathBuf>,
    pub failure: Option<Failure>,
    /// All connections together: what could not be written.
    pub unwritten: Unwritten,
    /// The trace's name was gone at the end; `path` is the saved copy, if any.
    pub vanished: Option<Vanished>,
}

/// The writer thread: records from the connections into the file, flushed at least every
/// 100 ms so the trace is readable while it is written.
pub fn write_loop(
    trace: TraceFile,
    rx: Receiver<WriterMsg>,
    compress: bool,
    shared: SharedFailure,
) -> Written {
    let written = trace.header_len;
    let mut w = Writer {
        trace,
        pending: Vec::with_capacity(1 << 20),
        pending_chunks: Vec::new(),
        written,
        can_reserve: true,
        failed: None,
        unwritten: Unwritten::default(),
        shared,
        made: FxHashMap::default(),
    };
    let mut conns = 0u32;
    let mut last_flush = Instant::now();
    loop {
        let msg = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => Some(m),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        };
        match msg {
            Some(WriterMsg::Open(conn)) => {
                // Once: a trace that could not be placed is not tried again for every process.
                if w.trace.placed.is_none() && w.failed.is_none() {
                    match w.trace.place() {
                        Ok(_) => w.placed(),
                        Err(e) => w.fail(e, false),
                    }
                }
                conns += 1;
                let _ =
                    trace_file::write_conn_open(&mut w.pending, conn, now_ns(), wire::WIRE_VERSION);
            }
            Some(WriterMsg::Chunk(conn, bytes, events)) => {
                w.chunk(conn, &bytes, events, compress);
                // Chunks flowing: take the next ones together after a pause rather than wait
                // for each (a wait spins, yields, sleeps, and its sender must wake it: on two
                // cores, time taken from the traced program). The queue holds far more than
                // a pause's worth of a connection's reads, so no sender waits for it.
                if rx.is_empty() {
                    std::thread::sleep(BATCH_PAUSE);
                }
            }
            Some(WriterMsg::Close(conn, reason, msg)) => w.close(conn, reason, &msg),
            Some(WriterMsg::Made(m)) => {
                w.made.insert(m.conn, m);
            }
            Some(WriterMsg::Sync(ack)) => {
                w.write_pending();
                last_flush = Instant::now();
                let _ = ack.send(());
            }
            None => {}
        }
        if w.pending.len() >= 1 << 20 || last_flush.elapsed() >= Duration::from_millis(100) {
            w.write_pending();
            last_flush = Instant::now();
        }
    }
    if w.trace.placed.is_none() {
        // Nobody came (or the file could not be moved into place): dropping the TraceFile
        // removes the temporary file, which is ours.
        return Written {
            path: None,
            failure: w.failed,
            unwritten: w.unwritten,
            vanished: None,
        };
    }
    if w.failed.is_none() {
        let _ = trace_file::write_end(&mut w.pending, now_ns(), conns);
        w.write_pending();
    }
    if w.failed.is_some() {
        w.drop_pending();
        w.write_incomplete(Some(conns));
    }
    let vanished = w.trace.keep_if_vanished();
    Written {
        path: match &vanished {
            Some(Vanished { saved: Err(_), .. }) => None,
            _ => w.trace.placed.clone(),
        },
        failure: w.failed,
        unwritten: w.unwritten,
        vanished,
    }
}

#[cfg(test)]
mod tests;
