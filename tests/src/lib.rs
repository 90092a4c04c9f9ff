//! Test harness: runs scenario programs on the simulated CUDA through the real shim, collector
//! and CLI, with a timeout (a hang is a failure, never a stuck CI), and returns the parsed
//! `--json` report.
//!
//! Binaries come from cargo's target directory: `liboomtrace.so` (built because this crate
//! depends on the shim) and `oomtrace`, which the first test to ask for it builds with the same
//! cargo, profile and target directory (a no-op when it is fresh): cargo does not rebuild
//! another package's binary for `cargo test -p oomtrace-tests`, and a stale binary would
//! quietly test yesterday's CLI.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod corpus;
pub mod import_check;

/// Where scenario programs were built (tests/build.rs).
pub const SCENARIO_BIN: &str = env!("OOMTRACE_SCENARIO_BIN");
/// The simulated libcuda.so.1 and libcudart.so.12.
pub const SIM_LIB: &str = env!("OOMTRACE_SIM_LIB");
/// The simulated CUDA's headers (`cuda.h`, `cuda_runtime.h`), for programs a test compiles.
pub const SIM_INCLUDE: &str = env!("OOMTRACE_SIM_INCLUDE");

/// How long any one traced program may take before the test calls it a hang.
pub const TIMEOUT: Duration = Duration::from_secs(60);

fn target_profile_dir() -> PathBuf {
    // .../target/<profile>/deps/<test-binary>
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// The shim: the copy cargo just built into deps/ is the fresh one.
pub fn shim() -> PathBuf {
    let dir = target_profile_dir();
    for p in [dir.join("deps/liboomtrace.so"), dir.join("liboomtrace.so")] {
        if p.is_file() {
            return p;
        }
    }
    panic!("liboomtrace.so not found under {}", dir.display());
}

/// The `oomtrace` binary, built (or found fresh) by cargo on first use in this test process.
pub fn oomtrace_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_oomtrace).clone()
}

/// Runs `cargo build -p oomtrace` for the profile and target directory this test binary was
/// built in. Cargo releases its build lock before it runs tests, so the nested build does not
/// wait on the outer one.
fn build_oomtrace() -> PathBuf {
    let profile_dir = target_profile_dir();
    let target_dir = profile_dir.parent().expect("target dir");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let mut build = Command::new(cargo);
    build
        .current_dir(workspace)
        .args([
            "build",
            "--quiet",
            "-p",
            "oomtrace",
            "-p",
            "oomtrace-shim",
            "--target-dir",
        ])
        .arg(target_dir);
    match profile_dir.file_name().and_then(OsStr::to_str) {
        Some("debug") => {}
        Some("release") => {
            build.arg("--release");
        }
        Some(other) => {
            build.args(["--profile", other]);
        }
        None => panic!("no profile directory in {}", profile_dir.display()),
    }
    let out = build
        .output()
        .expect("run cargo to build the oomtrace binary");
    assert!(
        out.status.success(),
        "building the oomtrace binary failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = profile_dir.join("oomtrace");
    assert!(p.is_file(), "cargo built no {}", p.display());
    p
}

/// Whether a test whose precondition (`ok`) does not hold here may go on. Under CI (`CI` set,
/// as `.ci/run` does) a missing precondition fails the test, so CI never counts a test that
/// checked nothing as passed; elsewhere the test prints one line naming itself and what it
/// `needs` (`skipped: view::x: needs chromium`, shown although libtest captures a passing
/// test's output) and returns early, and is counted: when the test binary exits, after libtest's own summary,
/// one line says how many tests were skipped for want of what (docs/prerequisites.md), so a
/// skip never reads as a pass.
pub fn precondition(ok: bool, needs: &str) -> bool {
    skips::report_at_exit();
    if ok {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none_or(|v| v.is_empty()),
        "this test needs {needs}, and CI must run it"
    );
    // Past libtest's capture (which keeps a passing test's output to itself): the line shows
    // in the run, on its own, beside the test's `... ok`.
    let name = std::thread::current()
        .name()
        .map(|n| format!("{n}: "))
        .unwrap_or_default();
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("skipped: {name}needs {needs}\n").as_bytes(),
    );
    skips::skipped(needs);
    false
}

