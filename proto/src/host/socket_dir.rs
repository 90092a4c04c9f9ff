//! The private directory of a collector socket that oomtrace makes for itself (the shim's own
//! collector: `oomtrace-XXXXXX`; `oomtrace run`'s: `oomtrace-<pid>-XXXXXX`), and how such a
//! directory is removed even when every process that used it was killed.
//!
//! Whoever makes the directory writes an owner file into it ([`OWNER_FILE`]): one line per
//! process that uses it, `<pid> <pid namespace>`; the collector adds its own line when it
//! starts. The processes remove the directory themselves when they are done; a directory whose
//! processes were all killed (SIGKILL leaves them no chance) is removed by the next start of
//! oomtrace, which calls [`clean_abandoned`], once they have finished exiting (a start while a
//! killed process's last thread still exits leaves it to the start after). A directory is
//! removed only when every check says it is one of ours and nobody uses it: its name has one
//! of the two forms above, it is a real directory (never a symlink, never followed), owned by
//! this user with mode 0700, it holds a regular owner file of ours whose every line names a
//! process of this pid namespace that no longer exists, and nothing listens on its socket.
//! Then only the socket, the owner file and the (then empty) directory are removed: anything
//! else in it keeps it where it is.

use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::private_dir;

/// The socket's name in its directory.
pub const SOCKET: &str = "collector.sock";
/// The owner file: which processes use the directory.
pub const OWNER_FILE: &str = "owner";
/// An owner file is a few lines; anything larger is not ours.
const OWNER_FILE_MAX: u64 = 4096;

/// Creates `base/<prefix>XXXXXX` (see [`private_dir::create`]) with an owner file naming this
/// process. Nothing is left if the owner file cannot be written (with no descriptor to spare,
/// say): the directory is removed with `rmdir`, which needs none.
pub fn create(base: &Path, prefix: &str) -> io::Result<PathBuf> {
    let dir = private_dir::create(base, prefix)?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(OWNER_FILE))
        .and_then(|mut f| f.write_all(owner_line(std::process::id()).as_bytes()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(dir.join(OWNER_FILE));
        let _ = std::fs::remove_dir(&dir);
        return Err(e);
    }
    Ok(dir)
}

/// Adds `pid` (of this pid namespace) to the owner file in `dir`, if `dir` has one: a
/// collector started in a directory oomtrace made. A directory without one (a socket path the
/// user chose) is left as it is.
pub fn add_owner(dir: &Path, pid: u32) -> io::Result<()> {
    let mut f = match std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(OWNER_FILE))
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    f.write_all(owner_line(pid).as_bytes())
}

/// Removes `socket`'s directory when it is one oomtrace made (named as ours, this user's,
/// 0700, with an owner file), once the collector is done with it: the socket, the owner file,
/// then the directory if that left it empty (anything else in it keeps it). Needs no file
/// descriptor (a process at its descriptor limit still cleans up).
pub fn remove(socket: &Path) {
    let Some(dir) = socket.parent() else { return };
    let owned = std::fs::symlink_metadata(dir.join(OWNER_FILE)).is_ok_and(|m| m.is_file());
    if !is_our_dir(dir) || !owned {
        return;
    }
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(socket);
    }
    remove_owner_file_and_dir(dir);
}

/// Removes `dir` if it is abandoned: ours, and every process in its owner file is gone
/// (`except`, this process when it is about to exit, counts as gone). True if removed.
pub fn remove_if_abandoned(dir: &Path, except: Option<u32>) -> bool {
    if !is_our_dir(dir) || !owners_gone(dir, except) {
        return false;
    }
    let socket = dir.join(SOCKET);
    if let Ok(m) = std::fs::symlink_metadata(&socket) {
        if !m.file_type().is_socket() {
            return false;
        }
        // A listener we could not account for (another namespace's process, a recycled
        // owner file): never take its socket away.
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return false;
        }
        let _ = std::fs::remove_file(&socket);
    }
    remove_owner_file_and_dir(dir)
}

/// Removes every abandoned socket directory of oomtrace's in `base` (see the module comment);
/// returns how many. Called when oomtrace starts a collector, so that what a killed chain left
/// is gone by the next run.
pub fn clean_abandoned(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        if is_our_name(&name.to_string_lossy()) && remove_if_abandoned(&e.path(), None) {
            removed += 1;
        }
    }
    removed
}

fn remove_owner_file_and_dir(dir: &Path) -> bool {
    let owner = dir.join(OWNER_FILE);
    if std::fs::symlink_metadata(&owner).is_ok_and(|m| m.file_type().is_file()) {
        let _ = std::fs::remove_file(&owner);
    }
    std::fs::remove_dir(dir).is_ok()
}

/// `<pid> <pid namespace>\n`.
fn owner_line(pid: u32) -> String {
    format!("{pid} {}\n", pid_namespace().unwrap_or(0))
}

