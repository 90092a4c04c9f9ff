//! The Hello: what the stream's first frame says of this process, read from `/proc` on the
//! drain thread (each read in a window of the descriptor guard, `fd_guard::read_own`).

use oomtrace_proto::wire::{self, Hello};

use super::fd_guard;
use crate::clock;

/// The Hello of process `pid` (this one), read now; `stacks`: native stacks are recorded.
pub(super) fn hello(pid: u32, stacks: bool) -> Hello {
    Hello {
        pid,
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        start_unix_ns: clock::unix_ns(),
        flags: if stacks {
            wire::hello_flags::NATIVE_STACKS
        } else {
            0
        },
        shim_version: env!("CARGO_PKG_VERSION").into(),
        exe: std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        argv: read_cmdline(),
        start_mono_ns: clock::monotonic_ns(),
        host: read_host(),
        launch: read_launch_vars(),
    }
}

fn read_cmdline() -> Vec<String> {
    fd_guard::read_own(std::path::Path::new("/proc/self/cmdline"))
        .and_then(Result::ok)
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The launcher's variables (rank, world size, ...) as the process started with them. Read
/// from `/proc/self/environ`, not `getenv`: this runs on the drain thread while the program
/// may be calling `setenv`, and launchers set these before `exec`.
fn read_launch_vars() -> Vec<(String, String)> {
    use oomtrace_proto::launch::{LAUNCH_VARS, MAX_VALUE};
    let Some(Ok(environ)) = fd_guard::read_own(std::path::Path::new("/proc/self/environ")) else {
        return Vec::new();
    };
    environ
        .split(|&c| c == 0)
        .filter_map(|entry| {
            let eq = entry.iter().position(|&c| c == b'=')?;
            let (name, value) = (&entry[..eq], &entry[eq + 1..]);
            let name = LAUNCH_VARS.iter().find(|n| n.as_bytes() == name)?;
            let value = &value[..value.len().min(MAX_VALUE)];
            Some((
                name.to_string(),
                String::from_utf8_lossy(value).into_owned(),
            ))
        })
        .collect()
}

/// The host's name, "" when unreadable (a trace from many nodes tells them apart by it).
fn read_host() -> String {
    fd_guard::read_own(std::path::Path::new("/proc/sys/kernel/hostname"))
        .and_then(Result::ok)
        .map(|h| String::from_utf8_lossy(&h).trim().to_string())
        .unwrap_or_default()
}
