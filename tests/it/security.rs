//! Files and sockets are private, and the collector only takes data from its own user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use oomtrace_tests::*;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).expect("metadata").mode() & 0o777
}

#[test]
fn traces_and_sockets_are_private() {
    let t = run_traced("runtime_basic", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(mode(&t.trace), 0o600, "trace file");
    let dir = scratch("private-socket");
    let socket = dir.join("c.sock");
    let mut c = start_collector(&socket, &dir.join("t.oomt"));
    assert_eq!(mode(&socket), 0o600, "collector socket");
    // Until a process connects the trace is a temporary file beside its name: private too.
    let tmp: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert_eq!(tmp.len(), 1, "{tmp:?}");
    assert_eq!(
        mode(&tmp[0]),
        0o600,
        "collector trace before the first process"
    );
    let mut app = base_command(scenario("runtime_basic"));
    app.env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", &socket);
    assert!(output_within(app, TIMEOUT).status.success());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let _ = c.wait();
    assert_eq!(mode(&dir.join("t.oomt")), 0o600, "collector trace");
}

#[test]
fn plain_ld_preload_traces_are_private_and_never_replace_a_file() {
    let dir = scratch("private-preload");
    // A symlink where the trace would go is neither followed nor replaced: refused, in one
    // line, and the program runs untraced.
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("t.oomt")).unwrap();
    let out = output_within(
        {
            let mut c = preloaded("runtime_basic", &dir);
            c.env("OOMTRACE_OUTPUT", dir.join("t.oomt"));
            c
        },
        TIMEOUT,
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(dir.join("t.oomt").is_symlink());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a symbolic link"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let traces: Vec<_> = traces_in(&dir)
        .into_iter()
        .filter(|p| !p.is_symlink())
        .collect();
    assert!(traces.is_empty(), "{traces:?}");
    // A free name: the trace is private.
    let out = output_within(
        {
            let mut c = preloaded("runtime_basic", &dir);
            c.env("OOMTRACE_OUTPUT", dir.join("mine.oomt"));
            c
        },
        TIMEOUT,
    );
    assert!(out.status.success());
    assert_eq!(mode(&dir.join("mine.oomt")), 0o600);
}

/// Needs root to act as another user: skipped with a line outside CI, a failure under it.
#[test]
fn the_collector_refuses_peers_of_another_user() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !precondition(root, "root, to run a client as another user") {
        return;
    }
    let dir = scratch("peercred");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.join("c.sock");
    let trace = dir.join("t.oomt");
    let mut c = start_collector(&socket, &trace);
    // Let anybody reach the socket, so only SO_PEERCRED stands in the way.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut app = base_command(scenario("runtime_basic"));
    app.env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", &socket)
        .env("OOMTRACE_OUTPUT", "/dev/null/none")
        .current_dir(&dir)
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::null());
    let out = output_within(app, TIMEOUT);
    assert!(
        out.status.success(),
        "the program must not notice: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let _ = c.wait();
    // Not a byte of it was taken: no process ever got in, so no trace was even written.
    assert!(
        !trace.exists(),
        "a process of another user got into the trace: {}",
        report_json(&trace)
    );
}

/// Whether `user` (uid and gid) can open `path` for reading, asked of a process running as
/// that user (`head -c1`), not guessed from the mode bits.
fn readable_by(uid: u32, path: &std::path::Path) -> bool {
    let mut c = std::process::Command::new("head");
    c.arg("-c1")
        .arg(path)
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c.status().is_ok_and(|s| s.success())
}