/// This process's pid namespace (the inode of /proc/self/ns/pid): a pid means something
/// only in its own namespace.
fn pid_namespace() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// `oomtrace-` and six `mkdtemp` characters (the shim's), or `oomtrace-<pid>-` and six
/// (`run`'s).
fn is_our_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("oomtrace-") else {
        return false;
    };
    let random = |s: &str| s.len() == 6 && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if random(rest) {
        return true;
    }
    match rest.split_once('-') {
        Some((pid, tail)) => {
            !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && random(tail)
        }
        None => false,
    }
}

/// Named as ours, a real directory (not followed), this user's, mode 0700.
fn is_our_dir(dir: &Path) -> bool {
    if !dir
        .file_name()
        .is_some_and(|n| is_our_name(&n.to_string_lossy()))
    {
        return false;
    }
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    m.file_type().is_dir() && m.uid() == me && m.mode() & 0o777 == 0o700
}

/// Every line of `dir`'s owner file names a process of this pid namespace that no longer
/// exists (or `except`). False when there is no such file, it is not ours, or any line is
/// not understood: a directory we cannot account for is never removed.
fn owners_gone(dir: &Path, except: Option<u32>) -> bool {
    let path = dir.join(OWNER_FILE);
    let Ok(m) = std::fs::symlink_metadata(&path) else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_file() || m.uid() != me || m.len() > OWNER_FILE_MAX {
        return false;
    }
    let mut text = String::new();
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|f| f.take(OWNER_FILE_MAX).read_to_string(&mut text));
    if read.is_err() {
        return false;
    }
    let Some(ns) = pid_namespace() else {
        return false;
    };
    let mut owners = 0;
    for line in text.lines() {
        let mut words = line.split(' ');
        let (Some(pid), Some(their_ns), None) = (words.next(), words.next(), words.next()) else {
            return false;
        };
        let (Ok(pid), Ok(their_ns)) = (pid.parse::<u32>(), their_ns.parse::<u64>()) else {
            return false;
        };
        if pid == 0 || their_ns != ns {
            return false;
        }
        owners += 1;
        if Some(pid) != except && process_exists(pid) {
            return false;
        }
    }
    owners > 0
}

