//! What a path is, in the words of a one-line refusal ("it is a FIFO, not a trace file"): the
//! shim, the collector and the CLI each refuse paths that are not what they expect (a trace
//! is only ever a regular file, a socket only a socket), and say so alike.

use std::fs::FileType;
use std::os::unix::fs::FileTypeExt;

/// `a regular file`, `a symbolic link`, `a directory`, `a FIFO`, `a character device`,
/// `a block device`, `a socket` or `a special file`.
pub fn describe(t: &FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_there() {
        let meta = |p: &str| std::fs::symlink_metadata(p).unwrap().file_type();
        assert_eq!(describe(&meta("/")), "a directory");
        assert_eq!(describe(&meta("/dev/null")), "a character device");
        assert_eq!(describe(&meta("/proc/self")), "a symbolic link");
        assert_eq!(describe(&meta("/proc/self/status")), "a regular file");
    }
}
