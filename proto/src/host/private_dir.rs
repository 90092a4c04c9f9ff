//! The one way oomtrace makes a private directory (the collector socket's, a scratch copy):
//! `mkdtemp`, which creates a fresh name with mode 0700 in one step. Nothing is ever created
//! first and restricted afterwards, so no other user can get in between, and an existing
//! directory (or a link planted under the name) is never reused.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Where private directories go by default: `$TMPDIR` if it names a directory, else `/tmp`.
pub fn default_base() -> PathBuf {
    std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// Creates `base/<prefix>XXXXXX` (six random characters) with mode 0700, owned by the caller.
pub fn create(base: &Path, prefix: &str) -> io::Result<PathBuf> {
    let mut template = base
        .join(format!("{prefix}XXXXXX"))
        .into_os_string()
        .into_vec();
    if template.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path with a NUL byte",
        ));
    }
    template.push(0);
    // SAFETY: `template` is a writable, NUL-terminated buffer that ends in "XXXXXX"; mkdtemp
    // only overwrites those six bytes in place and keeps no pointer to it.
    let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    template.pop();
    Ok(PathBuf::from(OsString::from_vec(template)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dirs_are_fresh_and_0700_from_the_start() {
        let base = default_base();
        let a = create(&base, "oomtrace-proto-test-").unwrap();
        let b = create(&base, "oomtrace-proto-test-").unwrap();
        assert_ne!(a, b);
        for d in [&a, &b] {
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with("oomtrace-proto-test-") && name.len() == 26,
                "{name}"
            );
            let mode = std::fs::metadata(d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
            std::fs::remove_dir(d).unwrap();
        }
    }

    #[test]
    fn a_missing_base_is_an_error() {
        let e = create(Path::new("/nonexistent-oomtrace-base"), "x-").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
