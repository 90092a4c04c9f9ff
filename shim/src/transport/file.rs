//! The shim's own trace file, written when no collector can run: the same format a
//! collector writes, whole records only, cut back to the last whole record on a full disk.
//! Its descriptor is the shim's own (`fd_guard.rs`); if the program closes or replaces it, the
//! file is opened again by its name, provided the name still leads to the very file the shim
//! created (device and inode), and nothing is lost.

use std::os::fd::OwnedFd;
use std::path::Path;

use oomtrace_proto::trace_file;

use super::fd_guard::{is_taken, taken_error, Owned};
use crate::{clock, log};

/// The trace file the shim writes itself when no collector can run: whole records at known
/// offsets, and room reserved past the end (as the collector does, see
/// collector/src/trace_writer.rs), so that when the disk fills up the file still ends on a
/// whole record followed by an `Incomplete` record that says why.
pub(super) struct DirectFile {
    file: Owned,
    pub(super) path: String,
    /// Bytes of the file that are whole records.
    written: u64,
    /// `fallocate` works on this filesystem.
    can_reserve: bool,
    /// What the `Incomplete` record says, once a write failed.
    failure: Option<DirectFailure>,
}

/// Why and when the direct file stops, and what was lost (see [`DirectFile::failed`]).
struct DirectFailure {
    t_unix_ns: u64,
    cause: trace_file::WriteFailure,
    message: String,
    lost_bytes: u64,
    lost_events: u64,
    /// What the process made, once known (at exit).
    made: Option<trace_file::ConnMade>,
}

/// A direct file whose write failed, kept open until exit so that its `Incomplete` record can
/// then count every event lost since (not only the failed write's): the pid that wrote it,
/// the file, and the events counted lost before the failure. Only the drain thread of that
/// process touches it; a fork child sees another pid and leaves it alone, and `try_lock`
/// never waits on a lock that a fork copied while held.
static FAILED_DIRECT: std::sync::Mutex<Option<(u32, DirectFile, u64)>> =
    std::sync::Mutex::new(None);

pub(super) fn keep_failed_direct(pid: u32, file: DirectFile, lost_before: u64) {
    if let Ok(mut kept) = FAILED_DIRECT.try_lock() {
        *kept = Some((pid, file, lost_before));
    }
}

/// At exit: the failed direct file's last record counts all that was lost since its failure
/// and what the process made (so a reader counts exactly what is missing). Returns the one
/// line to print, with the one number that is final only now: the events of this process
/// that are not in the file (`lost_now`). Said once, at exit, rather than at the failure with
/// a count that would keep growing.
pub(super) fn finish_failed_direct(
    pid: u32,
    lost_now: u64,
    made: trace_file::ConnMade,
) -> Option<String> {
    let mut kept = FAILED_DIRECT.try_lock().ok()?;
    if kept.as_ref().is_none_or(|(p, _, _)| *p != pid) {
        return None;
    }
    let (_, mut file, before) = kept.take()?;
    file.recount(lost_now.saturating_sub(before), made);
    let f = file.failure.as_ref()?;
    Some(format!(
        "the trace {} is incomplete: {} ({}); {lost_now} events not written (the program went \
         on untraced)",
        file.path,
        f.cause.words(),
        f.message
    ))
}

/// Room kept allocated past the end of the direct file for the `Incomplete` and `End` records.
const DIRECT_RESERVE: u64 = 16 << 10;

impl DirectFile {
    /// Creates the file: `path`, or the first free numbered name beside it (a trace is never
    /// overwritten), with its first records. A file that cannot take them is removed: it is
    /// ours and holds nothing.
    pub(super) fn create(
        wanted: &Path,
        first: &[u8],
    ) -> Result<DirectFile, (String, std::io::Error)> {
        let (file, path) = Owned::create(|| {
            trace_file::create_new(wanted).map(|(f, path)| (OwnedFd::from(f), path))
        })
        .map_err(|e| (wanted.display().to_string(), e))?;
        let mut d = DirectFile {
            file,
            path: path.display().to_string(),
            written: 0,
            can_reserve: true,
            failure: None,
        };
        let result = d
            .reserve(first.len() as u64)
            .and_then(|_| d.write_all_at(first, 0));
        if let Err(e) = result {
            let _ = std::fs::remove_file(&path);
            return Err((d.path, e));
        }
        d.written = first.len() as u64;
        Ok(d)
    }

