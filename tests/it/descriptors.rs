//! The shim writes to, and closes, only its own descriptors. A program that closes every
//! descriptor above 2 after its first CUDA calls (a `close` loop, `close_range`, `closefrom`)
//! and then opens its own file, socketpair or pipe gets the numbers that were free, maybe the
//! one the shim's connection had; the program (`faults/close_all.c`) writes its own data, keeps
//! allocating so that the shim has plenty to send, then checks its data byte for byte and exits
//! with 42. Run hundreds of times, a few at once, under plain `LD_PRELOAD` (the shim's own
//! collector), `oomtrace run`, `oomtrace collect` + `OOMTRACE_SOCKET`, and with no collector at
//! all (the shim's own trace file). Every run: the program's data and exit code are its own;
//! what the shim could not deliver is said once and counted, and the trace says the stream
//! ended early rather than ending as if complete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use oomtrace_tests::*;
use serde_json::Value;

/// Allocate/free pairs after the program opened its own descriptors (about 0.4 MB of events
/// for the shim to send into them).
const PAIRS: u64 = 3000;
/// Pairs made before the program closes everything.
const FIRST_PAIRS: u64 = 100;
/// Programs running at once.
const AT_ONCE: usize = 4;

/// How the program closes every descriptor above 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CloseAll {
    /// `close` on every number below the soft RLIMIT_NOFILE.
    Loop,
    /// `close_range(3, ~0U, 0)`.
    Range,
    /// `closefrom(3)`.
    From,
}

/// What the program opens afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Own {
    File,
    Socketpair,
    Pipe,
}

impl CloseAll {
    fn arg(self) -> &'static str {
        match self {
            CloseAll::Loop => "loop",
            CloseAll::Range => "range",
            CloseAll::From => "from",
        }
    }
}

impl Own {
    fn arg(self) -> &'static str {
        match self {
            Own::File => "file",
            Own::Socketpair => "socketpair",
            Own::Pipe => "pipe",
        }
    }
}

/// One way the program closes everything and what it opens afterwards.
#[derive(Clone, Copy, Debug)]
struct Variant {
    how: CloseAll,
    what: Own,
    /// Close everything only once the first calls were delivered (the connection exists);
    /// otherwise right away, while it may still be in the making.
    wait: bool,
}

/// Every variant, in turn: run `i` is `variant(i)`.
fn variant(i: usize) -> Variant {
    const HOW: [CloseAll; 3] = [CloseAll::Loop, CloseAll::Range, CloseAll::From];
    const WHAT: [Own; 3] = [Own::File, Own::Socketpair, Own::Pipe];
    Variant {
        how: HOW[i % 3],
        what: WHAT[(i / 3) % 3],
        // One run in five closes everything while the shim may still be connecting.
        wait: i % 5 != 4,
    }
}

fn args(v: Variant) -> Vec<String> {
    let mut a = vec![
        v.how.arg().to_string(),
        v.what.arg().to_string(),
        PAIRS.to_string(),
    ];
    if !v.wait {
        a.push("nowait".into());
    }
    a
}

/// What one run of the program left: its exit status and output, its directory.
struct RunResult {
    variant: Variant,
    out: Output,
    dir: PathBuf,
    /// The program's pid (None under `oomtrace run`, where it is a grandchild).
    pid: Option<u32>,
}

impl RunResult {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// The program ran as if untraced: exit code 42, its own message, its file holding exactly
    /// its own bytes. (The program itself checked its socketpair and pipe byte for byte.)
    /// Err: how it was harmed.
    fn unharmed(&self) -> Result<(), String> {
        let err = self.stderr();
        if self.out.status.code() != Some(42) {
            return Err(format!(
                "{:?}: the program's exit code changed: {:?}\n{err}",
                self.variant, self.out.status
            ));
        }
        if self.out.stdout != b"close_all: ok\n" {
            return Err(format!("{:?}: stdout {:?}", self.variant, self.out.stdout));
        }
        if self.variant.what == Own::File {
            let data = std::fs::read(self.dir.join("close_all.data")).expect("the program's file");
            let text = String::from_utf8_lossy(&data);
            let pid = self.pid.map(|p| p.to_string());
            let pid = pid.as_deref().unwrap_or("");
            if !(text.starts_with(&format!("first part of {pid}"))
                && text.ends_with("'s own data|second part, after the allocations|")
                && text.matches('|').count() == 2)
            {
                return Err(format!(
                    "{:?}: the program's file holds {} bytes: {:?}",
                    self.variant,
                    data.len(),
                    &text[..text.len().min(200)]
                ));
            }
        }
        if err.contains("panick") {
            return Err(err);
        }
        Ok(())
    }

