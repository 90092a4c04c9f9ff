//! Secure execution: a setuid or setgid program (or one with file capabilities), which the
//! kernel marks with `AT_SECURE` in the auxiliary vector.
//!
//! There the shim does nothing at all (docs/safety.md): its environment was chosen by a less
//! privileged caller, so no `OOMTRACE_*` path is followed, no collector is spawned, no
//! Python start-up file is written and no variable is set. `LD_PRELOAD` itself is ignored by
//! the loader in such a process, but the library can still arrive by `/etc/ld.so.preload`,
//! a `dlopen` or a link: every part that runs on its own (the constructor, the lazy start)
//! asks here first, before it reads any environment variable.

use std::sync::atomic::{AtomicU8, Ordering};

const UNKNOWN: u8 = 0;
const NORMAL: u8 = 1;
const SECURE: u8 = 2;

/// What `AT_SECURE` said, once read (it cannot change for the life of the process image, and a
/// fork child inherits both the flag and this answer).
static EXECUTION: AtomicU8 = AtomicU8::new(UNKNOWN);

/// True in a setuid, setgid or otherwise secure-execution process: the shim stays out of it.
pub fn secure_execution() -> bool {
    match EXECUTION.load(Ordering::Relaxed) {
        NORMAL => false,
        SECURE => true,
        _ => {
            // SAFETY: getauxval has no preconditions; it only reads the auxiliary vector.
            let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
            EXECUTION.store(if secure { SECURE } else { NORMAL }, Ordering::Relaxed);
            secure
        }
    }
}