    /// Keeps `bytes` plus the reserve allocated after the last whole record, without
    /// changing the file's size. A filesystem without `fallocate` just goes without.
    fn reserve(&mut self, bytes: u64) -> std::io::Result<()> {
        if !self.can_reserve {
            return Ok(());
        }
        let (at, len) = (self.written, bytes + DIRECT_RESERVE);
        let e = loop {
            // SAFETY: fallocate on our own open file; KEEP_SIZE leaves its size unchanged, so
            // a reader never sees the reserved bytes.
            let rc = self.on_file(|fd| unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_KEEP_SIZE,
                    at as libc::off_t,
                    len as libc::off_t,
                ) as isize
            });
            let e = match rc {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            // Interrupted by one of the program's signals: not a failed trace.
            if e.kind() != std::io::ErrorKind::Interrupted {
                break e;
            }
        };
        if is_taken(&e) {
            return Err(e);
        }
        // Only a full disk (or file size limit) is a failure; EOPNOTSUPP, ENOSYS and the like
        // mean no reservations on this filesystem, and a real problem shows in the write.
        if trace_file::WriteFailure::of(&e) == trace_file::WriteFailure::Other {
            self.can_reserve = false;
            return Ok(());
        }
        Err(e)
    }

    pub(super) fn write_record(&mut self, record: &[u8]) -> std::io::Result<()> {
        // A failed reservation writes nothing: the file still ends on a whole record.
        self.reserve(record.len() as u64)?;
        if let Err(e) = self.write_all_at(record, self.written) {
            // Part of the record may be there: cut back to the last whole one.
            self.set_len(self.written);
            return Err(e);
        }
        self.written += record.len() as u64;
        Ok(())
    }

    /// `op` on the file's descriptor (see `Owned::sys`). If the program took the descriptor,
    /// the file is opened again (once) and `op` retried.
    fn on_file(&mut self, op: impl Fn(i32) -> isize) -> std::io::Result<usize> {
        match self.file.sys(&op) {
            Err(e) if is_taken(&e) => {
                self.reopen(e)?;
                self.file.sys(&op)
            }
            r => r,
        }
    }

    /// The program closed or replaced the file's descriptor (`taken`): open the file again by
    /// its name, if the name still leads to the very file this shim created (same device and
    /// inode; never through a link, never a FIFO's wait), and carry on where it was. Err: the
    /// file is gone or another; the trace stops (the caller says so).
    fn reopen(&mut self, taken: std::io::Error) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let was = self.file.identity();
        let path = self.path.clone();
        let (file, ()) = Owned::create(|| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)?;
            Ok((OwnedFd::from(f), ()))
        })
        .map_err(|_| taken)?;
        if file.identity() != was {
            // Ours to close: we just opened it. The trace stops.
            return Err(taken_error(self.file.fd()));
        }
        log::info(&format!(
            "the program closed the shim's descriptor of {}; opened it again",
            self.path
        ));
        self.file = file;
        Ok(())
    }

    /// `pwrite` of all of `buf` at `at`.
    fn write_all_at(&mut self, mut buf: &[u8], mut at: u64) -> std::io::Result<()> {
        while !buf.is_empty() {
            // SAFETY: pwrite of a valid buffer to our own file.
            let r = self.on_file(|fd| unsafe {
                libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), at as libc::off_t)
            });
            match r {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    at += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Cuts the file back to `len` bytes (after a failed write), if it is still ours.
    fn set_len(&mut self, len: u64) {
        // SAFETY: ftruncate of our own file.
        let _ = self.on_file(|fd| unsafe { libc::ftruncate(fd, len as libc::off_t) as isize });
    }

    /// After a failed write: an `Incomplete` record (in the reserved room) says why the trace
    /// stops, then the `End`. What the user hears is said at exit ([`finish_failed_direct`]).
    pub(super) fn failed(&mut self, e: &std::io::Error, lost_bytes: u64, lost_events: u64) {
        self.failure = Some(DirectFailure {
            t_unix_ns: clock::unix_ns(),
            cause: trace_file::WriteFailure::of(e),
            message: trace_file::WriteFailure::message(e),
            lost_bytes,
            lost_events,
            made: None,
        });
        self.write_last_records();
    }

    /// At exit, after a failure: `lost_events` in all were not written; `made`: what the
    /// process made.
    fn recount(&mut self, lost_events: u64, made: trace_file::ConnMade) {
        if let Some(f) = &mut self.failure {
            f.lost_events = f.lost_events.max(lost_events);
            f.made = Some(made);
            self.write_last_records();
        }
    }

    /// The `Incomplete` and `End` records after the last whole record. Always the same length
    /// (the counts are fixed-size), so a rewrite fits where the first one did.
    fn write_last_records(&mut self) {
        let Some(f) = &self.failure else { return };
        let mut rec = Vec::new();
        let _ = trace_file::write_incomplete(
            &mut rec,
            f.t_unix_ns,
            f.cause,
            f.lost_bytes,
            f.lost_events,
            &f.message,
            f.made.as_slice(),
        );
        let _ = trace_file::write_end(&mut rec, clock::unix_ns(), 1);
        if self.write_all_at(&rec, self.written).is_err() {
            // No room even for that: the file ends on its last whole record.
            self.set_len(self.written);
        }
    }
}

/// What `path` is when it exists and is not a regular file (a trace is never written into
/// or beside a device, a FIFO, a directory or a link).
pub(super) fn not_a_regular_file(path: &Path) -> Option<String> {
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    let what = oomtrace_proto::host::file_kind::describe(&t);
    if t.is_file() {
        None
    } else if t.is_symlink() || t.is_dir() {
        Some(what.to_string())
    } else {
        Some(format!("{what}, not a regular file"))
    }
}
