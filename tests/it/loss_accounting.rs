//! Every lost event is counted, whatever the path: many processes ending at once into one
//! starved collector (the shim's exit-time flush gives up on it), a collector killed mid-run,
//! a full disk. For each process, the events it made (known: `fault_loss_burst` makes
//! 2 * pairs + 1) are the events received plus `lost_events`, exactly, and a process that
//! exited normally is never called killed. A loss is said in one line with one number.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oomtrace_tests::*;
use serde_json::Value;

use crate::durability::{on_a_tiny_disk, shell_quote, the_trace};

/// `fault_loss_burst`'s events for `pairs`: each allocation, each free, and the device's
/// memory reading at its first allocation.
fn made_by(pairs: u64) -> u64 {
    2 * pairs + 1
}

const EXIT_CODE: i32 = 42;

/// The tests here starve the machine on purpose (or need it not starved): one at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn burst(socket: &std::path::Path, pairs: u64) -> Child {
    burst_command(socket, pairs)
        .spawn()
        .expect("start fault_loss_burst")
}

/// `burst` that, its pairs made, holds on until its standard input is closed: still running,
/// however fast it was, until the test lets it go.
fn burst_held(socket: &std::path::Path, pairs: u64) -> Child {
    burst_command(socket, pairs)
        .arg("hold")
        .stdin(Stdio::piped())
        .spawn()
        .expect("start fault_loss_burst")
}

fn burst_command(socket: &std::path::Path, pairs: u64) -> Command {
    let mut cmd = base_command(scenario("fault_loss_burst"));
    cmd.current_dir(socket.parent().expect("the scratch dir"))
        .args([pairs.to_string(), EXIT_CODE.to_string()])
        .env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill has no memory preconditions; `pid` is a child this test spawned and has
    // not reaped (the collector is reaped only after this thread has ended).
    unsafe { libc::kill(pid as i32, sig) };
}

/// Starves the collector `pid` until `done`: stopped for 2.5 s (past the shim's 2 s wait for
/// the end of its stream), running for 0.3 s, again and again; left running.
fn starve(pid: u32, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut stops = 0;
        while !done.load(Ordering::Acquire) {
            kill(pid, libc::SIGSTOP);
            stops += 1;
            let until = Instant::now() + Duration::from_millis(2500);
            while Instant::now() < until && !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
            }
            kill(pid, libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(300));
        }
        stops
    })
}

/// `procs` processes of `pairs` pairs each, all at once, into one `oomtrace collect` that is
/// stopped and continued while they run and end: each one's events are received or counted.
fn many_processes_into_a_starved_collector(procs: usize, pairs: u64) {
    let _alone = one_at_a_time();
    let start = Instant::now();
    let dir = scratch(&format!("loss-{procs}"));
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = start_collector(&socket, &trace);
    let mut apps: Vec<Child> = (0..procs).map(|_| burst(&socket, pairs)).collect();
    let done = Arc::new(AtomicBool::new(false));
    let starver = starve(collector.id(), done.clone());
    let mut said_early = 0;
    for app in &mut apps {
        let status = wait_within(app, TIMEOUT, "a fault_loss_burst process");
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(app.stderr.as_mut().unwrap(), &mut err);
        assert_eq!(status.code(), Some(EXIT_CODE), "{status:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        if err.contains("its trace ends early") || err.contains("the trace ends early") {
            said_early += 1;
        }
    }
    done.store(true, Ordering::Release);
    let stops = starver.join().expect("the starving thread");
    let ended = start.elapsed();
    signal(&collector, libc::SIGINT);
    let status = wait_within(&mut collector, TIMEOUT, "the collector after SIGINT");
    assert!(status.success(), "collector: {status:?}");
    let stopped = start.elapsed();
    let r = report_json(&trace);
    eprintln!("processes ended after {ended:?}, the collector after {stopped:?}");
    let pids: Vec<u64> = apps.iter().map(|a| u64::from(a.id())).collect();
    let reported = processes(&r);
    assert_eq!(reported.len(), procs, "{:#}", r["processes"]);
    let (mut lost_total, mut cut) = (0, 0);
    for p in reported {
        assert!(pids.contains(&u(&p["pid"])), "a process of ours: {p}");
        let (events, lost) = (u(&p["events"]), u(&p["lost_events"]));
        assert_eq!(
            events + lost,
            made_by(pairs),
            "received + lost is what the process made, exactly: {p}"
        );
        let status = p["status"].as_str().unwrap();
        assert!(
            status == "exited" || status == "exited (end of stream lost)",
            "a process that exited with its own code is said to have exited: {p}"
        );
        if status != "exited" {
            cut += 1;
        }
        lost_total += lost;
    }
    eprintln!(
        "{procs} processes x {} events, collector stopped {stops} times: {lost_total} events \
         lost and counted; {cut} streams cut at their end ({said_early} said so); {:?}",
        made_by(pairs),
        start.elapsed()
    );
    assert!(
        lost_total > 0,
        "a collector stopped for 2.5 s at a time while they run must cost events"
    );
}

