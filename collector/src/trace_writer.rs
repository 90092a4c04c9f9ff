//! The collector's trace file, from the first byte to the last: where it may be written, how
//! it comes into being, and what happens when the disk fills up.
//!
//! - **Only regular files.** An output that exists and is a symlink, a directory, a device, a
//!   FIFO or a socket is refused before anything runs ([`check_output`]): oomtrace never
//!   writes through a link and never replaces what it did not create.
//! - **Nothing until there is something to write.** The trace is created under a temporary
//!   name beside the output (`.NAME.oomtrace-PID.tmp`, exclusive, 0600) when the collector
//!   starts, so an unwritable directory fails at once; it is moved into place when the first
//!   traced process connects (rename; with no-clobber, a hard link to the first free name, so
//!   an existing file is never replaced), and removed if none ever does: a program that never
//!   touches CUDA leaves no file.
//! - **Whole records, and room for the last word.** Records are built in memory and written
//!   whole at known offsets. Before each write the writer reserves the bytes it is about to
//!   write plus [`RESERVE`] past the end of the file (`fallocate` with `KEEP_SIZE`); when the
//!   disk is full the reservation fails first, the file still ends on a whole record, and the
//!   reserved room holds an `Incomplete` record (the cause, the bytes not written) and the
//!   `End`. From then on records are counted, not written, so the connections are never held
//!   back. On a filesystem without `fallocate` the same happens on the failed write itself
//!   (the file is cut back to the last whole record), as room allows.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use oomtrace_proto::trace_file::{self, CloseReason, WriteFailure};
use oomtrace_proto::wire;

/// Room kept allocated past the end of the file for the `Incomplete` and `End` records.
pub const RESERVE: u64 = 64 << 10;

/// What the connections send the writer thread.
pub enum WriterMsg {
    Open(u32),
    Chunk(u32, Vec<u8>),
    Close(u32, CloseReason, String),
    /// Flush to the OS, then acknowledge.
    Sync(Sender<()>),
}

/// Why the trace could not be written whole, shared with the connections (each tells its
/// process) and the accept loop (which says it once).
#[derive(Clone, Debug)]
pub struct Failure {
    pub cause: WriteFailure,
    pub error: String,
    /// Where the trace is (the name it was given when placed).
    pub path: PathBuf,
}

impl Failure {
    /// One line for a user: what was lost and why.
    pub fn line(&self) -> String {
        format!(
            "the trace {} is incomplete: {} ({}); events from then on were not written",
            self.path.display(),
            self.cause.words(),
            self.error
        )
    }
}

pub type SharedFailure = Arc<Mutex<Option<Failure>>>;