    /// Whether the shim said it lost its connection because the program took the descriptor,
    /// and then how many events it could not deliver (once each, with a number).
    fn taken_and_lost(&self, mode: &str) -> Option<u64> {
        let err = self.stderr();
        let taken: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("the program closed or replaced"))
            .collect();
        assert!(taken.len() <= 1, "{mode}: said more than once:\n{err}");
        taken.first()?;
        let counted: Vec<u64> = err
            .lines()
            .filter_map(|l| {
                l.strip_prefix("oomtrace: ")?
                    .strip_suffix(" events were not recorded (see above)")?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(counted.len(), 1, "{mode}: one count of the loss:\n{err}");
        Some(counted[0])
    }
}

/// Every run left the program unharmed; otherwise how many were harmed, and how.
fn assert_all_unharmed(mode: &str, runs: &[RunResult]) {
    let harmed: Vec<String> = runs.iter().filter_map(|r| r.unharmed().err()).collect();
    assert!(
        harmed.is_empty(),
        "{mode}: {} of {} runs harmed the program; the first:\n{}",
        harmed.len(),
        runs.len(),
        harmed[..harmed.len().min(3)].join("\n---\n")
    );
}

/// Runs `make(i)` for `i` in 0..runs, `AT_ONCE` at a time.
fn run_all(runs: usize, make: impl Fn(usize) -> RunResult + Sync) -> Vec<RunResult> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..AT_ONCE {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= runs {
                    break;
                }
                let r = make(i);
                results.lock().unwrap().push((i, r));
            });
        }
    });
    let mut v = results.into_inner().unwrap();
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, r)| r).collect()
}

fn run_dir(base: &Path, i: usize) -> PathBuf {
    let d = base.join(format!("run-{i}"));
    std::fs::create_dir_all(&d).expect("run dir");
    d
}

/// The program with `cmd`'s setup, in `dir`, within the hang limit.
fn spawn_program(mut cmd: Command, dir: PathBuf, v: Variant) -> RunResult {
    cmd.current_dir(&dir)
        .args(args(v))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("start close_all");
    let pid = child.id();
    let out = wait_output(child, &format!("close_all {v:?}"));
    RunResult {
        variant: v,
        out,
        dir,
        pid: Some(pid),
    }
}

/// `wait_with_output` with the hang limit (a program stuck on a pipe full of someone else's
/// bytes is a failure, not a stuck test).
fn wait_output(child: std::process::Child, what: &str) -> Output {
    let pid = child.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() > TIMEOUT {
                    // SAFETY: kill has no memory preconditions; the child is not reaped yet.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            false
        })
    };
    let out = child.wait_with_output().expect("wait");
    done.store(true, Ordering::Relaxed);
    assert!(!watch.join().unwrap_or(false), "{what} hung");
    out
}

/// Events the program makes: every allocation and free, and the device query at the first
/// sight of device 0.
const EVENTS: u64 = 2 * (FIRST_PAIRS + PAIRS) + 1;

/// The report's process for each run, checked against what the shim said: a stream the
/// program took ended early (not "exited", as if complete) and the shim counted a loss; a
/// stream it did not take is complete.
fn check_report(mode: &str, report: &Value, runs: &[RunResult]) -> (usize, u64) {
    let procs = processes(report);
    assert_eq!(procs.len(), runs.len(), "{mode}: one process per run");
    let mut taken = 0;
    let mut lost_total = 0;
    for r in runs {
        let p = match r.pid {
            Some(pid) => *procs
                .iter()
                .find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
                .unwrap_or_else(|| panic!("{mode}: no process {pid} in the report")),
            None => procs[0],
        };
        check_process(mode, r, p, &mut taken, &mut lost_total);
    }
    (taken, lost_total)
}

