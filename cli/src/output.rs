//! Files the user names on the command line (`export -o OUT`, `run --json FILE`), written so
//! that a failure never destroys anything oomtrace did not create:
//!
//! - `-`: standard output. A reader that goes away (`| head`: EPIPE) ends the output quietly
//!   and the command still succeeds (what it had to say was read as far as anyone wanted);
//!   any other error (a full disk, `> /dev/full`) is one line and exit 2.
//! - A path that does not exist, or a regular file: the bytes go to a new temporary file in
//!   the same directory (`.NAME.oomtrace-PID-N.tmp`, created exclusively: never through an
//!   existing file or link), which is flushed, synced and renamed over the path only once
//!   everything was written. On any failure that temporary file, which this run created, is
//!   removed, and an existing file at the path is left exactly as it was. A replaced file
//!   keeps its permission bits; a new one is 0600, like the trace: reports, views and exports
//!   hold the traced command line (`--api-key=...` included), paths and environment-derived
//!   settings, which other users must not read.
//! - A symbolic link to a regular file (or to nothing): refused in one line; the link is
//!   neither followed nor removed (writing through it would change a file the user did not
//!   name, replacing it would lose the link). A link to a device or a pipe (`/dev/stdout`,
//!   `/proc/self/fd/1`) is written into like the device itself.
//! - Anything else that exists (a character device such as `/dev/null`, a FIFO): written
//!   straight into, as asked, and never removed: it is not ours (as root, removing
//!   `/dev/full` after a failed write deleted the device node).
//! - A name oomtrace chose itself (`view` and `export` without `-o`): [`Output::create_new`]
//!   writes it only if nothing is there, at the start and at the end (the temporary file is
//!   linked to the name, which fails if something appeared meanwhile): oomtrace never replaces
//!   a file it was not told to.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::Failure;

/// Writes `bytes` to the user-named `path` by the rules above (`-`: standard output).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let mut out = Output::create(path)?;
    // The error, if any, is kept by `out` and reported by `finish` in its own words.
    let _ = out.write_all(bytes);
    out.finish()
}

/// A user-named output being written (see the module comment). Call [`Output::finish`] when
/// everything is written; dropped without it, an unfinished temporary file is removed.
pub struct Output {
    sink: Sink,
    /// What is written, for messages about standard output ("the report").
    what: &'static str,
    /// The first write error, kept so that the message names the destination whatever layer
    /// of the caller saw it first.
    error: Option<io::Error>,
}

enum Sink {
    Stdout(BufWriter<Stdout>),
    /// A temporary file renamed to `dest` by `finish`; `None` once renamed or removed.
    Temp {
        file: Option<BufWriter<File>>,
        tmp: PathBuf,
        dest: PathBuf,
        /// Whether an existing `dest` may be replaced (false for a name oomtrace chose).
        replace: bool,
    },
    /// An existing file that is not a regular one (a device, a FIFO), written in place.
    Direct {
        file: BufWriter<File>,
        path: PathBuf,
    },
}

/// Standard output that notices its reader going away.
struct Stdout {
    inner: io::Stdout,
    reader_gone: bool,
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.reader_gone {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                // Nobody reads any more: swallow the rest so the command ends normally.
                self.reader_gone = true;
                Ok(buf.len())
            }
            r => r,
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        if self.reader_gone {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.reader_gone = true;
                Ok(())
            }
            r => r,
        }
    }
}

impl Output {
    /// Standard output (for `-` and for commands that print their result).
    pub fn stdout() -> Output {
        Output {
            sink: Sink::Stdout(BufWriter::with_capacity(
                1 << 16,
                Stdout {
                    inner: io::stdout(),
                    reader_gone: false,
                },
            )),
            what: "the output",
            error: None,
        }
    }

    /// Names what is written, for messages about standard output (`cannot write the report
    /// to standard output: ...`).
    pub fn named(mut self, what: &'static str) -> Output {
        self.what = what;
        self
    }