/// Everything oomtrace writes holds the traced command line: under the usual umask 022 a
/// secret on it (`--api-key=...`) must not be readable by another user in any of the
/// outputs, only in files whose modes the user chose (an existing file it replaces).
/// The modes are checked as this user; the reads as another user need root (skipped with a
/// line outside CI, a failure under it).
#[test]
fn reports_views_and_exports_holding_the_command_line_are_private() {
    let dir = scratch("private-outputs");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    const SECRET: &str = "--api-key=s3cr3t-0f-the-user";
    let run = |args: &[&str]| {
        let mut c = base_command("sh");
        c.current_dir(&dir)
            .arg("-c")
            .arg("umask 022; exec \"$@\"")
            .arg("sh")
            .arg(oomtrace_bin())
            .args(args);
        output_within(c, TIMEOUT)
    };
    let program = scenario("runtime_basic");
    let out = run(&[
        "run",
        "-o",
        "r.oomt",
        "--json",
        "r.json",
        "--html",
        "run.html",
        "--",
        program.to_str().unwrap(),
        SECRET,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read_to_string(dir.join("r.json"))
            .unwrap()
            .contains(SECRET),
        "the report holds the command line (else this test checks nothing)"
    );
    for args in [
        &["view", "r.oomt", "-o", "v.html"][..],
        &["view", "r.oomt"],
        &["export", "-f", "chrome", "r.oomt", "-o", "e.json"],
        &["export", "-f", "json", "r.oomt"],
        &["export", "-f", "folded", "r.oomt"],
        &["export", "-f", "memory-viz", "r.oomt"],
    ] {
        let out = run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let written: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(written.len() >= 9, "{written:?}");
    for p in &written {
        assert_eq!(mode(p), 0o600, "{} is readable by others", p.display());
    }
    // An existing file the user made readable keeps its mode when replaced: their choice.
    let shared = dir.join("shared.json");
    std::fs::write(&shared, "old").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        run(&["export", "-f", "json", "r.oomt", "-o", "shared.json"])
            .status
            .success()
    );
    assert_eq!(mode(&shared), 0o644);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !precondition(root, "root, to read the outputs as another user") {
        return;
    }
    assert!(
        readable_by(65534, &shared),
        "the check itself must be able to read a 0644 file"
    );
    for p in written {
        assert!(!readable_by(65534, &p), "another user read {}", p.display());
    }
}

/// A setuid program that loads the library (by `dlopen`: the way it arrives where the loader
/// ignores `LD_PRELOAD`, like `/etc/ld.so.preload` or a plugin), run by another user whose
/// environment names a cache directory: the shim's constructor and its lazy start do nothing
/// at all. Named `python3` so that the constructor's Python preparation would act; setuid to
/// a third user (daemon), not root. Needs root to make it.
#[test]
fn a_setuid_program_gets_nothing_from_the_shim() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !precondition(
        root,
        "root, to make a setuid program and run it as another user",
    ) {
        return;
    }
    let dir = scratch("setuid");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe = dir.join("python3");
    std::fs::copy(scenario("secure_dlopen"), &exe).unwrap();
    let lib = dir.join("liboomtrace.so");
    std::fs::copy(shim(), &lib).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Owned by daemon (uid 1), setuid: run by nobody, its effective uid is 1: AT_SECURE.
    std::os::unix::fs::chown(&exe, Some(1), Some(1)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let cache = dir.join("cache");
    std::fs::create_dir(&cache).unwrap();
    // Writable by anyone: a shim that acted would leave its files here.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = base_command(&exe);
    c.arg(&lib)
        .current_dir(&dir)
        .env_remove("OOMTRACE_LIB")
        .env_remove("OOMTRACE_TORCH")
        .env_remove("PYTHONPATH")
        .env("XDG_CACHE_HOME", &cache)
        .env("HOME", &cache)
        .env("OOMTRACE_OUTPUT", dir.join("t.oomt"))
        .env("OOMTRACE_COLLECTOR", oomtrace_bin())
        .uid(65534)
        .gid(65534);
    let out = output_within(c, TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("PYTHONPATH=(unset)"), "{stdout}");
    assert!(stdout.contains("OOMTRACE_TORCH=(unset)"), "{stdout}");
    assert!(stdout.contains("OOMTRACE_LIB=(unset)"), "{stdout}");
    assert!(stderr.is_empty(), "the shim said something: {stderr}");
    let left: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(
        left.is_empty(),
        "files made in the caller's cache: {left:?}"
    );
    assert_eq!(names_in(&dir), ["cache", "liboomtrace.so", "python3"]);
}