fn check_process(mode: &str, r: &RunResult, p: &Value, taken: &mut usize, lost_total: &mut u64) {
    let events = p["events"].as_u64().expect("events");
    match r.taken_and_lost(mode) {
        Some(lost) => {
            *taken += 1;
            *lost_total += lost;
            assert!(lost > 0, "{mode}: {}", r.stderr());
            // The counter page (item 2 of the loss accounting) reaches the collector whatever
            // became of the stream: delivered + lost in the report is all there was, exactly,
            // also for what sat unsent in the shim when the program took its descriptor.
            let reported_lost = p["lost_events"].as_u64().expect("lost_events");
            assert_eq!(
                events + reported_lost,
                EVENTS,
                "{mode} {:?}: {p}",
                r.variant
            );
            if r.variant.wait {
                // Everything before the close was delivered (the program waited for it): the
                // shim's own count is the report's.
                assert_eq!(reported_lost, lost, "{mode} {:?}: {p}", r.variant);
            } else {
                assert!(lost <= reported_lost, "{mode}: {p}");
            }
            assert_eq!(
                p["status"],
                "exited (end of stream lost)",
                "{mode} {:?}: a stream the program took must not look complete: {p}\n{}",
                r.variant,
                r.stderr()
            );
        }
        None => {
            assert_eq!(
                p["status"],
                "exited",
                "{mode} {:?}: {p}\n{}",
                r.variant,
                r.stderr()
            );
            assert_eq!(p["lost_events"], 0, "{mode}: {p}");
            assert_eq!(events, EVENTS, "{mode} {:?}: {p}", r.variant);
        }
    }
}

fn summary(mode: &str, runs: &[RunResult], taken: usize, lost: u64) {
    eprintln!(
        "{mode}: {} runs, all unharmed; the program took the shim's descriptor in {taken} \
         (the shim went untraced, {lost} events counted lost in all)",
        runs.len()
    );
}

#[test]
fn under_ld_preload_the_programs_descriptors_stay_its_own() {
    let base = scratch("fd-preload");
    let runs = run_all(100, |i| {
        let dir = run_dir(&base, i);
        let cmd = preloaded("fault_close_all", &dir);
        spawn_program(cmd, dir, variant(i))
    });
    assert_all_unharmed("LD_PRELOAD", &runs);
    // The shim's own collector outlives the program: it finishes the trace (writes it under
    // a temporary name, then gives it its name) after the end of the stream arrives.
    wait_until(
        "each run's collector finishes its trace",
        std::time::Duration::from_secs(20),
        || runs.iter().all(|r| !traces_in(&r.dir).is_empty()),
    );
    let traces: Vec<PathBuf> = runs.iter().flat_map(|r| traces_in(&r.dir)).collect();
    assert_eq!(traces.len(), runs.len(), "one trace per run");
    let paths: Vec<&Path> = traces.iter().map(PathBuf::as_path).collect();
    let (taken, lost) = check_report("LD_PRELOAD", &report_json_of(&paths), &runs);
    assert!(
        taken > 0,
        "no run took the shim's descriptor: the test tests nothing"
    );
    summary("LD_PRELOAD", &runs, taken, lost);
}

#[test]
fn under_oomtrace_run_the_programs_descriptors_stay_its_own() {
    let base = scratch("fd-run");
    let runs = run_all(60, |i| {
        let dir = run_dir(&base, i);
        let v = variant(i);
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(&dir)
            .args(["run", "--json", "report.json", "-o", "trace.oomt", "--"])
            .arg(scenario("fault_close_all"))
            .args(args(v))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("oomtrace run");
        let out = wait_output(child, &format!("oomtrace run close_all {v:?}"));
        RunResult {
            variant: v,
            out,
            dir,
            pid: None,
        }
    });
    assert_all_unharmed("run", &runs);
    let (mut taken, mut lost) = (0, 0);
    for r in &runs {
        let text = std::fs::read_to_string(r.dir.join("report.json")).expect("run's JSON report");
        let report: Value = serde_json::from_str(&text).expect("JSON");
        let procs = processes(&report);
        assert_eq!(procs.len(), 1, "{report:#}");
        check_process("run", r, procs[0], &mut taken, &mut lost);
    }
    assert!(
        taken > 0,
        "no run took the shim's descriptor: the test tests nothing"
    );
    summary("run", &runs, taken, lost);
}