    /// Opens the user-named `path` for writing (`-`: standard output). Nothing at `path`
    /// changes until [`Output::finish`] (except for a device or FIFO, which is written into).
    pub fn create(path: &Path) -> Result<Output, Failure> {
        if path.as_os_str() == "-" {
            return Ok(Output::stdout());
        }
        let cannot = |e: &dyn std::fmt::Display| {
            Failure::new(format!("cannot write {}: {e}", path.display()))
        };
        let existing = match std::fs::symlink_metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(cannot(&e)),
        };
        // A link to a device or a pipe (`/dev/stdout`, `/dev/stderr`, `/proc/self/fd/N`) is
        // written into like the device itself: nothing is renamed or removed, so the link and
        // what it points to both survive, and that is what the user meant.
        let target_of_link = existing
            .as_ref()
            .filter(|m| m.file_type().is_symlink())
            .and_then(|_| std::fs::metadata(path).ok())
            .filter(|t| !t.is_file() && !t.is_dir());
        let follow = if target_of_link.is_some() {
            0
        } else {
            libc::O_NOFOLLOW
        };
        let existing = target_of_link.or(existing);
        let sink = match existing {
            Some(m) if m.file_type().is_symlink() => {
                return Err(Failure::new(format!(
                    "{} is a symbolic link: oomtrace does not write through links (name the \
                     file it points to, another path, or - for standard output)",
                    path.display()
                )));
            }
            Some(m) if m.is_dir() => return Err(cannot(&"it is a directory")),
            Some(m) if !m.file_type().is_file() => {
                // A device or FIFO: write into it as asked; never create, truncate or remove.
                let what = oomtrace_proto::host::file_kind::describe(&m.file_type());
                let f = OpenOptions::new()
                    .write(true)
                    .custom_flags(follow | libc::O_NOCTTY)
                    .open(path)
                    .map_err(|e| cannot(&format!("{e} (it is {what})")))?;
                Sink::Direct {
                    file: BufWriter::with_capacity(1 << 20, f),
                    path: path.to_path_buf(),
                }
            }
            existing => {
                let mode = existing.map(|m| m.permissions().mode() & 0o7777);
                let (f, tmp) = create_temp(path, mode).map_err(|e| cannot(&e))?;
                Sink::Temp {
                    file: Some(BufWriter::with_capacity(1 << 20, f)),
                    tmp,
                    dest: path.to_path_buf(),
                    replace: true,
                }
            }
        };
        Ok(Output {
            sink,
            what: "the output",
            error: None,
        })
    }

    /// Opens `path`, a name oomtrace chose (a default beside the input), for writing only if
    /// nothing is there: an existing file, link or anything else is refused in one line, now
    /// and when the output is finished.
    pub fn create_new(path: &Path) -> Result<Output, Failure> {
        ensure_free(path)?;
        let (f, tmp) = create_temp(path, None)
            .map_err(|e| Failure::new(format!("cannot write {}: {e}", path.display())))?;
        Ok(Output {
            sink: Sink::Temp {
                file: Some(BufWriter::with_capacity(1 << 20, f)),
                tmp,
                dest: path.to_path_buf(),
                replace: false,
            },
            what: "the output",
            error: None,
        })
    }

    /// Standard output's reader went away (EPIPE): the rest was dropped on purpose.
    pub fn reader_gone(&self) -> bool {
        match &self.sink {
            Sink::Stdout(w) => w.get_ref().reader_gone,
            _ => false,
        }
    }

    /// The first write error seen so far, in the words [`Output::finish`] would use.
    pub fn failure(&self) -> Option<Failure> {
        self.error.as_ref().map(|e| self.failed(e))
    }

    fn failed(&self, e: &io::Error) -> Failure {
        match &self.sink {
            Sink::Stdout(_) => Failure::new(format!(
                "cannot write {} to standard output: {e}",
                self.what
            )),
            Sink::Temp { dest: p, .. } | Sink::Direct { path: p, .. } => {
                Failure::new(format!("cannot write {}: {e}", p.display()))
            }
        }
    }

    /// Flushes everything; for a regular file, syncs the temporary file and renames it into
    /// place. On failure nothing oomtrace did not create is touched (see the module comment).
    pub fn finish(mut self) -> Result<(), Failure> {
        if let Some(e) = self.error.take() {
            return Err(self.failed(&e));
        }
        let r = match &mut self.sink {
            Sink::Stdout(w) => w.flush(),
            Sink::Direct { file, .. } => file.flush(),
            Sink::Temp {
                file,
                tmp,
                dest,
                replace,
            } => match file.take() {
                None => Ok(()),
                Some(w) => commit(w, tmp, dest, *replace).map(|()| {
                    // Renamed: the name is no longer ours to remove.
                    *tmp = PathBuf::new();
                }),
            },
        };
        r.map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                if let Sink::Temp { dest, .. } = &self.sink {
                    return exists(dest);
                }
            }
            self.failed(&e)
        })
    }
}

/// The default output of a command reading `input` (a trace): beside it, its name without
/// `.oomt`, then `suffix` (`run.oomt`, `.html`: `run.html`).
pub fn beside(input: &Path, suffix: &str) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let name = input.file_name().unwrap_or(input.as_os_str()).as_bytes();
    let stem = name.strip_suffix(b".oomt").unwrap_or(name);
    let mut file = std::ffi::OsStr::from_bytes(stem).to_os_string();
    file.push(suffix);
    input.with_file_name(file)
}

/// Ok if nothing is at `path` (a default output name oomtrace chose), else the one line that
/// refuses it.
pub fn ensure_free(path: &Path) -> Result<(), Failure> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Err(exists(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Failure::new(format!(
            "cannot write {}: {e}",
            path.display()
        ))),
    }
}