/// Whether `pid` is a process that still runs, or still exits: a zombie (killed, not yet
/// reaped by its new parent) has stopped using anything, but only once its last thread is
/// gone. A killed process whose first thread is a zombie while another thread still exits
/// (under load that takes a while: found in CI, 2026-12-05) still holds its descriptors, and
/// its socket still takes connections.
fn process_exists(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    if unsafe { libc::kill(raw, 0) } != 0 {
        // EPERM: it exists (another user's); only ESRCH says it is gone.
        return io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    !(is_zombie(&format!("/proc/{pid}")) && threads_besides_first(pid) == Some(0))
}

/// Whether the task at `/proc/<pid>[/task/<tid>]` is a zombie: the state follows the command
/// name's closing parenthesis in its `stat`.
fn is_zombie(task: &str) -> bool {
    std::fs::read_to_string(format!("{task}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
    })
}

/// How many threads of process `pid` other than its first are still there and not zombies
/// (None when its task list cannot be read).
fn threads_besides_first(pid: u32) -> Option<usize> {
    let first = pid.to_string();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        tasks
            .flatten()
            .map(|t| t.file_name().to_string_lossy().into_owned())
            .filter(|tid| *tid != first && !is_zombie(&format!("/proc/{pid}/task/{tid}")))
            .count(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A base directory of its own for each test.
    fn base(test: &str) -> PathBuf {
        let b = private_dir::default_base().join(format!(
            "oomtrace-socket-dir-test-{test}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&b);
        std::fs::create_dir(&b).unwrap();
        b
    }

    /// A pid that certainly does not exist now: a child that has been reaped.
    fn gone_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn names_of_both_forms_and_nothing_else_are_ours() {
        for ours in ["oomtrace-aB3xYz", "oomtrace-1234-aB3xYz"] {
            assert!(is_our_name(ours), "{ours}");
        }
        for not_ours in [
            "oomtrace-",
            "oomtrace-abc",
            "oomtrace-aB3xYz1",
            "oomtrace--aB3xYz",
            "oomtrace-12a-aB3xYz",
            "oomtrace-it-1-x-0",
            "oomtrace-demo.oomt",
            "xoomtrace-aB3xYz",
        ] {
            assert!(!is_our_name(not_ours), "{not_ours}");
        }
    }

    /// Waits (up to 10 s) until the first thread of `pid` is a zombie.
    fn until_first_thread_is_a_zombie(pid: u32) {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !is_zombie(&format!("/proc/{pid}")) {
            assert!(
                std::time::Instant::now() < end,
                "{pid} never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// A killed process is gone for its directory once it has stopped using anything: a
    /// zombie whose threads are all gone, not one whose first thread is a zombie while
    /// another still runs (its descriptors, the socket among them, are still open).
    #[test]
    fn a_zombie_counts_as_gone_only_once_its_last_thread_is() {
        extern "C" fn pause_forever(_: *mut libc::c_void) -> *mut libc::c_void {
            loop {
                // SAFETY: pause has no preconditions.
                unsafe { libc::pause() };
            }
        }
        // SAFETY: the child only creates a thread and ends its own first thread (glibc's
        // fork leaves malloc usable in the child); the parent reaps it below.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork");
        if child == 0 {
            // SAFETY: a thread running a function that never returns; then this thread
            // alone ends (SYS_exit, not exit_group), leaving the other running.
            unsafe {
                let mut t: libc::pthread_t = std::mem::zeroed();
                if libc::pthread_create(
                    &mut t,
                    std::ptr::null(),
                    pause_forever,
                    std::ptr::null_mut(),
                ) != 0
                {
                    libc::_exit(1);
                }
                libc::syscall(libc::SYS_exit, 0);
            }
            unreachable!("SYS_exit returned");
        }
        let pid = child as u32;
        until_first_thread_is_a_zombie(pid);
        // Read before any assertion: a child left running would hold the test's output open.
        let while_exiting = process_exists(pid);
        // SAFETY: our own child.
        unsafe { libc::kill(child, libc::SIGKILL) };
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while threads_besides_first(pid) != Some(0) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let as_a_zombie = process_exists(pid);
        let mut status = 0;
        // SAFETY: our own child, reaped once.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(while_exiting, "its other thread still ran");
        assert!(
            !as_a_zombie,
            "killed and not reaped: a zombie with no thread left"
        );
        assert!(!process_exists(pid), "reaped");
    }

    #[test]
    fn an_abandoned_directory_is_removed_and_a_live_one_kept() {
        let b = base("abandoned");
        let live = create(&b, "oomtrace-").unwrap();
        let dead = create(&b, "oomtrace-").unwrap();
        // The dead one's owners: this process was its maker (it counts as gone below, as a
        // process about to exit does) and a collector that is gone.
        add_owner(&dead, gone_pid()).unwrap();
        let _listener = UnixListener::bind(dead.join(SOCKET));
        drop(_listener);
        assert!(!remove_if_abandoned(&dead, None), "its maker is alive");
        assert!(remove_if_abandoned(&dead, Some(std::process::id())));
        assert!(!dead.exists());
        assert_eq!(clean_abandoned(&b), 0, "this process owns the other");
        assert!(live.is_dir());
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn only_our_files_are_removed_and_a_listening_socket_is_kept() {
        let b = base("foreign");
        // Something else in it: the directory stays, with that file.
        let other = create(&b, "oomtrace-").unwrap();
        std::fs::write(other.join("notes"), b"x").unwrap();
        // Someone listens: kept whatever the owner file says.
        let listening = create(&b, "oomtrace-").unwrap();
        let listener = UnixListener::bind(listening.join(SOCKET)).unwrap();
        for d in [&other, &listening] {
            std::fs::write(d.join(OWNER_FILE), owner_line(gone_pid())).unwrap();
        }
        assert_eq!(clean_abandoned(&b), 0);
        assert_eq!(names(&other), ["notes"]);
        assert_eq!(names(&listening), [SOCKET, OWNER_FILE]);
        drop(listener);
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn directories_we_cannot_account_for_are_never_touched() {
        let b = base("unknown");
        let gone = gone_pid();
        let mk = |name: &str, owner: Option<String>| {
            let d = b.join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .unwrap();
            if let Some(text) = owner {
                std::fs::write(d.join(OWNER_FILE), text).unwrap();
            }
            d
        };
        mk("oomtrace-noOwnr", None);
        mk("oomtrace-garbge", Some("not a pid\n".into()));
        mk("oomtrace-otherN", Some(format!("{gone} 1\n")));
        mk("oomtrace-emptyO", Some(String::new()));
        mk("someone-aB3xYz", Some(owner_line(gone)));
        let open = mk("oomtrace-opened", Some(owner_line(gone)));
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // A symlink under our name to a directory that would qualify: never followed.
        let target = mk("target", Some(owner_line(gone)));
        std::os::unix::fs::symlink(&target, b.join("oomtrace-linkdd")).unwrap();
        // An owner file that is a symlink.
        let linked = mk("oomtrace-lnkOwn", None);
        std::os::unix::fs::symlink(target.join(OWNER_FILE), linked.join(OWNER_FILE)).unwrap();
        let before = names(&b);
        assert_eq!(clean_abandoned(&b), 0);
        assert_eq!(names(&b), before);
        assert_eq!(names(&target), [OWNER_FILE]);
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn remove_takes_the_socket_owner_file_and_directory_only() {
        let b = base("remove");
        let d = create(&b, "oomtrace-").unwrap();
        let _l = UnixListener::bind(d.join(SOCKET)).unwrap();
        remove(&d.join(SOCKET));
        assert!(!d.exists());
        // Not named as ours: left alone.
        let user = b.join("mine");
        std::fs::create_dir(&user).unwrap();
        std::fs::write(user.join(OWNER_FILE), owner_line(1)).unwrap();
        remove(&user.join(SOCKET));
        assert_eq!(names(&user), [OWNER_FILE]);
        std::fs::remove_dir_all(&b).unwrap();
    }
}
