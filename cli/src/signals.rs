//! The few signal dispositions the CLI needs, with plain `sigaction`.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Set by `install_stop_flag`'s handler.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// A child to forward SIGTERM/SIGHUP to (0 = none).
pub static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_forward(sig: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

fn set(sig: libc::c_int, handler: libc::sighandler_t) {
    // SAFETY: installing a handler that only touches atomics (or SIG_IGN/SIG_DFL).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// SIGINT, SIGTERM and SIGHUP set `STOP` (a collector finishes its file, then exits).
pub fn install_stop_flag() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        set(sig, on_stop as *const () as libc::sighandler_t);
    }
}

/// While `run` waits for its program: Ctrl-C and Ctrl-\ reach the program from the terminal
/// directly, so `run` ignores them and stays to write the report; SIGTERM and SIGHUP sent to
/// `run` itself are passed on.
pub fn supervise(child: i32) {
    FORWARD_TO.store(child, Ordering::SeqCst);
    set(libc::SIGINT, libc::SIG_IGN);
    set(libc::SIGQUIT, libc::SIG_IGN);
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        set(sig, on_forward as *const () as libc::sighandler_t);
    }
}