/// The tests `precondition` skipped in this process, printed in one line at its exit.
///
/// libtest runs every test of a binary in this one process, each on a thread named after the
/// test, and offers no hook after the last one; so the first `precondition` registers a C
/// `atexit` handler. It runs after libtest has printed its summary and flushed stdout: a
/// passing run returns from `main` and a failing one calls `std::process::exit`, and both end
/// in libc's `exit`, which runs the handlers once every test thread is done.
mod skips {
    use std::collections::{BTreeMap, BTreeSet};
    use std::io::Write;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Mutex, Once, PoisonError};

    /// What was missing -> the tests skipped for want of it (libtest names each test's thread
    /// after the test).
    type Skipped = BTreeMap<String, BTreeSet<String>>;

    static SKIPPED: Mutex<Skipped> = Mutex::new(BTreeMap::new());
    static AT_EXIT: Once = Once::new();

    /// The running test's name: libtest names each test's thread after it. A test run on the
    /// main thread (a harness that does not name threads) gets a number of its own: a test
    /// stops at its first missing prerequisite, so it is counted once all the same.
    fn test_name() -> String {
        static UNNAMED: AtomicU32 = AtomicU32::new(0);
        match std::thread::current().name() {
            Some(name) if name != "main" => name.to_string(),
            _ => format!("#{}", UNNAMED.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Registers the line at exit: whenever a test asked for a prerequisite, the run ends
    /// with the count, also when it is 0.
    pub(super) fn report_at_exit() {
        AT_EXIT.call_once(|| {
            // SAFETY: atexit only stores the pointer of a function that lives as long as the
            // process; `print` takes no arguments and never unwinds (it cannot panic: a
            // poisoned lock is taken as is and write errors are ignored).
            let rc = unsafe { libc::atexit(print) };
            assert_eq!(rc, 0, "atexit");
        });
    }

    pub(super) fn skipped(needs: &str) {
        SKIPPED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(needs.to_string())
            .or_default()
            .insert(test_name());
    }

    /// `skipped for a missing prerequisite: N tests (WHAT: K, ...); see docs/prerequisites.md`
    pub(super) fn line(skipped: &Skipped) -> String {
        let tests: BTreeSet<&String> = skipped.values().flatten().collect();
        let mut line = format!(
            "skipped for a missing prerequisite: {} {}",
            tests.len(),
            if tests.len() == 1 { "test" } else { "tests" }
        );
        if !skipped.is_empty() {
            let what: Vec<String> = skipped
                .iter()
                .map(|(needs, tests)| format!("{needs}: {}", tests.len()))
                .collect();
            line += &format!(" ({}); see docs/prerequisites.md", what.join(", "));
        }
        line
    }

    extern "C" fn print() {
        // Every test thread is done by now; try_lock all the same, so that exit never waits.
        let skipped = match SKIPPED.try_lock() {
            Ok(s) => s,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let _ = writeln!(std::io::stderr(), "{}", line(&skipped));
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_line_counts_tests_and_names_what_they_needed() {
            let mut skipped = BTreeMap::new();
            assert_eq!(
                line(&skipped),
                "skipped for a missing prerequisite: 0 tests"
            );
            skipped.insert(
                "chromium".to_string(),
                BTreeSet::from(["view::a".to_string(), "view::b".to_string()]),
            );
            skipped.insert(
                "prometheus".to_string(),
                BTreeSet::from(["metrics::a".to_string()]),
            );
            assert_eq!(
                line(&skipped),
                "skipped for a missing prerequisite: 3 tests (chromium: 2, prometheus: 1); see \
                 docs/prerequisites.md"
            );
        }
    }
}

/// The repository's root (the workspace this crate is in).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

pub fn scenario(name: &str) -> PathBuf {
    Path::new(SCENARIO_BIN).join(name)
}

/// A fresh directory for one test's files, removed when the guard drops: also when the test
/// fails (the panic unwinds through it), so a test run leaves nothing in the temp dir.
/// `OOMTRACE_KEEP_SCRATCH=1` keeps them for debugging.
pub fn scratch(test: &str) -> Scratch {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "oomtrace-it-{}-{}-{}",
        std::process::id(),
        test,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    Scratch(d)
}

/// A test's private directory (see [`scratch`]); derefs to its path.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("OOMTRACE_KEEP_SCRATCH").is_some_and(|v| v == "1") {
            return;
        }
        // Directories made read-only by a test would stop remove_dir_all half-way.
        make_writable(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            make_writable(&e.path());
        }
    }
}