#[test]
fn sixty_four_processes_into_a_starved_collector_count_every_lost_event() {
    many_processes_into_a_starved_collector(64, 10_000);
}

#[test]
fn a_hundred_and_twenty_eight_processes_into_a_starved_collector_count_every_lost_event() {
    many_processes_into_a_starved_collector(128, 3_000);
}

/// A collector killed mid-run takes the counts it had not written with it: its trace is
/// still read, no process is called killed, and the report says their last events may be
/// missing instead of claiming a count it cannot know.
#[test]
fn a_killed_collector_leaves_a_readable_trace_that_calls_no_process_killed() {
    let _alone = one_at_a_time();
    let dir = scratch("loss-killed");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = start_collector(&socket, &trace);
    let pairs = 200_000;
    // Held: a fast machine made the pairs before the kill, and the process was called exited.
    let mut apps: Vec<Child> = (0..4).map(|_| burst_held(&socket, pairs)).collect();
    std::thread::sleep(Duration::from_millis(400));
    collector.kill().expect("SIGKILL the collector");
    collector.wait().expect("reap the collector");
    for app in &mut apps {
        drop(app.stdin.take());
    }
    for app in &mut apps {
        let status = wait_within(app, TIMEOUT, "a fault_loss_burst process");
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(app.stderr.as_mut().unwrap(), &mut err);
        assert_eq!(status.code(), Some(EXIT_CODE), "{status:?}: {err}");
        // One number for what was lost: the line at exit.
        let numbers = err
            .lines()
            .filter(|l| l.contains("were not recorded"))
            .count();
        assert!(numbers <= 1, "{err}");
    }
    let r = report_json(&trace);
    let warnings = r["trace"]["warnings"].to_string();
    assert!(!processes(&r).is_empty(), "{r:#}");
    for p in processes(&r) {
        assert_eq!(p["status"], "running when the trace ended", "{p}");
        assert!(
            u(&p["events"]) + u(&p["lost_events"]) <= made_by(pairs),
            "{p}"
        );
        assert!(
            warnings.contains(&format!("process {} was still connected", p["pid"])),
            "{warnings}"
        );
    }
}

/// The number just before `word` in `line` (`...; 1234 events not written`).
fn number_before(line: &str, word: &str) -> u64 {
    let at = line
        .find(word)
        .unwrap_or_else(|| panic!("no `{word}` in {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before `{word}` in {line}"))
}

/// A full disk under `script` (run on a 256 KiB tmpfs, see `durability`): one line says it,
/// with one number, and that number is what the report of the trace counts lost, which
/// with what it received is what the process made.
fn full_disk_said_once_with_the_count(test: &str, script: &str, said_as: &str, trace: &str) {
    let _alone = one_at_a_time();
    let dir = scratch(test);
    let disk = dir.join("disk");
    std::fs::create_dir(&disk).unwrap();
    let pairs = 60_000;
    let script = script
        .replace("{prog}", &shell_quote(&scenario("fault_loss_burst")))
        .replace("{bin}", &shell_quote(&oomtrace_bin()))
        .replace("{args}", &format!("{pairs} {EXIT_CODE}"))
        .replace("{out}", &shell_quote(&dir));
    let out = on_a_tiny_disk(&disk, &script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("rc={EXIT_CODE}")),
        "{err}"
    );
    let said: Vec<&str> = err.lines().filter(|l| l.contains("disk full")).collect();
    assert_eq!(said.len(), 1, "one message: {err}");
    assert!(!err.contains("were not recorded"), "one message: {err}");
    let n = number_before(said[0], said_as);
    let r = report_json(&if trace.is_empty() {
        the_trace(&dir)
    } else {
        dir.join(trace)
    });
    let p = processes(&r)[0];
    assert_eq!(
        u(&p["lost_events"]),
        n,
        "the number said is the one reported: {err}\n{p}"
    );
    assert_eq!(u(&p["events"]) + n, made_by(pairs), "{p}");
    assert!(n > 0, "{p}");
}

#[test]
fn a_full_disk_under_the_shims_own_writer_is_one_line_with_the_count() {
    full_disk_said_once_with_the_count(
        "loss-disk-direct",
        "OOMTRACE_COLLECTOR=/nonexistent/oomtrace PATH=/usr/bin:/bin LD_PRELOAD=\"$OOMTRACE_LIB\" \
         {prog} {args}; echo rc=$?; cp -p *.oomt {out}/",
        " events not written",
        "",
    );
}

#[test]
fn a_full_disk_under_a_standalone_collector_is_one_line_with_the_count() {
    full_disk_said_once_with_the_count(
        "loss-disk-collect",
        "{bin} collect --quiet --exit-when-idle --socket s.sock --output c.oomt 2>/dev/null & \
         n=0; while [ ! -S s.sock ] && [ $n -lt 400 ]; do n=$((n+1)); sleep 0.05; done; \
         OOMTRACE_SOCKET=s.sock LD_PRELOAD=\"$OOMTRACE_LIB\" {prog} {args}; echo rc=$?; wait; \
         cp -p c.oomt {out}/",
        " events of this process were not written",
        "c.oomt",
    );
}
