//! Destroy nothing, lose nothing silently: the collector's socket and trace file never replace
//! what is not theirs, a full disk is said in one line and recorded in the trace, outputs that
//! are not regular files are refused, and a FIFO given to `report` is refused, not read.
//!
//! Device nodes are made with `mknod` in each test's own directory, never the system's: that
//! needs root (CI runs as root). The full disk is a real 256 KiB tmpfs, mounted in a private
//! mount namespace (`unshare`).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oomtrace_tests::*;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `mknod PATH c MAJOR MINOR`; fails the test with a clear message without root.
fn mknod(path: &Path, major: u32, minor: u32) {
    let out = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .output()
        .expect("run mknod");
    assert!(
        out.status.success(),
        "these tests need root to make device nodes in their own directory (mknod: {})",
        stderr(&out).trim()
    );
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn collect(args: &[&Path]) -> Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(["collect", "--quiet", "--exit-when-idle", "--socket"])
        .arg(args[0])
        .arg("--output")
        .arg(args[1]);
    output_within(cmd, TIMEOUT)
}

#[test]
fn collect_replaces_only_a_stale_socket() {
    let dir = scratch("socket-rules");
    let trace = dir.join("t.oomt");
    // A regular file where the socket should go: refused, kept.
    let file = dir.join("file.sock");
    std::fs::write(&file, b"the user's").unwrap();
    let out = collect(&[&file, &trace]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("regular file, not a socket"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert_eq!(std::fs::read(&file).unwrap(), b"the user's");
    // A symlink: refused, kept, its target untouched.
    let link = dir.join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let out = collect(&[&link, &trace]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // A live socket: refused, and its listener keeps it.
    let live = dir.join("live.sock");
    let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let out = collect(&[&live, &trace]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already listening"),
        "{}",
        stderr(&out)
    );
    assert!(std::os::unix::net::UnixStream::connect(&live).is_ok());
    drop(listener);
    // Now stale (nobody listens): replaced, and the collector runs.
    let socket = live;
    let mut c = start_collector(&socket, &trace);
    let mut app = base_command(scenario("runtime_basic"));
    app.env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", &socket);
    assert!(output_within(app, TIMEOUT).status.success());
    // SAFETY: signalling the collector we started.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    assert!(c.wait().unwrap().success());
    assert_eq!(processes(&report_json(&trace)).len(), 1);
    // No trace was ever written for the refused starts; the file and the link are kept.
    assert_eq!(names_in(&dir), ["file.sock", "link.sock", "t.oomt"]);
}

#[test]
fn collect_refuses_outputs_that_are_not_regular_files_and_leaves_no_socket() {
    let dir = scratch("output-rules");
    let socket = dir.join("c.sock");
    let null = dir.join("null");
    mknod(&null, 1, 3);
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let target = dir.join("target.oomt");
    std::fs::write(&target, b"kept").unwrap();
    let link = dir.join("link.oomt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for (out_path, says) in [
        (&null, "character device"),
        (&fifo, "FIFO"),
        (&link, "symbolic link"),
        (&dir.to_path_buf(), "directory"),
    ] {
        let out = collect(&[&socket, out_path]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{says}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
        assert!(!socket.exists(), "a refused output leaves no socket");
    }
    assert!(std::fs::symlink_metadata(&null)
        .unwrap()
        .file_type()
        .is_char_device());
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(std::fs::read(&target).unwrap(), b"kept");
    assert_eq!(names_in(&dir), ["fifo", "link.oomt", "null", "target.oomt"]);
}

#[test]
fn collect_touches_an_existing_output_only_when_a_process_connects() {
    let dir = scratch("output-placement");
    let socket = dir.join("c.sock");
    let trace = dir.join("t.oomt");
    std::fs::write(&trace, b"the previous trace").unwrap();
    // Nobody connects (a probe that sends nothing is not a process): the old file is as it
    // was, no temporary file is left, and the collector says why there is no trace.
    let child = base_command(oomtrace_bin())
        .args(["collect", "--socket"])
        .arg(&socket)
        .arg("--output")
        .arg(&trace)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the collector");
    let start = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(start.elapsed() < TIMEOUT, "the collector did not listen");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: signalling the collector we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("oomtrace: no traced process connected; no trace written"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&trace).unwrap(), b"the previous trace");
    assert_eq!(names_in(&dir), ["t.oomt"]);
    // A traced process connects: now the trace replaces the old file (collect's default).
    let mut c = start_collector(&socket, &trace);
    let mut app = base_command(scenario("runtime_basic"));
    app.env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", &socket);
    assert!(output_within(app, TIMEOUT).status.success());
    // SAFETY: signalling the collector we started.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    assert!(c.wait().unwrap().success());
    assert_eq!(processes(&report_json(&trace)).len(), 1);
    assert_eq!(names_in(&dir), ["t.oomt"]);
}

/// `collect` says where it wrote the trace when it stops, as `run` does: with `--no-clobber`
/// beside an existing file that is a name the user did not give.
#[test]
fn collect_says_where_it_wrote_the_trace() {
    let dir = scratch("collect-says-where");
    let socket = dir.join("c.sock");
    let trace = dir.join("t.oomt");
    std::fs::write(&trace, b"the previous trace").unwrap();
    let child = base_command(oomtrace_bin())
        .args(["collect", "--no-clobber", "--exit-when-idle", "--socket"])
        .arg(&socket)
        .arg("--output")
        .arg(&trace)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the collector");
    let mut c = Guard(child);
    let start = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(start.elapsed() < TIMEOUT, "the collector did not listen");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut app = base_command(scenario("runtime_basic"));
    app.env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", &socket);
    assert!(output_within(app, TIMEOUT).status.success());
    let status = wait_within(&mut c.0, TIMEOUT, "the collector");
    assert!(status.success());
    let mut err = String::new();
    use std::io::Read;
    c.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let written = dir.join("t.1.oomt");
    let line = format!(
        "oomtrace: trace written to {}; details: oomtrace report {}",
        written.display(),
        written.display()
    );
    assert!(err.lines().any(|l| l == line), "{line:?} not in:\n{err}");
    assert_eq!(processes(&report_json(&written)).len(), 1);
    assert_eq!(std::fs::read(&trace).unwrap(), b"the previous trace");
}

#[test]
fn oomtrace_output_that_is_a_device_is_refused_in_one_line_and_nothing_is_written_beside_it() {
    let dir = scratch("output-device");
    let full = dir.join("full");
    mknod(&full, 1, 7);
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let target = dir.join("target.oomt");
    std::fs::write(&target, b"kept").unwrap();
    let link = dir.join("link.oomt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for (output, what) in [
        (&full, "a character device, not a regular file"),
        (&fifo, "a FIFO, not a regular file"),
        (&link, "a symbolic link"),
    ] {
        let mut cmd = preloaded("runtime_basic", &dir);
        cmd.env("OOMTRACE_OUTPUT", output);
        let out = output_within(cmd, TIMEOUT);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "runtime_basic: ok\n");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("not tracing: the output {}", output.display())),
            "{err}"
        );
        assert!(err.contains(what), "{err}");
    }
    assert_eq!(
        names_in(&dir),
        ["fifo", "full", "link.oomt", "target.oomt"],
        "no full.1, no temporary files"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"kept");
    assert!(std::fs::symlink_metadata(&full)
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn report_and_export_refuse_a_fifo_instead_of_blocking() {
    let dir = scratch("report-fifo");
    let fifo = dir.join("t.oomt");
    mkfifo(&fifo);
    for args in [
        vec!["report", fifo.to_str().unwrap()],
        vec![
            "export",
            fifo.to_str().unwrap(),
            "--format",
            "json",
            "-o",
            "-",
        ],
    ] {
        let mut cmd = base_command(oomtrace_bin());
        cmd.args(&args);
        let out = output_within(cmd, TIMEOUT);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("it is a FIFO, not a trace file"), "{err}");
    }
}

/// Runs `sh -c script` in a private mount namespace with a 256 KiB tmpfs mounted on `dir`
/// (`unshare` as root, or with a user namespace otherwise). The script runs in `dir`.
pub(super) fn on_a_tiny_disk(dir: &Path, script: &str) -> Output {
    let mount = format!(
        "mount -t tmpfs -o size=256k oomtrace-test {d} && cd {d}",
        d = shell_quote(dir)
    );
    let mut tries = vec![vec!["-m"], vec!["--user", "--map-root-user", "-m"]];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        tries.reverse();
    }
    let mut why = Vec::new();
    for flags in tries {
        // First a probe: can this kind of namespace mount a tmpfs here?
        let probe = base_command("unshare")
            .args(&flags)
            .args(["sh", "-c", &mount])
            .output()
            .expect("run unshare");
        if !probe.status.success() {
            why.push(format!(
                "unshare {}: {}",
                flags.join(" "),
                stderr(&probe).trim()
            ));
            continue;
        }
        let mut cmd = base_command("unshare");
        cmd.args(&flags)
            .args(["sh", "-c", &format!("{mount} || exit 1; {script}")])
            .env("OOMTRACE_COLLECTOR", oomtrace_bin())
            .env("OOMTRACE_LIB", shim());
        return output_within(cmd, TIMEOUT);
    }
    panic!("a tiny disk needs `unshare -m` (root) or user namespaces: {why:?}");
}

