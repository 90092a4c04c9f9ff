//! Lazy start on the first hook, reset in fork children, flush at exit.
//!
//! The top of the shim: this module reads the configuration, creates the outbox and publishes
//! it and the stack capture, starts the drain thread, and drives the mode (off, recording,
//! forward-only) through fork, exit, exec and `oomtrace_flush`. No other module imports it
//! (the crate root hands `guard` the lazy start), so lower modules cannot reach the process
//! state: hooks see only the outbox they send through.
//!
//! Tracing never starts from a constructor of ours (the one there is, `python_env.rs`, only
//! sets environment variables): hooks can fire before our constructor (libraries linked by the
//! executable run theirs first) and inside `dlopen` under the loader lock, so init is lazy, uses
//! only const-initialized statics, and never waits for the drain thread.
//! The state lives behind a pointer that the fork child simply forgets (leaking the parent's
//! queue, which may hold the parent's undrained events and locks held by threads that do not
//! exist in the child); the child's next hook starts afresh as its own pid. `OnceLock` would
//! not do: a fork while another thread is inside it leaves the child stuck forever.

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::time::Duration;

use oomtrace_proto::wire::GoodbyeReason;

use crate::config::Config;
use crate::guard::{self, MODE, MODE_FORWARD, MODE_RECORDING, MODE_UNINIT};
use crate::log;
use crate::once::OneShot;
use crate::stack::{Capturer, StackConfig};
use crate::transport::{self, DrainSetup, Outbox};
use crate::{device_watch, recording, torch_reserve};

/// What this module keeps of a traced process; one per process image (fork children build
/// their own). Hooks never see it: they reach the outbox and stack capture it published.
struct State {
    pid: u32,
    outbox: &'static Outbox,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
const INIT_NONE: u8 = 0;
const INIT_RUNNING: u8 = 1;
const INIT_DONE: u8 = 2;
static INIT: AtomicU8 = AtomicU8::new(INIT_NONE);
static HOOKS_REGISTERED: OneShot = OneShot::new();
static FINISHED: OneShot = OneShot::new();
/// Below this many free descriptors (under the soft `RLIMIT_NOFILE`) when tracing would start,
/// the process runs untraced: the shim holds up to two at once (the counter page until the
/// stream starts, then the socket or its own trace file) and briefly two more (a `/proc`
/// read, the collector's start: a pipe), so it leaves the program at least four of its own
/// for what it opens next (the driver library, a file). A soft limit of 16, common in
/// sandboxes, still traces.
const MIN_FREE_DESCRIPTORS: u64 = 8;

thread_local! {
    static IN_INIT: Cell<bool> = const { Cell::new(false) };
}

/// The current process's state, if tracing started.
#[inline]
fn state() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    // SAFETY: a published State is leaked, never freed.
    unsafe { p.as_ref() }
}

/// Starts tracing in this process (first hook). True if hooks should record.
#[cold]
pub fn start() -> bool {
    loop {
        match INIT.compare_exchange(INIT_NONE, INIT_RUNNING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                let _ = IN_INIT.try_with(|f| f.set(true));
                let ok = guard::catch(init).unwrap_or(false);
                let _ = IN_INIT.try_with(|f| f.set(false));
                if !ok && MODE.load(Ordering::Acquire) == MODE_UNINIT {
                    MODE.store(MODE_FORWARD, Ordering::Release);
                }
                INIT.store(INIT_DONE, Ordering::Release);
                return ok;
            }
            Err(INIT_DONE) => return MODE.load(Ordering::Acquire) == MODE_RECORDING,
            Err(_) => {
                if IN_INIT.try_with(|f| f.get()).unwrap_or(true) {
                    return false; // a hook reached from inside init itself
                }
                std::thread::yield_now();
            }
        }
    }
}

