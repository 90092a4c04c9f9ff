//! Starting this process's own collector (`oomtrace collect --detach`) when none was
//! configured, and remembering its socket for children forked later.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use oomtrace_proto::host::{collector_spawn, private_dir, socket_dir};

use crate::config::Config;
use crate::{log, symbols};

/// The socket of the collector this process started, inherited by forked children so that
/// they report to the same collector.
static AUTO_SOCKET: OnceLock<PathBuf> = OnceLock::new();

/// The collector socket a fork parent started, if any.
pub fn inherited_socket() -> Option<&'static PathBuf> {
    AUTO_SOCKET.get()
}

/// Spawns this process's own collector (see `spawn_collector`) and records its socket for
/// children forked from now on.
pub fn start_own_collector(config: &Config) -> Result<PathBuf, String> {
    let path = spawn_collector(config)?;
    let _ = AUTO_SOCKET.set(path.clone());
    Ok(path)
}

/// At this process's exit: if the collector it (or its fork parent) started is gone (killed),
/// remove the socket's directory now rather than leave it to the next start. A collector that
/// still runs removes it itself when it is done; the owner file says who still uses it, and
/// this process, about to exit, no longer does.
pub fn release_own_collector_dir() {
    if let Some(dir) = AUTO_SOCKET.get().and_then(|s| s.parent()) {
        socket_dir::remove_if_abandoned(dir, Some(std::process::id()));
    }
}

/// The `oomtrace` binary: `OOMTRACE_COLLECTOR`, else next to liboomtrace.so, else on PATH.
fn find_collector() -> Option<PathBuf> {
    let executable = |p: &Path| {
        CString::new(p.as_os_str().as_encoded_bytes())
            // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
            .map(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
            .unwrap_or(false)
    };
    // The directory liboomtrace.so was loaded from.
    let own = symbols::loaded_from().map(|p| std::fs::canonicalize(&p).unwrap_or(p));
    if let Some(dir) = own.as_deref().and_then(Path::parent) {
        let p = dir.join("oomtrace");
        if executable(&p) {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("oomtrace"))
        .find(|p| executable(p))
}

/// Starts `oomtrace collect --detach` for this process and returns its socket. The collector
/// daemonizes once its socket is listening, so the command returning means it is ready, and it
/// is never left as a child of the program (whose own `wait` calls must not see it). One that
/// is not listening within `DETACHED_START_WAIT` is stopped, and the caller writes the trace
/// itself.
fn spawn_collector(config: &Config) -> Result<PathBuf, String> {
    let exe = config
        .collector
        .as_ref()
        .map(PathBuf::from)
        .or_else(find_collector)
        .ok_or("no `oomtrace` binary next to liboomtrace.so or on PATH (set OOMTRACE_COLLECTOR)")?;
    let base = private_dir::default_base();
    // What killed chains left (their collector and every process that used it are gone).
    socket_dir::clean_abandoned(&base);
    let dir = socket_dir::create(&base, "oomtrace-")
        .map_err(|e| format!("cannot create a private directory: {e}"))?;
    let socket = dir.join(socket_dir::SOCKET);
    // SAFETY: getpid has no preconditions.
    let output = config.output_for(unsafe { libc::getpid() } as u32);
    let output = std::env::current_dir()
        .map(|d| d.join(&output))
        .unwrap_or_else(|_| PathBuf::from(&output));
    if let Err(why) =
        collector_spawn::run_detached(&exe, &socket, &output, collector_spawn::DETACHED_START_WAIT)
    {
        // The collector never ran, or was stopped: the directory is ours alone. Removed
        // without a descriptor (`remove_dir_all` needs one: at the program's descriptor limit
        // it would leave the directory behind).
        socket_dir::remove(&socket);
        return Err(why);
    }
    // The collector picks the name when the first process connects (no-clobber: a numbered
    // one if this is taken); it names the file it used in anything it says.
    log::info(&format!(
        "started a collector for {} (or the first free numbered name beside it; socket {})",
        output.display(),
        socket.display()
    ));
    Ok(socket)
}
