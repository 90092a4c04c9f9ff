//! Finding liboomtrace.so for `run` and `demo`: `OOMTRACE_LIB`, else next to this binary
//! (a release directory or an install prefix), else cargo's `deps/` directory beside it.
//! `OOMTRACE_LIB` is the CLI's only variable; the shim's are in `shim/src/config.rs`.

use std::path::{Path, PathBuf};

use crate::Failure;

pub const LIB_NAME: &str = "liboomtrace.so";

/// liboomtrace.so itself when built with the `embed-shim` feature; empty otherwise.
const EMBEDDED_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/liboomtrace.so"));

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
    if !EMBEDDED_SHIM.is_empty() {
        return extract_embedded(EMBEDDED_SHIM);
    }
    Err(Failure::new(format!(
        "cannot find {LIB_NAME} next to {} (build it with `cargo build --release`, or set OOMTRACE_LIB)",
        exe.display()
    )))
}

/// `$XDG_CACHE_HOME/oomtrace/<version><tag>-<hash of contents>` (or `~/.cache/...`, or the
/// temp dir): where files this binary carries are written once and kept.
pub fn cache_dir(tag: &str, contents: &[&[u8]]) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let hash = contents
        .iter()
        .fold(0u64, |h, c| h.rotate_left(17) ^ fingerprint(c));
    base.join("oomtrace")
        .join(format!("{}{tag}-{hash:016x}", env!("CARGO_PKG_VERSION")))
}

/// FNV-1a: names the cache directory after the library's content, so that a new build never
/// reuses an old copy and two builds never write the same file.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Writes the embedded library to `$XDG_CACHE_HOME/oomtrace/<version>-<hash>/` (or
/// `~/.cache/...`, or the temp dir), once: a private 0700 directory, the file written under a
/// temporary name and renamed, so concurrent first runs never see half a library.
pub fn extract_embedded(bytes: &[u8]) -> Result<PathBuf, Failure> {
    let dir = cache_dir("", &[bytes]);
    let lib = dir.join(LIB_NAME);
    if std::fs::metadata(&lib).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(lib);
    }
    let fail = |e: std::io::Error| Failure::new(format!("cannot write {}: {e}", lib.display()));
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(fail)?;
        let tmp = dir.join(format!("{LIB_NAME}.{}", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(fail)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
        std::fs::rename(&tmp, &lib).map_err(fail)?;
    }
    Ok(lib)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_library_is_extracted_once_into_a_private_directory() {
        let cache =
            std::env::temp_dir().join(format!("oomtrace-cache-test-{}", std::process::id()));
        // SAFETY of set_var: this is the only test in this binary that reads XDG_CACHE_HOME.
        unsafe { std::env::set_var("XDG_CACHE_HOME", &cache) };
        let lib = extract_embedded(b"\x7fELF not really").unwrap();
        assert_eq!(std::fs::read(&lib).unwrap(), b"\x7fELF not really");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(lib.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(extract_embedded(b"\x7fELF not really").unwrap(), lib);
        assert_ne!(extract_embedded(b"another build").unwrap(), lib);
        let _ = std::fs::remove_dir_all(&cache);
    }
}
