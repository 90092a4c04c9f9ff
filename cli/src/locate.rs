//! Finding liboomtrace.so for `run` and `demo`: `OOMTRACE_LIB`, else next to this binary
//! (a release directory, an install prefix, or a Python environment's `bin/`, where the wheel
//! installs both: docs/PACKAGING.md), else cargo's `deps/` directory beside it, else `../lib/`,
//! else the embedded copy (`embed-shim`).
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

pub use oomtrace_proto::host::cache::cache_dir;

/// How long another build's cache directory must have gone unused before it is removed: two
/// builds in use at once (an installed one and a fresh one, a CI run beside a developer's)
/// must never delete what the other is running from.
pub const UNUSED_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// Marks `current` as in use (its modification time) and removes the cache directories that
/// other builds of oomtrace made for the same kind of content (same tag, another version or
/// hash) and have not used for [`UNUSED_FOR`]: each build would otherwise add one that is
/// never cleaned. Called on every use. Only names of exactly the form `cache_dir` gives
/// (`<x.y.z><tag>-<16 hex digits>`, a real directory, not a symlink) are touched: nothing
/// else in the cache is ever removed.
pub fn mark_used(current: &Path) {
    let now = std::time::SystemTime::now();
    if let Ok(d) = std::fs::File::open(current) {
        let _ = d.set_modified(now);
    }
    let (Some(parent), Some(name)) = (current.parent(), current.file_name()) else {
        return;
    };
    let Some(tag) = cache_tag(&name.to_string_lossy()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let other = e.file_name();
        let other_text = other.to_string_lossy();
        // A build's own directory, or the temporary one a killed install left beside it.
        let of_build = temp_of(&other_text).unwrap_or(&other_text);
        if other == name || cache_tag(of_build).as_deref() != Some(&tag) {
            continue;
        }
        let unused = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age >= UNUSED_FOR));
        if unused && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The cache directory name a temporary install directory was made for