/// A default output name that is taken.
fn exists(path: &Path) -> Failure {
    Failure::new(format!(
        "{} exists: oomtrace does not replace a file it was not told to (`-o {}` replaces it, \
         `-o OUT` writes elsewhere)",
        path.display(),
        path.display()
    ))
}

/// Flush, sync (a full disk or an I/O error may only show here) and rename into place; the
/// temporary file is removed by `Output`'s drop if any step fails. Without `replace`, the
/// temporary file is linked to `dest` (which fails if anything is there) and then removed.
fn commit(w: BufWriter<File>, tmp: &Path, dest: &Path, replace: bool) -> io::Result<()> {
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    drop(f);
    if replace {
        return std::fs::rename(tmp, dest);
    }
    match std::fs::hard_link(tmp, dest) {
        Ok(()) => {
            // The name holds the file now; the temporary name goes (Drop would try too).
            let _ = std::fs::remove_file(tmp);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(e),
        // A file system without hard links: the check at the start stands.
        Err(_) if std::fs::symlink_metadata(dest).is_err() => std::fs::rename(tmp, dest),
        Err(_) => Err(io::ErrorKind::AlreadyExists.into()),
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let r = match &mut self.sink {
            Sink::Stdout(w) => w.write(buf),
            Sink::Direct { file, .. } => file.write(buf),
            Sink::Temp { file: Some(w), .. } => w.write(buf),
            Sink::Temp { file: None, .. } => Err(io::Error::other("the output is closed")),
        };
        self.keep(r)
    }
    fn flush(&mut self) -> io::Result<()> {
        let r = match &mut self.sink {
            Sink::Stdout(w) => w.flush(),
            Sink::Direct { file, .. } => file.flush(),
            Sink::Temp { file: Some(w), .. } => w.flush(),
            Sink::Temp { file: None, .. } => Ok(()),
        };
        self.keep(r)
    }
}

impl Output {
    fn keep<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            if self.error.is_none() {
                self.error = Some(io::Error::new(e.kind(), e.to_string()));
            }
        }
        r
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Sink::Temp { file, tmp, .. } = &mut self.sink {
            if let Some(w) = file.take() {
                // Unfinished: the temporary file is ours, and only it goes. Its buffered tail
                // is thrown away, not written (it would only be removed).
                let (f, _) = w.into_parts();
                drop(f);
                let _ = std::fs::remove_file(tmp);
            } else if !tmp.as_os_str().is_empty() {
                // A commit that failed before its rename.
                let _ = std::fs::remove_file(&*tmp);
            }
        }
    }
}

/// A new, exclusively created temporary file next to `dest` (same file system, so the final
/// rename is atomic), with `mode` when replacing a file (else 0666 less the umask).
fn create_temp(dest: &Path, mode: Option<u32>) -> io::Result<(File, PathBuf)> {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = dest
        .file_name()
        .ok_or_else(|| io::Error::other("not a file name"))?
        .to_string_lossy()
        .into_owned();
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.oomtrace-{}-{n}.tmp", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            // Private: what oomtrace writes holds the traced command line (see the module
            // comment); a file it replaces gets its old bits back below.
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
        {
            Ok(f) => {
                if let Some(mode) = mode {
                    if let Err(e) = f.set_permissions(std::fs::Permissions::from_mode(mode)) {
                        drop(f);
                        let _ = std::fs::remove_file(&tmp);
                        return Err(e);
                    }
                }
                return Ok((f, tmp));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 10_000 => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_default_output_goes_beside_the_trace() {
        use std::path::Path;
        let beside = super::beside;
        assert_eq!(beside(Path::new("t.oomt"), ".html"), Path::new("t.html"));
        assert_eq!(
            beside(Path::new("/runs/a.b.oomt"), ".chrome.json"),
            Path::new("/runs/a.b.chrome.json")
        );
        assert_eq!(
            beside(Path::new("dir/trace"), ".html"),
            Path::new("dir/trace.html")
        );
    }

    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("oomt-output-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_file_appears_whole_or_not_at_all() {
        let d = dir("whole");
        let out = d.join("out.json");
        write_file(&out, b"first").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"first");
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        // Unfinished: the old file stays, the temporary file goes.
        let mut o = Output::create(&out).unwrap();
        o.write_all(b"half").unwrap();
        drop(o);
        assert_eq!(std::fs::read(&out).unwrap(), b"first");
        write_file(&out, b"second").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"second");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "a replaced file keeps its permissions");
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.json"], "no temporary file left");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn links_are_refused_and_kept() {
        let d = dir("link");
        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write_file(&link, b"new").unwrap_err();
        assert!(e.message.contains("symbolic link"), "{}", e.message);
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let _ = std::fs::remove_dir_all(&d);
    }
}