/// Shell: waits until no process in the working directory runs `oomtrace collect
/// --exit-when-idle` (the shim's detached collector finishing the trace). Reads /proc, so it
/// needs no procps; the pattern's brackets keep it from matching this script's own shell.
pub(super) const WAIT_FOR_COLLECTORS_HERE: &str = r#"here=$(pwd -P); n=0; while [ $n -lt 300 ]; do
    busy=; for p in /proc/[0-9]*; do
      [ "$(readlink $p/cwd 2>/dev/null)" = "$here" ] || continue;
      tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q '[-]-exit-when-idle' && busy=1;
    done; [ -z "$busy" ] && break; n=$((n+1)); sleep 0.1; done;"#;

pub(super) fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// The one trace file left in `dir` after the tmpfs is gone (copied out by the script).
pub(super) fn the_trace(dir: &Path) -> PathBuf {
    let traces = traces_in(dir);
    assert_eq!(traces.len(), 1, "{:?}", names_in(dir));
    traces[0].clone()
}

#[test]
fn a_full_disk_under_ld_preload_is_said_and_recorded_in_the_trace() {
    let dir = scratch("disk-full-preload");
    let disk = dir.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let script = format!(
        "LD_PRELOAD=\"$OOMTRACE_LIB\" {prog} 1; echo rc=$?; {wait} cp -p *.oomt {out}/",
        prog = shell_quote(&scenario("slow_loop")),
        wait = WAIT_FOR_COLLECTORS_HERE,
        out = shell_quote(&dir),
    );
    let out = on_a_tiny_disk(&disk, &script);
    let err = stderr(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=7"),
        "{err}"
    );
    // One line says what was lost and why: the file, the cause, this process's events.
    let said: Vec<&str> = err.lines().filter(|l| l.contains("disk full")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].starts_with("oomtrace: the trace /") && said[0].contains(".oomt is incomplete"),
        "names the file: {err}"
    );
    assert!(
        said[0].contains("is incomplete: disk full (No space left on device); ")
            && said[0].contains(" events of this process were not written"),
        "{err}"
    );
    let r = report_json(&the_trace(&dir));
    let unwritten = r["trace"]["incomplete"]["unwritten_events"]
        .as_u64()
        .unwrap();
    assert!(unwritten > 0, "{:#}", r["trace"]);
    assert!(
        said[0].contains(&format!("; {unwritten} events of this process")),
        "the process hears the count the trace records: {err}"
    );
    let warnings = r["trace"]["warnings"].to_string();
    assert!(
        warnings.contains("the trace stops at ")
            && warnings.contains(": disk full (No space left on device); ")
            && warnings.contains(&format!("{unwritten} events")),
        "{warnings}"
    );
    assert_eq!(r["trace"]["complete"], false, "{:#}", r["trace"]);
    assert_eq!(
        r["trace"]["incomplete"]["cause"], "disk_full",
        "{:#}",
        r["trace"]
    );
    let p = processes(&r)[0];
    assert!(p["status"].as_str().unwrap().contains("disk full"), "{p:#}");
    assert!(
        !r["trace"]["warnings"].to_string().contains("was killed"),
        "the report names the full disk, not a killed writer: {:#}",
        r["trace"]
    );
}