/// Refuses an output that exists and is not a regular file (see the module comment).
pub fn check_output(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(m) => {
            let t = m.file_type();
            let what = if t.is_file() {
                return Ok(());
            } else if t.is_symlink() {
                "a symbolic link (oomtrace does not write through links: name its target)"
            } else if t.is_dir() {
                "a directory"
            } else if t.is_fifo() {
                "a FIFO, not a regular file"
            } else if t.is_char_device() {
                "a character device, not a regular file"
            } else if t.is_block_device() {
                "a block device, not a regular file"
            } else if t.is_socket() {
                "a socket, not a regular file"
            } else {
                "not a regular file"
            };
            Err(format!("it is {what}"))
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
}

impl TraceFile {
    /// Creates the temporary file beside `dest` (see the module comment).
    pub fn create(dest: &Path, no_clobber: bool) -> io::Result<TraceFile> {
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
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
            {
                Ok(file) => {
                    return Ok(TraceFile {
                        file,
                        tmp,
                        dest: dest.to_path_buf(),
                        no_clobber,
                        placed: None,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
    }

    /// Moves the file to its name; returns the path used.
    fn place(&mut self) -> io::Result<PathBuf> {
        if let Some(p) = &self.placed {
            return Ok(p.clone());
        }
        let path = if self.no_clobber {
            self.link_to_free_name()?
        } else {
            // Checked again: something may have appeared there since the collector started.
            match check_output(&self.dest) {
                Ok(()) => {
                    std::fs::rename(&self.tmp, &self.dest)?;
                    self.dest.clone()
                }
                Err(_) => self.link_to_free_name()?,
            }
        };
        self.placed = Some(path.clone());
        Ok(path)
    }

    /// `link` never replaces an existing name: the first of `dest`, `dest.1`, ... that is free.
    fn link_to_free_name(&self) -> io::Result<PathBuf> {
        let mut candidate = self.dest.clone();
        for n in 1..10_000 {
            match std::fs::hard_link(&self.tmp, &candidate) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&self.tmp);
                    return Ok(candidate);
                }
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

/// The writer thread's file: whole records at known offsets, a reserve, and the failure.
struct Writer {
    trace: TraceFile,
    /// Whole records built but not written yet.
    pending: Vec<u8>,
    /// Bytes of the file that are whole records.
    written: u64,
    /// `fallocate` works here (it does on ext4, xfs, btrfs, tmpfs).
    can_reserve: bool,
    failed: Option<Failure>,
    /// Bytes of records received after the failure (or lost in it).
    unwritten: u64,
    shared: SharedFailure,
}

impl Writer {
    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if self.failed.is_some() {
            self.unwritten += self.pending.len() as u64;
            self.pending.clear();
            return;
        }
        let len = self.pending.len() as u64;
        if self.can_reserve {
            if let Err(e) = self.reserve(len + RESERVE) {
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    self.can_reserve = false;
                } else {
                    // Nothing written: the file still ends on a whole record, and the room
                    // reserved last time is still there for the Incomplete record.
                    self.fail(e, false);
                    return;
                }
            }
        }
        match self.trace.file.write_all_at(&self.pending, self.written) {
            Ok(()) => {
                self.written += len;
                self.pending.clear();
            }
            Err(e) => self.fail(e, true),
        }
    }

    /// Keeps `[written, written + bytes)` allocated without changing the file's size.
    fn reserve(&self, bytes: u64) -> io::Result<()> {
        // SAFETY: fallocate on our own open file; KEEP_SIZE leaves its size unchanged.
        let rc = unsafe {
            libc::fallocate(
                self.trace.file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                self.written as libc::off_t,
                bytes as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn fail(&mut self, e: io::Error, cut_back: bool) {
        if cut_back {
            // A half-written record would read as a killed writer: end on the last whole one.
            let _ = self.trace.file.set_len(self.written);
        }
        self.unwritten += self.pending.len() as u64;
        self.pending.clear();
        let failure = Failure {
            cause: WriteFailure::of(&e),
            error: e.to_string(),
            path: self.trace.path().to_path_buf(),
        };
        if let Ok(mut f) = self.shared.lock() {
            *f = Some(failure.clone());
        }
        self.failed = Some(failure);
        // Said at once, so a collector killed later still leaves the reason in the file.
        self.write_incomplete(None);
    }

    /// The Incomplete record (and the End, at the finish) in the reserved room after the
    /// last whole record; rewritten with the final count at the finish.
    fn write_incomplete(&mut self, end_conns: Option<u32>) {
        let Some(failure) = &self.failed else { return };
        let mut tail = Vec::new();
        let _ = trace_file::write_incomplete(
            &mut tail,
            now_ns(),
            failure.cause,
            self.unwritten,
            &failure.error,
        );
        if let Some(conns) = end_conns {
            let _ = trace_file::write_end(&mut tail, now_ns(), conns);
        }
        let _ = self.trace.file.set_len(self.written);
        let _ = self.trace.file.write_all_at(&tail, self.written);
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
    /// None when no process ever connected (the temporary file was removed).
    pub path: Option<PathBuf>,
    pub failure: Option<Failure>,
}

/// The writer thread: records from the connections into the file, flushed at least every
/// 100 ms so the trace is readable while it is written.
pub fn write_loop(
    trace: TraceFile,
    producer: &str,
    rx: Receiver<WriterMsg>,
    compress: bool,
    shared: SharedFailure,
) -> Written {
    let mut w = Writer {
        trace,
        pending: Vec::with_capacity(1 << 20),
        written: 0,
        can_reserve: true,
        failed: None,
        unwritten: 0,
        shared,
    };
    let _ = trace_file::write_header(&mut w.pending, now_ns(), producer);
    w.write_pending();
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
                if conns == 0 && w.trace.placed.is_none() {
                    if let Err(e) = w.trace.place() {
                        w.fail(e, false);
                    }
                }
                conns += 1;
                let _ =
                    trace_file::write_conn_open(&mut w.pending, conn, now_ns(), wire::WIRE_VERSION);
            }
            Some(WriterMsg::Chunk(conn, bytes)) => {
                if w.failed.is_some() {
                    w.unwritten += bytes.len() as u64;
                } else {
                    let _ = trace_file::write_chunk(&mut w.pending, conn, &bytes, compress);
                }
            }
            Some(WriterMsg::Close(conn, reason, msg)) => {
                let _ = trace_file::write_conn_close(&mut w.pending, conn, now_ns(), reason, &msg);
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
        };
    }
    if w.failed.is_some() {
        w.write_pending();
        w.write_incomplete(Some(conns));
    } else {
        let _ = trace_file::write_end(&mut w.pending, now_ns(), conns);
        w.write_pending();
        if w.failed.is_some() {
            w.write_incomplete(Some(conns));
        }
    }
    Written {
        path: w.trace.placed.clone(),
        failure: w.failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "oomtrace-writer-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn outputs_that_are_not_regular_files_are_refused() {
        let d = scratch("refuse");
        std::fs::write(d.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("file"), d.join("link")).unwrap();
        assert!(check_output(&d.join("file")).is_ok());
        assert!(check_output(&d.join("new")).is_ok());
        assert!(check_output(&d.join("link"))
            .unwrap_err()
            .contains("symbolic link"));
        assert!(check_output(&d).unwrap_err().contains("directory"));
        assert!(check_output(Path::new("/dev/null"))
            .unwrap_err()
            .contains("character device"));
        assert!(TraceFile::create(&d.join("link"), false).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_file_appears_at_the_first_connection_and_never_replaces_with_no_clobber() {
        let d = scratch("place");
        let dest = d.join("t.oomt");
        std::fs::write(&dest, b"someone's").unwrap();
        let (tx, rx) = crossbeam_channel::bounded(8);
        let shared = SharedFailure::default();
        let tf = TraceFile::create(&dest, true).unwrap();
        let h = std::thread::spawn(move || write_loop(tf, "test", rx, false, shared));
        tx.send(WriterMsg::Open(1)).unwrap();
        drop(tx);
        let written = h.join().unwrap();
        assert_eq!(written.path, Some(d.join("t.1.oomt")));
        assert_eq!(std::fs::read(&dest).unwrap(), b"someone's");
        let t = crate::trace::Trace::load(&d.join("t.1.oomt")).unwrap();
        assert!(t.complete);
        // Nobody connects: nothing is left, not even the temporary file.
        let (tx, rx) = crossbeam_channel::bounded(8);
        let tf = TraceFile::create(&d.join("u.oomt"), false).unwrap();
        let h = std::thread::spawn(move || write_loop(tf, "test", rx, false, Default::default()));
        drop(tx);
        assert_eq!(h.join().unwrap().path, None);
        let mut left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["t.1.oomt", "t.oomt"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