/// (`.<name>.tmp-XXXXXX`, see `cmd::demo`), or None when `name` is not one.
fn temp_of(name: &str) -> Option<&str> {
    let (of, random) = name.strip_prefix('.')?.rsplit_once(".tmp-")?;
    (random.len() == 6 && random.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(of)
}

/// The tag of a cache directory name (`""`, `"-python"`, `"-demo"`), or None when the name is
/// not one `cache_dir` makes.
fn cache_tag(name: &str) -> Option<String> {
    let (head, hash) = name.rsplit_once('-')?;
    if hash.len() != 16 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let version_end = head
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(head.len());
    let (version, tag) = head.split_at(version_end);
    let parts: Vec<&str> = version.split('.').collect();
    let semver = parts.len() == 3 && parts.iter().all(|p| !p.is_empty());
    let known_tag = tag.is_empty()
        || (tag.starts_with('-') && tag[1..].bytes().all(|b| b.is_ascii_lowercase()));
    (semver && known_tag).then(|| tag.to_string())
}

/// Writes the embedded library to `$XDG_CACHE_HOME/oomtrace/<version>-<hash>/` (or
/// `~/.cache/...`, or the temp dir), once: a private 0700 directory, the file written under a
/// temporary name and renamed, so concurrent first runs never see half a library.
pub fn extract_embedded(bytes: &[u8]) -> Result<PathBuf, Failure> {
    let dir = cache_dir("", &[bytes]);
    let lib = dir.join(LIB_NAME);
    if std::fs::metadata(&lib).is_ok_and(|m| m.len() == bytes.len() as u64) {
        mark_used(&dir);
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
        let written = std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)))
            .and_then(|()| std::fs::rename(&tmp, &lib));
        if let Err(e) = written {
            // A half-written copy (full disk) is ours to remove; the name is this process's.
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(e));
        }
    }
    mark_used(&dir);
    Ok(lib)
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// A new private directory (0700 from its creation, see `oomtrace_proto::host::private_dir`).
pub fn private_dir() -> Result<PathBuf, Failure> {
    let base = std::env::temp_dir();
    let prefix = format!("oomtrace-{}-", std::process::id());
    oomtrace_proto::host::private_dir::create(&base, &prefix).map_err(|e| {
        let at = base.join(format!("{prefix}XXXXXX"));
        Failure::new(format!("cannot create {}: {e}", at.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_library_is_extracted_once_into_a_private_directory() {
        let cache =
            std::env::temp_dir().join(format!("oomtrace-cache-test-{}", std::process::id()));
        // SAFETY: set_var races only with readers of the environment, and this is the only test in this binary that reads XDG_CACHE_HOME.
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

    #[test]
    fn only_other_builds_of_the_same_kind_are_pruned() {
        assert_eq!(cache_tag("0.1.0-0123456789abcdef").as_deref(), Some(""));
        assert_eq!(
            cache_tag("0.2.10-python-0123456789abcdef").as_deref(),
            Some("-python")
        );
        assert_eq!(
            cache_tag("0.1.0-demo-0123456789abcdef").as_deref(),
            Some("-demo")
        );
        for not_ours in [
            "notes",
            "0.1.0-python",
            "0.1-0123456789abcdef",
            "x0.1.0-0123456789abcdef",
            "0.1.0-python-0123456789abcdeg",
            "0.1.0-Py-0123456789abcdef",
        ] {
            assert_eq!(cache_tag(not_ours), None, "{not_ours}");
        }
        let base = std::env::temp_dir().join(format!("oomtrace-prune-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let mk = |n: &str| {
            std::fs::create_dir_all(base.join(n)).unwrap();
            std::fs::write(base.join(n).join("f"), b"x").unwrap();
        };
        mk("0.1.0-python-1111111111111111");
        mk("0.0.9-python-2222222222222222");
        mk("0.1.0-demo-3333333333333333");
        mk("0.1.0-python-notahash");
        std::fs::write(base.join("0.1.0-python-4444444444444444"), b"a file").unwrap();
        std::os::unix::fs::symlink(
            base.join("0.1.0-demo-3333333333333333"),
            base.join("0.1.0-python-5555555555555555"),
        )
        .unwrap();
        mk("0.1.0-python-ffffffffffffffff");
        // Unused for two hours, except one used a minute ago (another build running now).
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for n in [
            "0.1.0-python-1111111111111111",
            "0.0.9-python-2222222222222222",
            "0.1.0-demo-3333333333333333",
            "0.1.0-python-notahash",
        ] {
            std::fs::File::open(base.join(n))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        mk("0.1.0-python-6666666666666666");
        // Temporary install directories: an old one of the same kind is pruned, a fresh one
        // (an install under way) and names of any other form are kept.
        mk(".0.1.0-python-7777777777777777.tmp-aB3xYz");
        mk(".0.1.0-python-8888888888888888.tmp-aB3xYz");
        mk(".0.1.0-python-9999999999999999.tmp-toolong");
        for n in [
            ".0.1.0-python-7777777777777777.tmp-aB3xYz",
            ".0.1.0-python-9999999999999999.tmp-toolong",
        ] {
            std::fs::File::open(base.join(n))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        mark_used(&base.join("0.1.0-python-ffffffffffffffff"));
        let mut left: Vec<String> = std::fs::read_dir(&base)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".0.1.0-python-8888888888888888.tmp-aB3xYz",
                ".0.1.0-python-9999999999999999.tmp-toolong",
                "0.1.0-demo-3333333333333333",
                "0.1.0-python-4444444444444444",
                "0.1.0-python-5555555555555555",
                "0.1.0-python-6666666666666666",
                "0.1.0-python-ffffffffffffffff",
                "0.1.0-python-notahash",
            ]
        );
        assert!(
            base.join("0.1.0-demo-3333333333333333/f").is_file(),
            "a symlink's target is never touched"
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