/// `oomtrace run [FLAGS] -o t.oomt --json DIR/r.json -- slow_loop 1` on a tiny full disk
/// (the JSON report, and whatever `extra` writes to DIR, outside it: what is checked is the
/// summary, not whether a second file fits). Returns the scratch dir, the run's stderr and
/// its report; the program's own exit code (7) is checked.
fn run_on_a_full_disk(
    test: &str,
    flags: &str,
    after: &str,
) -> (Scratch, String, serde_json::Value) {
    let dir = scratch(test);
    let disk = dir.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let script = format!(
        "{bin} run -o t.oomt --json {out}/r.json {flags} -- {prog} 1; echo rc=$?; {after}",
        bin = shell_quote(&oomtrace_bin()),
        prog = shell_quote(&scenario("slow_loop")),
        out = shell_quote(&dir),
        after = after.replace("{out}", &shell_quote(&dir)),
        flags = flags.replace("{out}", &shell_quote(&dir)),
    );
    let out = on_a_tiny_disk(&disk, &script);
    let err = stderr(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=7"),
        "{err}"
    );
    let r = serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    (dir, err, r)
}

#[test]
fn a_full_disk_under_run_does_not_claim_the_trace_was_written() {
    let (_dir, err, r) = run_on_a_full_disk("disk-full-run", "", "cp -p t.oomt {out}/");
    assert!(!err.contains("trace written to"), "{err}");
    assert!(err.contains("is incomplete"), "{err}");
    assert!(err.contains("disk full"), "{err}");
    assert!(err.contains("cut short"), "{err}");
    assert_eq!(
        r["trace"]["incomplete"]["cause"], "disk_full",
        "{:#}",
        r["trace"]
    );
    assert!(
        r["trace"]["incomplete"]["unwritten_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
}

/// The metrics say a full disk too: the writer's failure and the events it could not write,
/// as many as the report counts.
#[test]
fn a_full_disk_shows_in_the_collectors_health_metrics() {
    let (dir, _err, r) =
        run_on_a_full_disk("disk-full-metrics", "--metrics-textfile {out}/m.prom", "");
    let unwritten = r["trace"]["incomplete"]["unwritten_events"]
        .as_u64()
        .unwrap_or_else(|| panic!("{:#}", r["trace"]));
    assert!(unwritten > 0);
    let text = std::fs::read_to_string(dir.join("m.prom")).unwrap();
    for line in [
        "oomtrace_collector_trace_write_failures_total 1".to_string(),
        format!("oomtrace_collector_unwritten_events_total {unwritten}"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

#[test]
fn a_full_disk_for_the_shims_own_file_is_said_and_recorded() {
    let dir = scratch("disk-full-direct");
    let disk = dir.join("disk");
    std::fs::create_dir(&disk).unwrap();
    // No collector can start: the shim writes the trace itself.
    let script = format!(
        "OOMTRACE_COLLECTOR=/nonexistent/oomtrace PATH=/usr/bin:/bin LD_PRELOAD=\"$OOMTRACE_LIB\" \
         {prog} 1; echo rc=$?; cp -p *.oomt {out}/",
        prog = shell_quote(&scenario("slow_loop")),
        out = shell_quote(&dir),
    );
    let out = on_a_tiny_disk(&disk, &script);
    let err = stderr(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=7"),
        "{err}"
    );
    let said: Vec<&str> = err.lines().filter(|l| l.contains("disk full")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains(".oomt is incomplete: disk full (No space left on device); ")
            && said[0].contains(" events not written"),
        "{err}"
    );
    let r = report_json(&the_trace(&dir));
    assert!(
        processes(&r)[0]["status"]
            .as_str()
            .unwrap()
            .contains("disk full"),
        "{r:#}"
    );
    assert_eq!(
        r["trace"]["incomplete"]["cause"], "disk_full",
        "{:#}",
        r["trace"]
    );
}

#[test]
fn a_full_disk_under_a_standalone_collector_is_said_by_it_and_to_each_process() {
    let dir = scratch("disk-full-collect");
    let disk = dir.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let script = format!(
        "{bin} collect --exit-when-idle --socket s.sock --output c.oomt 2>collector.err & \
         n=0; while [ ! -S s.sock ] && [ $n -lt 400 ]; do n=$((n+1)); sleep 0.05; done; \
         OOMTRACE_SOCKET=s.sock LD_PRELOAD=\"$OOMTRACE_LIB\" {prog} 1; echo rc=$?; wait; \
         cp -p c.oomt collector.err {out}/",
        bin = shell_quote(&oomtrace_bin()),
        prog = shell_quote(&scenario("slow_loop")),
        out = shell_quote(&dir),
    );
    let out = on_a_tiny_disk(&disk, &script);
    let err = stderr(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rc=7"),
        "{err}"
    );
    // The process hears what it lost, on its own stderr.
    let said: Vec<&str> = err.lines().filter(|l| l.contains("disk full")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("c.oomt is incomplete: disk full")
            && said[0].contains("events of this process were not written"),
        "{err}"
    );
    // The collector says it once when it happens, and its summary does not pass for the file.
    let collector = std::fs::read_to_string(dir.join("collector.err")).unwrap();
    let said: Vec<&str> = collector
        .lines()
        .filter(|l| l.contains("is incomplete: disk full"))
        .collect();
    assert_eq!(said.len(), 1, "{collector}");
    assert!(
        collector.contains("c.oomt holds less: the trace stops at"),
        "{collector}"
    );
    let r = report_json(&dir.join("c.oomt"));
    assert_eq!(r["trace"]["incomplete"]["cause"], "disk_full", "{r:#}");
}
