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
