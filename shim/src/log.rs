//! One-line messages on stderr, written with `write(2)` so that printing can never panic,
//! allocate under a lock the host holds, or interleave with the host's own stdio buffers.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::once::OneShot;

static VERBOSE: AtomicBool = AtomicBool::new(false);

pub fn set_verbose(v: bool) {
    VERBOSE.store(v, Ordering::Relaxed);
}

fn write_line(msg: &str) {
    let mut line = Vec::with_capacity(msg.len() + 11);
    line.extend_from_slice(b"oomtrace: ");
    line.extend_from_slice(msg.as_bytes());
    line.push(b'\n');
    let mut rest = &line[..];
    while !rest.is_empty() {
        // SAFETY: writing a valid buffer to fd 2; errors are ignored (nowhere left to report).
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}

/// Something the user should know (fallback file, lost collector, bad variable).
pub fn warn(msg: &str) {
    write_line(msg);
}

/// Only with `OOMTRACE_LOG=1`.
pub fn info(msg: &str) {
    if VERBOSE.load(Ordering::Relaxed) {
        write_line(msg);
    }
}

/// A warning printed at most once per `flag`.
pub fn warn_once(flag: &OneShot, msg: &str) {
    if flag.first() {
        write_line(msg);
    }
}