fn init() -> bool {
    // Registered before anything slow, so that a fork during the rest of init still resets.
    register_process_hooks();
    // A setuid/setgid program: before the environment is read at all (its paths and
    // switches are the caller's), forward only; never follow a path, never spawn.
    if crate::secure::secure_execution() {
        MODE.store(MODE_FORWARD, Ordering::Release);
        return false;
    }
    let config = Config::from_env();
    log::set_verbose(config.verbose);
    if config.disabled {
        MODE.store(MODE_FORWARD, Ordering::Release);
        return false;
    }
    // The shim needs a few descriptors of its own (the counter page, the socket, the
    // collector's start); where the program has almost none left, each would be one it may
    // need (a library it opens next, a file): then it runs untraced, and says so once.
    if let Some((free, limit)) = transport::fd_guard::free_descriptors() {
        if free < MIN_FREE_DESCRIPTORS {
            MODE.store(MODE_FORWARD, Ordering::Release);
            log::warn(&format!(
                "not tracing: only {free} file descriptor{} free below this process's limit of \
                 {limit} (ulimit -n); the shim takes none the program may need, so the program \
                 runs untraced",
                if free == 1 { "" } else { "s" }
            ));
            return false;
        }
    }
    guard::install_panic_hook();
    // Plain LD_PRELOAD: start the collector now, before this hook returns, so that a child
    // forked right after already knows where its parent's collector listens. Costs ~10-30 ms
    // once per process, at its first CUDA call (CUDA's own init takes far longer).
    let own_collector = if config.socket.is_none() && transport::inherited_socket().is_none() {
        Some(transport::start_own_collector(&config))
    } else {
        None
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let clock_origin = crate::clock::Calibration::new();
    let (outbox, rx) = Outbox::create(config.buffer, pid);
    Capturer::publish(
        outbox,
        StackConfig {
            native: config.stacks,
            python: config.python,
            depth: config.stack_depth,
        },
    );
    Outbox::publish(outbox);
    let st: &'static State = Box::leak(Box::new(State { pid, outbox }));
    STATE.store(st as *const State as *mut State, Ordering::Release);
    let setup = DrainSetup {
        config,
        own_collector,
        clock_origin,
    };
    if !transport::spawn_drainer(outbox, rx, setup) {
        guard::disable("cannot start the drain thread; this process continues untraced");
        return false;
    }
    MODE.store(MODE_RECORDING, Ordering::Release);
    true
}

fn register_process_hooks() {
    if !HOOKS_REGISTERED.first() {
        return; // atfork and atexit registrations survive fork: once per process tree
    }
    // SAFETY: registering plain extern "C" functions that never unwind.
    unsafe {
        libc::pthread_atfork(None, None, Some(atfork_child));
        libc::atexit(at_exit);
    }
}

/// In the child of `fork`: forget the parent's state; the next hook starts afresh.
extern "C" fn atfork_child() {
    STATE.store(std::ptr::null_mut(), Ordering::Release);
    Outbox::forget();
    Capturer::forget();
    INIT.store(INIT_NONE, Ordering::Release);
    MODE.store(MODE_UNINIT, Ordering::Release);
    FINISHED.reset();
    recording::reset_after_fork();
    // PyTorch's CUDA is unusable in the child, and a thread of the parent may have held the
    // reserve's lock: the PyTorch way in hears nothing more.
    device_watch::remove();
    torch_reserve::deactivate_after_fork();
    let _ = IN_INIT.try_with(|f| f.set(false));
    transport::close_inherited_sink();
}

extern "C" fn at_exit() {
    finish(GoodbyeReason::Exit, Duration::from_millis(2500));
}

/// Flushes and says goodbye (bounded wait). Hooks forward only from here on.
pub fn finish(reason: GoodbyeReason, timeout: Duration) {
    let Some(st) = state() else { return };
    // SAFETY: getpid has no preconditions. A vfork child shares our memory but is another
    // process: it must not touch the parent's drain thread.
    if unsafe { libc::getpid() } as u32 != st.pid {
        return;
    }
    if !FINISHED.first() {
        return;
    }
    MODE.store(MODE_FORWARD, Ordering::Release);
    // A stream whose end left the process lost nothing: the wait that timed out was for the
    // collector's acknowledgement.
    if guard::catch(|| st.outbox.shutdown(reason, timeout)) == Some(false)
        && !st.outbox.end_delivered()
    {
        // The drain thread did not finish in time (starved, or a collector far behind):
        // whatever it still held leaves with the process, and the user should know. How
        // many events that is only the collector can tell (from the counter page): no
        // number here that the report would contradict.
        crate::log::warn(&format!(
            "the end of this process's trace could not be delivered within {} ms; the trace \
             ends early, and the events missing from it are counted there as lost",
            timeout.as_millis(),
        ));
    }
    // A collector of ours that was killed leaves its socket directory: gone with us.
    let _ = guard::catch(transport::release_own_collector_dir);
}

/// `oomtrace_flush`: everything recorded so far reaches the collector (bounded wait).
pub fn flush() -> bool {
    match state() {
        Some(st) if MODE.load(Ordering::Acquire) == MODE_RECORDING => {
            st.outbox.flush(Duration::from_secs(2))
        }
        _ => false,
    }
}

type ExitFn = unsafe extern "C" fn(std::ffi::c_int) -> !;

fn real_exit(name: &std::ffi::CStr, status: std::ffi::c_int) -> ! {
    let p = crate::symbols::real_dlsym(libc::RTLD_NEXT, name);
    if !p.is_null()
        && !crate::symbols::is_ours(p as usize)
        && !std::ptr::eq(p as *const (), _exit as *const ())
    {
        // SAFETY: glibc's _exit/_Exit.
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, ExitFn>(p)(status) }
    }
    // SAFETY: terminating the process is all that is left to do.
    unsafe {
        libc::syscall(libc::SYS_exit_group, status);
    }
    loop {
        std::hint::spin_loop();
    }
}

