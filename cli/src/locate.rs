//! Finding liboomtrace.so for `run` and `demo`: `OOMTRACE_LIB`, else next to this binary
//! (a release directory or an install prefix), else cargo's `deps/` directory beside it.
//! `OOMTRACE_LIB` is the CLI's only variable; the shim's are in `shim/src/config.rs`.

use std::path::{Path, PathBuf};

use crate::Failure;

pub const LIB_NAME: &str = "liboomtrace.so";

pub fn shim_library() -> Result<PathBuf, Failure> {
    if let Some(p) = std::env::var_os("OOMTRACE_LIB") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(absolute(&p));
        }
        return Err(Failure::new(format!(
            "OOMTRACE_LIB={} is not a file",
            p.display()
        )));
    }
    let exe =
        std::env::current_exe().map_err(|e| Failure::new(format!("cannot locate myself: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for candidate in [
        dir.join(LIB_NAME),
        dir.join("deps").join(LIB_NAME),
        dir.join("../lib").join(LIB_NAME),
    ] {
        if candidate.is_file() {
            return Ok(absolute(&candidate));
        }
    }
    Err(Failure::new(format!(
        "cannot find {LIB_NAME} next to {} (build it with `cargo build --release`, or set OOMTRACE_LIB)",
        exe.display()
    )))
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// A new private (0700) directory for sockets.
pub fn private_dir() -> Result<PathBuf, Failure> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let p = base.join(format!("oomtrace-{}-{attempt}", std::process::id()));
        match std::fs::create_dir(&p) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
                return Ok(p);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Failure::new(format!("cannot create {}: {e}", p.display()))),
        }
    }
    Err(Failure::new(
        "cannot create a private directory in the temp dir",
    ))
}