/// A command with the simulated CUDA on the library path and no stray oomtrace settings.
pub fn base_command(program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env("LD_LIBRARY_PATH", SIM_LIB)
        .env_remove("LD_PRELOAD")
        .env_remove("OOMTRACE_SOCKET")
        .env_remove("OOMTRACE_OUTPUT")
        .env_remove("OOMTRACE_DISABLE")
        .env_remove("OOMTRACE_LIB")
        .env("OOMTRACE_LIB", shim())
        .stdin(Stdio::null());
    c
}

/// A scenario under plain `LD_PRELOAD` in `dir` (no `oomtrace run`): the shim starts its own
/// collector, this build's `oomtrace`.
pub fn preloaded(name: &str, dir: &Path) -> Command {
    let mut cmd = base_command(scenario(name));
    cmd.current_dir(dir)
        .env("LD_PRELOAD", shim())
        .env("OOMTRACE_COLLECTOR", oomtrace_bin());
    cmd
}

/// The `.oomt` files in `dir`.
pub fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "oomt"))
        .collect();
    v.sort();
    v
}

/// Runs to completion or kills it after `timeout` and panics: hangs fail loudly.
pub fn output_within(mut cmd: Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
    let pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if done2.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: killing the child we spawned.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        true
    });
    let out = child.wait_with_output().expect("wait");
    done.store(true, Ordering::Relaxed);
    let killed = watchdog.join().unwrap_or(false);
    assert!(!killed, "{cmd:?} hung (killed after {timeout:?})");
    out
}

/// A standalone collector a test started: killed when dropped if it is still running, so a
/// failing test never leaves it behind. Derefs to its `Child`.
pub struct Collector(Option<std::process::Child>);

impl Collector {
    /// Waits for the collector's end and takes its output (it must stop by itself).
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        self.0.take().expect("collector").wait_with_output()
    }
}

impl std::ops::Deref for Collector {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        self.0.as_ref().expect("collector")
    }
}

