//! Starting this process's own collector (`oomtrace collect --detach`) when none was
//! configured, and remembering its socket for children forked later.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::config::Config;
use crate::log;

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

/// The `oomtrace` binary: `OOMTRACE_COLLECTOR`, else next to liboomtrace.so, else on PATH.
fn find_collector() -> Option<PathBuf> {
    let executable = |p: &Path| {
        CString::new(p.as_os_str().as_encoded_bytes())
            // SAFETY: valid C string.
            .map(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
            .unwrap_or(false)
    };
    if let Some(dir) = own_dir() {
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

/// The directory liboomtrace.so was loaded from.
fn own_dir() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr on one of our own functions.
    if unsafe { libc::dladdr(find_collector as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    let p = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let p = PathBuf::from(p.to_string_lossy().into_owned());
    let p = std::fs::canonicalize(&p).unwrap_or(p);
    p.parent().map(Path::to_path_buf)
}

/// A fresh 0700 directory for the collector's socket.
fn private_dir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let template = base.join("oomtrace-XXXXXX");
    let mut bytes = template.into_os_string().into_encoded_bytes();
    bytes.push(0);
    // SAFETY: a writable NUL-terminated template.
    let p = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    bytes.pop();
    // SAFETY: mkdtemp filled in the template with path bytes.
    Ok(PathBuf::from(unsafe {
        std::ffi::OsString::from_encoded_bytes_unchecked(bytes)
    }))
}

/// Starts `oomtrace collect --detach` for this process and returns its socket. The collector
/// daemonizes once its socket is listening, so the command returning means it is ready, and it
/// is never left as a child of the program (whose own `wait` calls must not see it).
fn spawn_collector(config: &Config) -> Result<PathBuf, String> {
    let exe = config
        .collector
        .as_ref()
        .map(PathBuf::from)
        .or_else(find_collector)
        .ok_or("no `oomtrace` binary next to liboomtrace.so or on PATH (set OOMTRACE_COLLECTOR)")?;
    let dir = private_dir().map_err(|e| format!("cannot create a private directory: {e}"))?;
    let socket = dir.join("collector.sock");
    // SAFETY: getpid has no preconditions.
    let output = config.output_for(unsafe { libc::getpid() } as u32);
    let output = std::env::current_dir()
        .map(|d| d.join(&output))
        .unwrap_or_else(|_| PathBuf::from(&output));
    let started = std::process::Command::new(&exe)
        .arg("collect")
        .arg("--socket")
        .arg(&socket)
        .arg("--output")
        .arg(&output)
        .arg("--detach")
        .arg("--exit-when-idle")
        // Processes sharing an output name (exec under the same pid, several ranks with one
        // OOMTRACE_OUTPUT) each get their own file instead of overwriting each other's.
        .arg("--no-clobber")
        .arg("--quiet")
        .env_remove("LD_PRELOAD")
        .env_remove("OOMTRACE_SOCKET")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    let failure = match started {
        Err(e) => Some(format!("cannot run {}: {e}", exe.display())),
        Ok(r) if !r.status.success() => {
            let msg = String::from_utf8_lossy(&r.stderr);
            let line = msg.lines().next().unwrap_or("").trim().to_string();
            Some(format!(
                "{} exited with {}: {line}",
                exe.display(),
                r.status
            ))
        }
        Ok(_) => None,
    };
    if let Some(why) = failure {
        let _ = std::fs::remove_dir_all(&dir);
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
