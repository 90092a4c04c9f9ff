//! The one way to start an `oomtrace collect` for a traced program, shared by the shim (plain
//! `LD_PRELOAD`: a detached collector per process tree) and `oomtrace run` (a collector it
//! owns and stops). Both get the same base command: the socket, the output, no preload and no
//! socket of its own in its environment (a collector must never trace itself or connect to
//! another collector), no stdin and no stdout.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How the collector lives next to the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Started by the shim: daemonizes once its socket listens (so the command returning
    /// means it is ready), exits when the last traced process is gone, never replaces a
    /// trace file.
    Detached,
    /// Started by `oomtrace run` (pid `parent_pid`): stays its child, reports live, and
    /// finishes the trace if that parent disappears.
    Owned { parent_pid: u32 },
}

/// The `collect` command for `exe`, listening on `socket` and writing `output`.
pub fn command(exe: &Path, socket: &Path, output: &Path, mode: Mode) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("collect")
        .arg("--socket")
        .arg(socket)
        .arg("--output")
        .arg(output)
        .arg("--quiet");
    match mode {
        Mode::Detached => {
            cmd.arg("--detach").arg("--exit-when-idle");
            // Processes sharing an output name (exec under the same pid, several ranks with
            // one OOMTRACE_OUTPUT) each get their own file instead of overwriting each other's.
            cmd.arg("--no-clobber");
        }
        Mode::Owned { parent_pid } => {
            // If the parent is killed (SIGKILL leaves no chance to stop it), the collector
            // notices that it is gone, finishes the trace and removes the socket directory.
            cmd.arg("--live")
                .arg("--parent-pid")
                .arg(parent_pid.to_string());
        }
    }
    cmd.env_remove("LD_PRELOAD")
        .env_remove("OOMTRACE_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// Runs a [`Mode::Detached`] collector and waits for it to daemonize (it is then listening
/// and no longer a child of the caller). Err: one line saying why it did not start.
pub fn run_detached(exe: &Path, socket: &Path, output: &Path) -> Result<(), String> {
    let started = command(exe, socket, output, Mode::Detached)
        .stderr(Stdio::piped())
        .output();
    match started {
        Err(e) => Err(format!("cannot run {}: {e}", exe.display())),
        Ok(r) if !r.status.success() => {
            let msg = String::from_utf8_lossy(&r.stderr);
            let line = msg.lines().next().unwrap_or("").trim().to_string();
            Err(format!(
                "{} exited with {}: {line}",
                exe.display(),
                r.status
            ))
        }
        Ok(_) => Ok(()),
    }
}

/// Why a started collector is not listening.
#[derive(Debug)]
pub enum NotListening {
    /// It exited first, with this status.
    Exited(ExitStatus),
    /// Its socket did not accept a connection within the time given.
    TimedOut,
}

/// Waits until `child`'s socket accepts a connection, it exits, or `timeout` passes.
pub fn wait_listening(
    child: &mut Child,
    socket: &Path,
    timeout: Duration,
) -> Result<(), NotListening> {
    let deadline = Instant::now() + timeout;
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotListening::Exited(status));
        }
        if Instant::now() > deadline {
            return Err(NotListening::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn both_modes_share_the_base_command() {
        let (exe, s, o) = (
            Path::new("/x/oomtrace"),
            Path::new("/d/s"),
            Path::new("/o.oomt"),
        );
        let d = command(exe, s, o, Mode::Detached);
        assert_eq!(
            args(&d),
            [
                "collect",
                "--socket",
                "/d/s",
                "--output",
                "/o.oomt",
                "--quiet",
                "--detach",
                "--exit-when-idle",
                "--no-clobber"
            ]
        );
        let r = command(exe, s, o, Mode::Owned { parent_pid: 7 });
        assert_eq!(&args(&r)[..6], &args(&d)[..6]);
        assert_eq!(&args(&r)[6..], ["--live", "--parent-pid", "7"]);
        for c in [&d, &r] {
            let removed: Vec<_> = c
                .get_envs()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .collect();
            assert!(removed.contains(&"LD_PRELOAD".to_string()));
            assert!(removed.contains(&"OOMTRACE_SOCKET".to_string()));
        }
    }

    #[test]
    fn a_collector_that_exits_at_once_is_reported() {
        let mut child = Command::new("/bin/false").spawn().unwrap();
        let r = wait_listening(
            &mut child,
            Path::new("/nonexistent-oomtrace-socket"),
            Duration::from_secs(5),
        );
        assert!(matches!(r, Err(NotListening::Exited(s)) if !s.success()));
    }

    #[test]
    fn a_missing_binary_says_which() {
        let e = run_detached(
            Path::new("/nonexistent/oomtrace"),
            Path::new("/d/s"),
            Path::new("/o"),
        )
        .unwrap_err();
        assert!(e.starts_with("cannot run /nonexistent/oomtrace: "), "{e}");
    }
}
