//! `--metrics-textfile PATH`: the metrics in node-exporter's textfile format (the same
//! exposition text), rewritten every [`EVERY`] and once at the end.
//!
//! Atomic: the text goes to a temporary file in the same directory (`.NAME.PID.tmp`, a name
//! node-exporter ignores: it reads `*.prom` only), which is then renamed over PATH, so a reader
//! sees the old file or the new one, never half of one. PATH must be a regular file or
//! nothing: a symlink, a FIFO, a device or a directory there is refused (never followed,
//! never replaced), and a temporary file that could not be completed is removed.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Registry;
use crate::console::Console;

/// How often the file is rewritten.
pub const EVERY: Duration = Duration::from_secs(2);

/// Why PATH cannot be written; one line.
fn refuse(path: &Path, why: impl std::fmt::Display) -> String {
    format!("cannot write metrics to {}: {why}", path.display())
}

/// Writes `text` to `path` atomically (see the module comment).
pub fn write(path: &Path, text: &str) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(path, e)),
        Ok(m) if m.file_type().is_file() => {}
        Ok(m) => {
            return Err(refuse(
                path,
                format!(
                    "it is {}, not a regular file: refusing to replace it",
                    oomtrace_proto::host::file_kind::describe(&m.file_type())
                ),
            ))
        }
    }
    let name = path
        .file_name()
        .ok_or_else(|| refuse(path, "it names no file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    // create_new: never opens (or follows) anything already at the temporary name.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // Readable by node-exporter, which usually runs as another user.
        .mode(0o644)
        .open(&tmp)
        .map_err(|e| refuse(path, format!("{}: {e}", tmp.display())))?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_data());
    drop(file);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(refuse(path, e));
    }
    Ok(())
}

/// The writer thread; [`Textfile::finish`] writes the final values and stops it.
pub struct Textfile {
    path: PathBuf,
    registry: Arc<Registry>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Textfile {
    /// Writes once now (a path that cannot be written is refused here, before anything
    /// runs), then every [`EVERY`] on a thread; a later failure is said once on `console`.
    pub fn start(
        path: PathBuf,
        registry: Arc<Registry>,
        console: Arc<dyn Console>,
    ) -> Result<Textfile, String> {
        write(&path, &registry.render())?;
        let stop = Arc::new(AtomicBool::new(false));
        let (p, r, s) = (path.clone(), registry.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("oomtrace-textfile".into())
            .spawn(move || {
                let mut said = false;
                let mut last = Instant::now();
                while !s.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(100));
                    if last.elapsed() < EVERY {
                        continue;
                    }
                    last = Instant::now();
                    match write(&p, &r.render()) {
                        Err(e) if !said => {
                            console.warn(&format!("oomtrace: {e}"));
                            said = true;
                        }
                        _ => {}
                    }
                }
            })
            .map_err(|e| refuse(&path, e))?;
        Ok(Textfile {
            path,
            registry,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and writes the final values (once the sites asked for are named, or
    /// after 5 s).
    pub fn finish(mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.registry.names.settle(Duration::from_secs(5));
        write(&self.path, &self.registry.render())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("oomtrace-textfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_a_regular_file_whole_and_leaves_nothing_else() {
        let d = scratch("regular");
        let p = d.join("oomtrace.prom");
        write(&p, "a 1\n").unwrap();
        write(&p, "b 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "b 2\n");
        assert_eq!(entries(&d), ["oomtrace.prom"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_a_symlink_a_fifo_and_a_directory() {
        let d = scratch("refuse");
        let target = d.join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = d.join("link.prom");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write(&link, "x 1\n").unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let fifo = d.join("fifo.prom");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = write(&fifo, "x 1\n").unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let dir = d.join("dir.prom");
        std::fs::create_dir(&dir).unwrap();
        assert!(write(&dir, "x 1\n").is_err());
        // No temporary file left behind by any refusal.
        assert_eq!(
            entries(&d),
            ["dir.prom", "fifo.prom", "link.prom", "target"]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_path_that_cannot_be_created_is_refused() {
        let d = scratch("missing");
        let e = write(&d.join("missing/x.prom"), "x 1\n").unwrap_err();
        assert!(e.contains("missing/x.prom"), "{e}");
        assert!(entries(&d).is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