/// `_exit` skips atexit handlers (Python's `os._exit`, multiprocessing workers): flush here,
/// briefly, then exit for real.
#[unsafe(no_mangle)]
pub extern "C" fn _exit(status: std::ffi::c_int) -> ! {
    let _ =
        std::panic::catch_unwind(|| finish(GoodbyeReason::UnderscoreExit, Duration::from_secs(1)));
    real_exit(c"_exit", status)
}

#[unsafe(no_mangle)]
pub extern "C" fn _Exit(status: std::ffi::c_int) -> ! {
    let _ =
        std::panic::catch_unwind(|| finish(GoodbyeReason::UnderscoreExit, Duration::from_secs(1)));
    real_exit(c"_Exit", status)
}

/// Before an `exec` replaces this image: deliver what it recorded (bounded). The new image
/// is traced from its own start (`LD_PRELOAD` is inherited); without this, events still
/// queued would vanish with the old image. Skipped in a vfork child, which shares the
/// parent's memory but is not the process the state belongs to.
fn before_exec() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(st) = state() {
            if MODE.load(Ordering::Acquire) == MODE_RECORDING
                // SAFETY: getpid has no preconditions.
                && st.pid == unsafe { libc::getpid() } as u32
            {
                st.outbox.flush(Duration::from_secs(2));
            }
        }
    });
}

type ExecveFn = unsafe extern "C" fn(
    *const libc::c_char,
    *const *const libc::c_char,
    *const *const libc::c_char,
) -> libc::c_int;
type ExecvFn = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char) -> libc::c_int;

/// The next definition of an exec function, never our own.
fn real_exec(name: &std::ffi::CStr) -> *mut std::ffi::c_void {
    let p = crate::symbols::real_dlsym(libc::RTLD_NEXT, name);
    if p.is_null() || crate::symbols::is_ours(p as usize) {
        return std::ptr::null_mut();
    }
    p
}

fn no_exec() -> libc::c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// An exec function that flushes first, then calls the next definition with the caller's
/// exact arguments.
macro_rules! exec_wrapper {
    ($name:ident, $real:literal, $fn_type:ty, ($($arg:ident: $arg_type:ty),*)) => {
        /// # Safety
        /// As the libc function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $arg_type),*) -> libc::c_int {
            before_exec();
            let f = real_exec($real);
            if f.is_null() {
                return no_exec();
            }
            // SAFETY: the libc function of this name, with the caller's arguments.
            unsafe { std::mem::transmute::<*mut std::ffi::c_void, $fn_type>(f)($($arg),*) }
        }
    };
}

type CStrPtr = *const libc::c_char;
type CStrArray = *const *const libc::c_char;

exec_wrapper!(execve, c"execve", ExecveFn, (path: CStrPtr, argv: CStrArray, envp: CStrArray));
exec_wrapper!(execvpe, c"execvpe", ExecveFn, (file: CStrPtr, argv: CStrArray, envp: CStrArray));
exec_wrapper!(execv, c"execv", ExecvFn, (path: CStrPtr, argv: CStrArray));
exec_wrapper!(execvp, c"execvp", ExecvFn, (file: CStrPtr, argv: CStrArray));