#[test]
fn through_oomtrace_collect_the_programs_descriptors_stay_its_own() {
    let base = scratch("fd-collect");
    let socket = base.join("collector.sock");
    let trace = base.join("all.oomt");
    let mut collector = start_collector(&socket, &trace);
    let runs = run_all(100, |i| {
        let dir = run_dir(&base, i);
        let mut cmd = base_command(scenario("fault_close_all"));
        cmd.env("LD_PRELOAD", shim())
            .env("OOMTRACE_SOCKET", &socket);
        spawn_program(cmd, dir, variant(i))
    });
    signal(&collector, libc::SIGINT);
    let status = wait_within(&mut collector, TIMEOUT, "the collector after SIGINT");
    assert!(status.success(), "collector: {status:?}");
    assert_all_unharmed("collect", &runs);
    let (taken, lost) = check_report("collect", &report_json(&trace), &runs);
    assert!(
        taken > 0,
        "no run took the shim's descriptor: the test tests nothing"
    );
    summary("collect", &runs, taken, lost);
}

#[test]
fn without_a_collector_the_shims_own_trace_file_survives_the_program_closing_it() {
    // No collector can start: the shim writes the trace file itself. The program closes that
    // file's descriptor too; the shim reopens its own file (the same one: device and inode)
    // and the trace is complete.
    let base = scratch("fd-direct");
    let runs = run_all(30, |i| {
        let dir = run_dir(&base, i);
        let mut cmd = preloaded("fault_close_all", &dir);
        cmd.env("OOMTRACE_COLLECTOR", "/nonexistent/oomtrace")
            .env("OOMTRACE_LOG", "1");
        spawn_program(cmd, dir, variant(i))
    });
    assert_all_unharmed("direct file", &runs);
    let mut reopened = 0;
    for r in &runs {
        let err = r.stderr();
        assert!(err.contains("writing the trace directly"), "{err}");
        assert!(r.taken_and_lost("direct file").is_none(), "{err}");
        reopened += usize::from(err.contains("opened it again"));
    }
    assert!(
        reopened > 0,
        "no run closed the shim's trace file: the test tests nothing"
    );
    let traces: Vec<PathBuf> = runs.iter().flat_map(|r| traces_in(&r.dir)).collect();
    assert_eq!(traces.len(), runs.len(), "one trace per run");
    let paths: Vec<&Path> = traces.iter().map(PathBuf::as_path).collect();
    let (taken, _) = check_report("direct file", &report_json_of(&paths), &runs);
    assert_eq!(taken, 0);
}

#[test]
fn with_a_tiny_descriptor_limit_the_shims_descriptor_stays_low_and_is_still_guarded() {
    // A soft RLIMIT_NOFILE of 16: no room to move the descriptor high (the limit is never
    // raised); it stays where it was made, and the program is unharmed all the same.
    use std::os::unix::process::CommandExt;
    let base = scratch("fd-tiny");
    let runs = run_all(9, |i| {
        let dir = run_dir(&base, i);
        let mut cmd = preloaded("fault_close_all", &dir);
        // SAFETY: getrlimit and setrlimit are async-signal-safe; the closure touches nothing
        // else. The hard limit stays as it is.
        unsafe {
            cmd.pre_exec(|| {
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                lim.rlim_cur = lim.rlim_max.min(16);
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        spawn_program(cmd, dir, variant(i))
    });
    assert_all_unharmed("RLIMIT_NOFILE 16", &runs);
    let taken = runs
        .iter()
        .filter(|r| r.taken_and_lost("RLIMIT_NOFILE 16").is_some())
        .count();
    assert!(
        taken > 0,
        "no run took the shim's descriptor: the test tests nothing"
    );
}