impl std::ops::DerefMut for Collector {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("collector")
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A standalone `oomtrace collect --quiet` on `socket`, writing `trace`; returns once it
/// listens.
pub fn start_collector(socket: &Path, trace: &Path) -> Collector {
    start_collector_with(socket, trace, &[])
}

/// [`start_collector`] with more `collect` flags.
pub fn start_collector_with(socket: &Path, trace: &Path, flags: &[&str]) -> Collector {
    let child = base_command(oomtrace_bin())
        .args(["collect", "--quiet", "--socket"])
        .arg(socket)
        .arg("--output")
        .arg(trace)
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the collector");
    let child = Collector(Some(child));
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "collector did not listen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// The result of `oomtrace run`.
pub struct Traced {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub report: Value,
    pub trace: PathBuf,
    /// The run's directory (holds `trace`), removed with this.
    pub dir: Scratch,
}

impl Traced {
    /// [`assert_run_said_what_the_trace_says`] of this run.
    pub fn assert_run_said_what_the_trace_says(&self) {
        assert_run_said_what_the_trace_says(
            &self.stderr,
            &self.trace,
            &self.dir.join("report.json"),
        );
    }
}

/// What `oomtrace run` printed and wrote at the end (its collector's report of what it saw)
/// is what its trace file says, byte for byte: the summary in its `stderr` is `oomtrace report
/// --summary TRACE`, the file its `--json` wrote `oomtrace report --summary --json TRACE`.
pub fn assert_run_said_what_the_trace_says(stderr: &str, trace: &Path, json: &Path) {
    let summary = report_output(&["--summary"], &[trace]);
    assert!(
        summary.contains("oomtrace summary") && stderr.contains(&summary),
        "run's summary is not the trace's:\n--- trace's:\n{summary}\n--- run's stderr:\n{stderr}"
    );
    let from_trace = report_output(&["--summary", "--json"], &[trace]);
    let written = std::fs::read_to_string(json).expect("run's JSON");
    if from_trace != written {
        let at = from_trace
            .lines()
            .zip(written.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "run's JSON is not the trace's: first difference at line {}: trace {:?}, run {:?}",
            at + 1,
            from_trace.lines().nth(at),
            written.lines().nth(at)
        );
    }
}

/// `oomtrace run --json J -o T -- scenario args...` with extra environment.
pub fn run_traced(name: &str, args: &[&str], env: &[(&str, &str)]) -> Traced {
    run_traced_with(name, &[], args, env)
}

/// `run_traced` with extra `oomtrace run` flags (before `--`).
pub fn run_traced_with(name: &str, flags: &[&str], args: &[&str], env: &[(&str, &str)]) -> Traced {
    run_traced_within(name, flags, args, env, TIMEOUT)
}

/// `run_traced_with` with another hang limit than [`TIMEOUT`] (a program that is meant to
/// run long).
pub fn run_traced_within(
    name: &str,
    flags: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Traced {
    let dir = scratch(name);
    let trace = dir.join("trace.oomt");
    let json = dir.join("report.json");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("-o")
        .arg(&trace)
        .args(flags)
        .arg("--")
        .arg(scenario(name))
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_within(cmd, timeout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    Traced {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        report: serde_json::from_str(&text).expect("valid JSON report"),
        trace,
        dir,
    }
}

/// Waits for a child we spawned; kills it and fails after `timeout` (a hang is a failure).
pub fn wait_within(child: &mut std::process::Child, timeout: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} hung (killed after {timeout:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `sig` to a child we spawned and have not reaped.
pub fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill has no memory preconditions; the pid is a child we spawned and have not
    // reaped, so it names no other process.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill({sig})");
}

/// The names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// The scenario alone, without oomtrace.
pub fn run_plain(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = base_command(scenario(name));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    output_within(cmd, TIMEOUT)
}

/// `oomtrace report --json FILE`.
pub fn report_json(trace: &Path) -> Value {
    report_json_of(&[trace])
}

/// `oomtrace report --json FILE...` (several files or directories: one merged report).
pub fn report_json_of(traces: &[&Path]) -> Value {
    serde_json::from_str(&report_output(&["--json"], traces)).expect("valid JSON")
}

/// `oomtrace report [FLAGS] FILE...`'s standard output; fails the test if it fails.
pub fn report_output(flags: &[&str], traces: &[&Path]) -> String {
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("report").args(flags).args(traces);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The process entries of a report, by pid.
pub fn processes(report: &Value) -> Vec<&Value> {
    report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .collect()
}

/// One device entry of a process (`-1` = pinned host memory).
pub fn device(process: &Value, device: i64) -> &Value {
    process["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device"].as_i64() == Some(device))
        .unwrap_or_else(|| panic!("no device {device} in {process}"))
}

/// The parent and its forked child of a two-process report: the parent exited normally, the
/// child left with `_exit` (as multiprocessing workers do).
pub fn parent_and_child(report: &Value) -> (&Value, &Value) {
    let procs = processes(report);
    assert_eq!(procs.len(), 2, "{:#}", report["processes"]);
    let parent = procs
        .iter()
        .find(|p| p["status"] == "exited")
        .expect("parent");
    let child = procs
        .iter()
        .find(|p| p["status"] == "exited (_exit)")
        .expect("the child, left with _exit");
    assert_eq!(child["ppid"], parent["pid"]);
    (parent, child)
}

pub fn findings<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// Function names of a finding's stack, innermost first.
pub fn functions(finding: &Value) -> Vec<String> {
    finding["stack"]
        .as_array()
        .expect("stack")
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Live-at-exit bytes per (pid, innermost named function) of a report.
pub fn live_by_function(report: &Value) -> BTreeMap<(u64, String), u64> {
    let mut m = BTreeMap::new();
    for f in findings(report, "live_at_exit") {
        let name = functions(f)
            .into_iter()
            .find(|n| !n.is_empty())
            .unwrap_or_default();
        *m.entry((f["pid"].as_u64().unwrap_or(0), name)).or_default() +=
            f["bytes"].as_u64().unwrap_or(0);
    }
    m
}

/// "function  file:line", as the text report shows a frame (the file's base name).
pub fn frame_text(fr: &Value) -> String {
    let file = fr["file"].as_str().unwrap_or("");
    format!(
        "{}  {}:{}",
        fr["function"].as_str().unwrap_or(""),
        file.rsplit('/').next().unwrap_or(file),
        fr["line"]
    )
}

/// Where `needle` starts in `text`, allowing the text to have wrapped it: any run of spaces in
/// `needle` matches any run of whitespace (newlines and indentation included) in `text`. Text
/// reports wrap lines wider than 200 characters.
pub fn find_wrapped(text: &str, needle: &str) -> Option<usize> {
    let words: Vec<&str> = needle.split_whitespace().collect();
    let first = *words.first()?;
    text.match_indices(first).map(|(i, _)| i).find(|&start| {
        let mut rest = &text[start..];
        words.iter().enumerate().all(|(n, w)| {
            if n > 0 {
                let trimmed = rest.trim_start();
                if trimmed.len() == rest.len() {
                    return false;
                }
                rest = trimmed;
            }
            match rest.strip_prefix(w) {
                Some(r) => {
                    rest = r;
                    true
                }
                None => false,
            }
        })
    })
}

/// The text, from the first line holding `anchor` on, shows the Python frames of the JSON
/// `stack` on consecutive lines, in the JSON's order: every frame of the user's, each run of
/// library frames as one line (`python_frame_texts`).
pub fn assert_text_shows_python_frames(text: &str, anchor: &str, stack: &Value) {
    let expected = python_frame_texts(stack);
    let start = find_wrapped(text, anchor).unwrap_or_else(|| panic!("no `{anchor}` in:\n{text}"));
    let shown: Vec<&str> = text[start..]
        .lines()
        .map(|l| l.trim_start().trim_start_matches("at ").trim_end())
        .collect();
    let first = shown
        .iter()
        .position(|l| *l == expected[0])
        .unwrap_or_else(|| panic!("`{}` not after `{anchor}` in:\n{text}", expected[0]));
    let end = (first + expected.len()).min(shown.len());
    assert_eq!(
        shown[first..end],
        expected[..],
        "after `{anchor}` in:\n{text}"
    );
}

/// How the text report shows the Python frames of a JSON `stack`, in the JSON's order: each
/// of the user's frames (and the culprit, the innermost of them, or the innermost frame where
/// none is the user's) on its line, each run of library frames as one line naming their
/// libraries, `(3 torch.nn frames)` (`report --full` shows them one by one).
fn python_frame_texts(stack: &Value) -> Vec<String> {
    let frames: Vec<&Value> = stack
        .as_array()
        .unwrap()
        .iter()
        .filter(|fr| fr["python"] == true)
        .collect();
    assert!(!frames.is_empty(), "no Python frames in {stack:#}");
    let library =
        |fr: &Value| oomtrace_collector::model::library_name(fr["file"].as_str().unwrap_or(""));
    let culprit = frames
        .iter()
        .position(|fr| library(fr).is_none())
        .unwrap_or(0);
    let mut expected = Vec::new();
    let mut run: (usize, Vec<String>) = (0, Vec::new());
    let flush = |expected: &mut Vec<String>, run: &mut (usize, Vec<String>)| {
        if run.0 > 0 {
            let s = if run.0 == 1 { "" } else { "s" };
            expected.push(format!("({} {} frame{s})", run.0, run.1.join(", ")));
            *run = (0, Vec::new());
        }
    };
    for (i, fr) in frames.iter().enumerate() {
        match library(fr) {
            Some(name) if i != culprit => {
                run.0 += 1;
                if !run.1.contains(&name) {
                    run.1.push(name);
                }
            }
            _ => {
                flush(&mut expected, &mut run);
                expected.push(frame_text(fr));
            }
        }
    }
    flush(&mut expected, &mut run);
    expected
}

/// The text shows the Python frames of the JSON `stack` (runs of library frames folded, as
/// `python_frame_texts` says), on consecutive lines, in the JSON's order, somewhere (findings
/// may share a headline, so no anchor).
pub fn assert_text_has_python_frames(text: &str, stack: &Value) {
    let expected = python_frame_texts(stack);
    let shown: Vec<&str> = text
        .lines()
        .map(|l| l.trim_start().trim_start_matches("at ").trim_end())
        .collect();
    let found = shown
        .windows(expected.len())
        .any(|w| w.iter().zip(&expected).all(|(a, b)| a == b));
    assert!(found, "{expected:#?} not shown in:\n{text}");
}

/// `oomtrace report FILE` (text).
pub fn report_text(trace: &Path) -> String {
    report_text_of(&[trace])
}

/// `oomtrace report FILE...` (text).
pub fn report_text_of(traces: &[&Path]) -> String {
    report_output(&[], traces)
}

pub const MIB: u64 = 1 << 20;

/// Pids of processes whose command line contains every one of `needles`.
pub fn processes_with(needles: &[&str]) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if needles.iter().all(|n| cmdline.contains(n)) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits until `done`, failing the test with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what} (waited {timeout:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child killed (and reaped) when the test ends, also when it fails.
pub struct Guard(pub std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The 1-based line of `file` that contains `marker` (where a test expects a frame).
pub fn line_of(file: &Path, marker: &str) -> u64 {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    let i = text
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in {}", file.display()));
    i as u64 + 1
}
