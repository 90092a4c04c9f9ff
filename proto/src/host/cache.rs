//! Where oomtrace keeps the files its binaries carry, and the Python files themselves: shared by
//! the CLI (`oomtrace run`, `oomtrace lib`, the demo) and the shim (which, preloaded into a
//! Python program, puts the same step hook on `PYTHONPATH`), so both find the same directory.
//! The CLI also prunes other builds' directories (`cli/src/locate.rs`); the shim never removes
//! anything.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `$XDG_CACHE_HOME/oomtrace/<version><tag>-<hash of contents>` (or `~/.cache/...`, or the
/// temp dir): where files a binary carries are written once and kept.
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

/// FNV-1a: names a cache directory after its content, so that a new build never reuses an old
/// copy and two builds never write the same file.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The `oomtrace` Python package (python/oomtrace/; build.rs says where it is in an sdist).
pub const PY_PACKAGE: &[u8] = include_bytes!(concat!(
    env!("OOMTRACE_PYTHON_DIR"),
    "/oomtrace/__init__.py"
));
/// Its reader of a PyTorch release's allocator headers (for a release oomtrace was not checked
/// against).
pub const PY_ABI: &[u8] = include_bytes!(concat!(env!("OOMTRACE_PYTHON_DIR"), "/oomtrace/_abi.py"));
/// Its Python API (`oomtrace.trace()`, `start()`, `stop()`).
pub const PY_SESSION: &[u8] = include_bytes!(concat!(
    env!("OOMTRACE_PYTHON_DIR"),
    "/oomtrace/_session.py"
));
/// Its pytest plugin.
pub const PY_PYTEST: &[u8] = include_bytes!(concat!(
    env!("OOMTRACE_PYTHON_DIR"),
    "/oomtrace/pytest_plugin.py"
));
/// The sitecustomize that, when the program imports torch, installs what `OOMTRACE_TORCH` asks
/// for (the optimizer step hook, the allocator) and then runs the user's own sitecustomize.
pub const PY_BOOT: &[u8] = include_bytes!(concat!(
    env!("OOMTRACE_PYTHON_DIR"),
    "/boot/sitecustomize.py"
));

/// Writes the Python files into their cache directory (once: a file already there with the
/// same bytes is kept; each is written under a temporary name and renamed, and only that
/// temporary file is ever removed) and returns the directory.
pub fn python_files() -> std::io::Result<PathBuf> {
    let dir = cache_dir(
        "-python",
        &[PY_PACKAGE, PY_ABI, PY_SESSION, PY_PYTEST, PY_BOOT],
    );
    for (path, bytes) in [
        (dir.join("oomtrace").join("__init__.py"), PY_PACKAGE),
        (dir.join("oomtrace").join("_abi.py"), PY_ABI),
        (dir.join("oomtrace").join("_session.py"), PY_SESSION),
        (dir.join("oomtrace").join("pytest_plugin.py"), PY_PYTEST),
        (dir.join("boot").join("sitecustomize.py"), PY_BOOT),
    ] {
        if std::fs::read(&path).is_ok_and(|b| b == bytes) {
            continue;
        }
        let named =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(named)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if let Err(e) = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(named(e));
        }
    }
    Ok(dir)
}

/// `PYTHONPATH` with the sitecustomize and the package (in `dir`, from [`python_files`])
/// first, then what it was (an empty one adds nothing: split, it would become the working
/// directory).
pub fn python_path(dir: &Path, old: Option<OsString>) -> Result<OsString, String> {
    let mut paths = vec![dir.join("boot"), dir.to_path_buf()];
    if let Some(old) = old.filter(|v| !v.is_empty()) {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).map_err(|e| format!("cannot build PYTHONPATH: {e}"))
}

#[cfg(test)]
mod package_tests {
    /// `run` writes the package its programs import from these bytes: every module of
    /// python/oomtrace/ must be among them (a module left out breaks `import oomtrace` under
    /// `run`, and with it the tracing of every tensor).
    #[test]
    fn every_module_of_the_package_is_embedded() {
        let dir = std::path::Path::new(env!("OOMTRACE_PYTHON_DIR")).join("oomtrace");
        let embedded = ["__init__.py", "_abi.py", "_session.py", "pytest_plugin.py"];
        let mut modules: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".py"))
            .collect();
        modules.sort();
        let mut want: Vec<String> = embedded.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(
            modules, want,
            "python/oomtrace/ against what python_files() writes"
        );
        let written: Vec<&[u8]> = vec![
            super::PY_PACKAGE,
            super::PY_ABI,
            super::PY_SESSION,
            super::PY_PYTEST,
        ];
        assert!(written.iter().all(|b| !b.is_empty()));
    }
}
