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

/// How long the shim waits for its own collector to listen. A collector is listening 10 to
/// 30 ms after it is started; 3 s leaves a loaded machine (a cold disk cache, two cores shared
/// with a build) a hundred times that before the shim gives up, while a program whose
/// collector never comes up (a wrong `OOMTRACE_COLLECTOR`, a hung binary) waits at most that,
/// once, and is then traced into its own file. Giving up too early only costs the process
/// tree a shared trace (each process writes its own), never an event.
pub const DETACHED_START_WAIT: Duration = Duration::from_secs(3);

/// Runs a [`Mode::Detached`] collector and waits, at most `wait`, for it to daemonize (it is
/// then listening and no longer a child of the caller). Err: one line saying why it did not
/// start. A collector that has not daemonized by then is killed, with everything it started
/// (it runs in its own process group), so it neither holds the caller nor stays behind.
pub fn run_detached(
    exe: &Path,
    socket: &Path,
    output: &Path,
    wait: Duration,
) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut child = command(exe, socket, output, Mode::Detached)
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let deadline = Instant::now() + wait;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            // The program ignores SIGCHLD (children are reaped by the kernel, waitpid says
            // ECHILD): whether it listens is all we can tell.
            Err(_) => break None,
            Ok(None) if Instant::now() >= deadline => {
                stop_group(&mut child, socket);
                return Err(format!(
                    "{} did not start listening within {} s and was stopped",
                    exe.display(),
                    wait.as_secs_f64()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    let said = child
        .stderr
        .take()
        .map(first_line_ready)
        .unwrap_or_default();
    match status {
        Some(status) if !status.success() => {
            Err(format!("{} exited with {status}: {said}", exe.display()))
        }
        // It binds its socket before it daemonizes: no socket, no collector.
        _ if !is_socket(socket) => Err(format!(
            "{} exited without listening on {}{}",
            exe.display(),
            socket.display(),
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        )),
        _ => Ok(()),
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Kills a collector that did not come up, and its process group, and reaps it. Should it
/// have daemonized in the very last moment (its daemon is in a session of its own), one
/// connection that ends at once makes it leave when idle (`--exit-when-idle`).
fn stop_group(child: &mut Child, socket: &Path) {
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: the group of our own unreaped child (its pid cannot have been reused).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(std::os::unix::net::UnixStream::connect(socket));
}

/// The first line the collector wrote on its stderr before it exited, without waiting for
/// the pipe to close (a process it left behind may hold it open).
fn first_line_ready(stderr: std::process::ChildStderr) -> String {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let fd = stderr.as_raw_fd();
    // SAFETY: fcntl on a pipe we own; only its status flags change.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let mut buf = Vec::new();
    let _ = stderr.take(4096).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Where the trace went, as a [`Mode::Owned`] collector tells `oomtrace run` when it is done
/// ([`ToRun::Trace`]): where the trace is, or why there is none although processes were
/// traced. Nothing at all when no process connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceSaid {
    Written(std::path::PathBuf),
    Lost(String),
}

/// One message a [`Mode::Owned`] collector writes on its stdout, a pipe `oomtrace run` reads
/// as it comes: `tag TAB body NUL`. The body may hold any byte but NUL (a path cannot; a text
/// has each NUL replaced), so a message cut short by a killed collector is never read as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToRun {
    /// The trace is finished: where it is.
    Trace(TraceSaid),
    /// Still building the report (sent about every second meanwhile): the collector is alive
    /// and making progress although the trace no longer grows.
    Working,
    /// The report `run` prints, built from the collector's own models of the run (so `run`
    /// need not replay the trace); the body's format is the CLI's.
    Report(String),
}

impl ToRun {
    /// The bytes of this message, its NUL included.
    pub fn encode(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let text = |s: &str| s.replace('\0', "\u{fffd}").into_bytes();
        let (tag, body): (&str, Vec<u8>) = match self {
            ToRun::Trace(TraceSaid::Written(p)) => ("written", p.as_os_str().as_bytes().to_vec()),
            ToRun::Trace(TraceSaid::Lost(why)) => ("lost", text(why)),
            ToRun::Working => ("working", Vec::new()),
            ToRun::Report(r) => ("report", text(r)),
        };
        [tag.as_bytes(), b"\t", &body, b"\0"].concat()
    }

    /// Every whole message in `bytes`, in order; an unknown tag or a last message without its
    /// NUL is left out.
    pub fn decode_all(bytes: &[u8]) -> Vec<ToRun> {
        use std::os::unix::ffi::OsStrExt;
        let mut parts: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
        // What follows the last NUL is not a whole message (empty when the stream ended whole).
        parts.pop();
        parts
            .into_iter()
            .filter_map(|m| {
                let tab = m.iter().position(|&b| b == b'\t')?;
                let (tag, body) = (&m[..tab], &m[tab + 1..]);
                let text = || String::from_utf8_lossy(body).into_owned();
                Some(match tag {
                    b"written" => {
                        ToRun::Trace(TraceSaid::Written(std::ffi::OsStr::from_bytes(body).into()))
                    }
                    b"lost" => ToRun::Trace(TraceSaid::Lost(text())),
                    b"working" => ToRun::Working,
                    b"report" => ToRun::Report(text()),
                    _ => return None,
                })
            })
            .collect()
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
    fn what_the_collector_tells_run_reads_back() {
        let said = [
            ToRun::Trace(TraceSaid::Written("/a b/t\nx.oomt\t".into())),
            ToRun::Working,
            ToRun::Trace(TraceSaid::Lost("its directory was removed".into())),
            ToRun::Report("{\"summary\": \"a\tb\\n\"}".into()),
        ];
        let bytes: Vec<u8> = said.iter().flat_map(ToRun::encode).collect();
        assert_eq!(ToRun::decode_all(&bytes), said);
        assert_eq!(ToRun::decode_all(b""), []);
        assert_eq!(
            ToRun::decode_all(b"other\tx\0working\t\0"),
            [ToRun::Working]
        );
        // A message cut short (a killed collector) is not one.
        let cut = ToRun::Report("{}".into()).encode();
        assert_eq!(ToRun::decode_all(&cut[..cut.len() - 1]), []);
        // A NUL in a text cannot end its message early.
        let nul = ToRun::Report("a\0b".into());
        assert_eq!(
            ToRun::decode_all(&nul.encode()),
            [ToRun::Report("a\u{fffd}b".into())]
        );
    }

    #[test]
    fn a_missing_binary_says_which() {
        let e = run_detached(
            Path::new("/nonexistent/oomtrace"),
            Path::new("/d/s"),
            Path::new("/o"),
            DETACHED_START_WAIT,
        )
        .unwrap_err();
        assert!(e.starts_with("cannot run /nonexistent/oomtrace: "), "{e}");
    }

    /// A directory of its own with an executable script in it.
    fn script(test: &str, body: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("oomtrace-spawn-test-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let exe = dir.join("collector.sh");
        std::fs::write(&exe, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, exe)
    }

    #[test]
    fn a_collector_that_never_comes_up_is_stopped_with_what_it_started() {
        // It starts a child of its own and never listens: both must be gone afterwards.
        let (dir, exe) = script("hang", "echo $$ > \"$(dirname \"$0\")/pid\"; sleep 1000 & echo $! > \"$(dirname \"$0\")/child\"; wait");
        let started = Instant::now();
        let e = run_detached(
            &exe,
            &dir.join("s"),
            &dir.join("o"),
            Duration::from_millis(500),
        )
        .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(e.contains("did not start listening within 0.5 s"), "{e}");
        for f in ["pid", "child"] {
            let pid: i32 = std::fs::read_to_string(dir.join(f))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            // Killed: gone, or a zombie until init reaps it.
            let gone = |pid: i32| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
            };
            let t = Instant::now();
            while !gone(pid) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(gone(pid), "{f} {pid} still runs");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_collector_that_exits_without_listening_is_not_taken_for_one() {
        let (dir, exe) = script("exit0", "echo 'some words' >&2; exit 0");
        let e =
            run_detached(&exe, &dir.join("s"), &dir.join("o"), DETACHED_START_WAIT).unwrap_err();
        assert!(
            e.contains("exited without listening") && e.ends_with(": some words"),
            "{e}"
        );
        let (dir2, exe2) = script("exit3", "echo 'bad output' >&2; exit 3");
        let e =
            run_detached(&exe2, &dir2.join("s"), &dir2.join("o"), DETACHED_START_WAIT).unwrap_err();
        assert!(e.contains("exited with exit status: 3: bad output"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&dir2).unwrap();
    }
}
