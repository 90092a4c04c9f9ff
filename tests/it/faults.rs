//! Fault injection: heavy threading, fork under load, exit from a thread, frees from
//! thread-exit destructors, dlclose and RTLD_DEEPBIND, exec, a SIGKILLed program and a
//! SIGSTOPped collector. None may hang, crash or change the program's exit code; the
//! accounting is exact wherever the program's own numbers are.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use oomtrace_tests::*;
use serde_json::Value;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Live-at-exit bytes of `pid` at call sites whose stack passes through `function` (any
/// frame: an allocation seen only at the driver has the runtime's `cudaMalloc` innermost).
fn live_through(report: &Value, pid: u64, function: &str) -> u64 {
    findings(report, "live_at_exit")
        .into_iter()
        .filter(|f| u(&f["pid"]) == pid && functions(f).iter().any(|n| n == function))
        .map(|f| u(&f["bytes"]))
        .sum()
}

/// Stops a standalone collector with SIGINT (it finishes the file) and reads its trace.
fn stop_collector(mut collector: Collector, trace: &std::path::Path) -> Value {
    signal(&collector, libc::SIGINT);
    let status = wait_within(&mut collector, TIMEOUT, "the collector after SIGINT");
    let mut err = String::new();
    if let Some(mut e) = collector.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "collector: {status:?}\n{err}");
    report_json(trace)
}

fn slow_loop_against(socket: &std::path::Path, secs: &str) -> Child {
    base_command(scenario("slow_loop"))
        .arg(secs)
        .env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start slow_loop")
}

/// many_threads: 16 threads, 1000 allocations a round; one block kept per thread at the end.
const THREADS: u64 = 16;
const KEPT_BYTES: u64 = 4096 * (THREADS * (THREADS + 1) / 2);
fn many_threads_allocations(rounds: u64) -> u64 {
    THREADS * rounds * 1000 + THREADS
}

#[test]
fn sixteen_threads_with_cross_thread_frees_are_exact_when_nothing_overflows() {
    // 160k pairs into a queue of 1M events: nothing can be dropped, so every number is exact.
    let rounds = 10;
    let t = run_traced(
        "fault_many_threads",
        &["10"],
        &[("OOMTRACE_BUFFER", "1048576")],
    );
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout, "many_threads: ok\n");
    let procs = processes(&t.report);
    assert_eq!(procs.len(), 1);
    let p = procs[0];
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["lost_events"], 0, "{p}");
    assert_eq!(p["lost_frees"], 0);
    assert_eq!(p["unmatched_frees"], 0);
    let d0 = device(p, 0);
    let allocations = many_threads_allocations(rounds);
    assert_eq!(u(&d0["allocations"]), allocations, "{d0}");
    assert_eq!(u(&d0["frees"]), allocations - THREADS);
    assert_eq!(u(&d0["live_at_exit_bytes"]), KEPT_BYTES);
    assert_eq!(u(&d0["live_at_exit_count"]), THREADS);
    let pid = u(&p["pid"]);
    assert_eq!(
        live_by_function(&t.report).get(&(pid, "keep_one".into())),
        Some(&KEPT_BYTES),
        "{:#?}",
        live_by_function(&t.report)
    );
}

#[test]
fn sixteen_threads_flooding_the_queue_count_every_event_delivered_or_lost() {
    // 800k events from 16 threads on a default-sized queue: on a small machine the drain
    // cannot keep up and events are dropped. Whatever is dropped must be counted: delivered
    // + lost adds up to exactly what the program did. (25 rounds, not the scenario's default
    // 100: 3.2M events take ~10 s in a debug build on 2 cores, with the same outcome.)
    let rounds = 25;
    let t = run_traced("fault_many_threads", &["25"], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout, "many_threads: ok\n");
    let p = processes(&t.report)[0];
    // The program flushed before returning: the goodbye (and the final loss counts) arrived.
    assert_eq!(p["status"], "exited", "{p}");
    let d0 = device(p, 0);
    let allocations = many_threads_allocations(rounds);
    let frees = allocations - THREADS;
    let lost = u(&p["lost_events"]);
    let lost_frees = u(&p["lost_frees"]);
    eprintln!(
        "16 threads x 25k pairs: delivered {} events, lost {lost} ({lost_frees} frees, {} \
         allocations), unmatched frees {}, live at exit {} B in {} (true: {KEPT_BYTES} B in \
         {THREADS})",
        p["events"],
        d0["lost_events"],
        p["unmatched_frees"],
        d0["live_at_exit_bytes"],
        d0["live_at_exit_count"]
    );
    // A lost allocation is counted on its device.
    assert_eq!(u(&d0["allocations"]) + u(&d0["lost_events"]), allocations);
    // Every event (+1: the device-info query at the first sight of device 0) arrived or was
    // counted as lost.
    assert_eq!(u(&p["events"]) + lost, allocations + frees + 1);
    assert!(lost_frees <= lost);
    // Delivered frees (matched or not) + lost frees = the program's frees.
    let delivered_frees = u(&p["events"]) - 1 - u(&d0["allocations"]);
    assert_eq!(delivered_frees + lost_frees, frees);
    if lost == 0 {
        assert_eq!(p["unmatched_frees"], 0);
        assert_eq!(u(&d0["frees"]), frees);
        assert_eq!(u(&d0["live_at_exit_bytes"]), KEPT_BYTES);
    }
}

#[test]
fn fork_while_another_thread_allocates_traces_parent_and_cuda_child_only() {
    let t = run_traced("fault_fork_busy", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert!(
        t.stdout.contains("cuda child ok")
            && t.stdout.contains("plain child ok")
            && t.stdout.contains("children exited 0 3"),
        "{}",
        t.stdout
    );
    // The child that never used CUDA never started tracing: no process entry.
    let (parent, child) = parent_and_child(&t.report);
    for p in [parent, child] {
        assert_eq!(p["lost_events"], 0, "{p}");
        assert_eq!(p["unmatched_frees"], 0, "{p}");
    }
    let pd = device(parent, 0);
    assert_eq!(u(&pd["live_at_exit_bytes"]), 2 * MIB, "{pd}");
    assert_eq!(u(&pd["live_at_exit_count"]), 1);
    // The busy thread freed all it allocated, hundreds of times, across both forks.
    assert!(u(&pd["allocations"]) > 400, "{pd}");
    assert_eq!(u(&pd["frees"]), u(&pd["allocations"]) - 1);
    let cd = device(child, 0);
    assert_eq!(u(&cd["live_at_exit_bytes"]), 5 * MIB);
    // Nothing of the parent's busy thread leaks into the child.
    assert_eq!(u(&cd["allocations"]), 1);
    assert_eq!(u(&cd["frees"]), 0);
    let live = live_by_function(&t.report);
    assert_eq!(
        live.get(&(u(&child["pid"]), "child_keep".into())),
        Some(&(5 * MIB))
    );
    assert_eq!(
        live.get(&(u(&parent["pid"]), "parent_keep".into())),
        Some(&(2 * MIB))
    );
}

#[test]
fn exit_from_a_non_main_thread_passes_its_code_and_completes_the_trace() {
    let t = run_traced("fault_exit_thread", &[], &[]);
    assert_eq!(t.status.code(), Some(5), "{}", t.stderr);
    assert_eq!(t.stdout, "exit_thread: exiting from a thread\n");
    assert_eq!(t.report["trace"]["complete"], true);
    let procs = processes(&t.report);
    assert_eq!(procs.len(), 1);
    let p = procs[0];
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["lost_events"], 0);
    assert_eq!(p["unmatched_frees"], 0);
    let d0 = device(p, 0);
    assert_eq!(u(&d0["live_at_exit_bytes"]), 4 * MIB);
    assert_eq!(u(&d0["allocations"]), 3);
    assert_eq!(u(&d0["frees"]), 1);
    let pid = u(&p["pid"]);
    let live = live_by_function(&t.report);
    assert_eq!(live.get(&(pid, "main_keep".into())), Some(&(3 * MIB)));
    assert_eq!(live.get(&(pid, "thread_keep".into())), Some(&MIB));
}

/// A thread with a 16 KiB stack (glibc's least) allocates with native stacks on: the program
/// runs as untraced, every allocation is recorded, and the thread's without call sites (what a
/// capture may use would not fit), which one line says. Unfixed (a capture's frame alone was
/// 8.5 KiB, and nothing looked at what was left), the traced program died of SIGSEGV.
#[test]
fn a_thread_with_the_smallest_stack_runs_traced_and_is_told_of() {
    let t = run_traced("fault_small_stack", &[], &[]);
    assert!(t.status.success(), "{:?}: {}", t.status, t.stderr);
    assert_eq!(t.stdout, "small_stack: ok\n");
    let said: Vec<&str> = t
        .stderr
        .lines()
        .filter(|l| l.starts_with("oomtrace:") && l.contains("of stack left"))
        .collect();
    assert_eq!(said.len(), 1, "{}", t.stderr);
    assert!(
        said[0].contains("recorded without their call sites"),
        "{}",
        said[0]
    );
    let p = processes(&t.report)[0];
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["lost_events"], 0);
    assert_eq!(p["unmatched_frees"], 0);
    let d0 = device(p, 0);
    assert_eq!(u(&d0["allocations"]), 5, "{d0}");
    assert_eq!(u(&d0["frees"]), 3);
    assert_eq!(u(&d0["live_at_exit_bytes"]), 3 * MIB);
    let pid = u(&p["pid"]);
    let live = live_by_function(&t.report);
    assert_eq!(
        live.get(&(pid, "main_keep".into())),
        Some(&MIB),
        "{live:#?}"
    );
    assert_eq!(live.get(&(pid, "small_keep".into())), None, "{live:#?}");
}

#[test]
fn frees_from_thread_exit_destructors_are_recorded() {
    let t = run_traced("fault_tls_dtor_free", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout, "tls_dtor_free: ok\n");
    let p = processes(&t.report)[0];
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["lost_events"], 0);
    assert_eq!(p["lost_frees"], 0);
    assert_eq!(p["unmatched_frees"], 0);
    assert_eq!(p["failed_frees"], 0);
    let d0 = device(p, 0);
    // 4 threads x (2 key blocks + 1 __thread block) + main's 1 MiB.
    assert_eq!(u(&d0["allocations"]), 13, "{d0}");
    assert_eq!(u(&d0["frees"]), 12);
    assert_eq!(u(&d0["live_at_exit_bytes"]), MIB);
    let pid = u(&p["pid"]);
    let live = live_by_function(&t.report);
    assert_eq!(live.get(&(pid, "main_keep".into())), Some(&MIB));
    for site in ["key_alloc", "var_alloc"] {
        assert_eq!(live_through(&t.report, pid, site), 0, "{live:#?}");
    }
}

#[test]
fn memory_from_a_dlclosed_library_keeps_its_function_name() {
    let plugin = scenario("libfault_plugin.so");
    let t = run_traced("fault_dlclose_main", &[plugin.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let p = processes(&t.report)[0];
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["unmatched_frees"], 0);
    let d0 = device(p, 0);
    assert_eq!(u(&d0["allocations"]), 5, "{d0}");
    assert_eq!(u(&d0["frees"]), 1);
    assert_eq!(u(&d0["live_at_exit_bytes"]), 7 * MIB);
    let pid = u(&p["pid"]);
    let live = live_by_function(&t.report);
    // Symbolized from the module file after the library was unloaded.
    assert_eq!(
        live.get(&(pid, "plugin_alloc".into())),
        Some(&(6 * MIB)),
        "{live:#?}"
    );
    assert_eq!(live.get(&(pid, "main_after".into())), Some(&MIB));
    let f = findings(&t.report, "live_at_exit")
        .into_iter()
        .find(|f| functions(f).first().map(String::as_str) == Some("plugin_alloc"))
        .unwrap();
    assert!(
        f["stack"][0]["module"]
            .as_str()
            .unwrap()
            .ends_with("libfault_plugin.so"),
        "{f}"
    );
    assert!(
        f["stack"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("faults/plugin.c"),
        "{f}"
    );
    assert_eq!(
        functions(f)[1],
        "main",
        "unwound through the unloaded library"
    );
}

/// Was a bug: the shim rescanned modules only when a frame fell outside every known range,
/// so the new library was unwound and attributed with the unloaded one's tables.
#[test]
fn a_library_loaded_where_a_dlclosed_one_was_is_attributed_to_itself() {
    // libfault_second.so is the plugin's code under other names: it lands at the plugin's
    // old address, with the same code at the same offsets.
    let plugin = scenario("libfault_plugin.so");
    let second = scenario("libfault_second.so");
    let t = run_traced(
        "fault_dlclose_main",
        &[plugin.to_str().unwrap(), second.to_str().unwrap()],
        &[],
    );
    assert!(t.status.success(), "{}", t.stderr);
    let p = processes(&t.report)[0];
    let pid = u(&p["pid"]);
    assert_eq!(u(&device(p, 0)["live_at_exit_bytes"]), 10 * MIB);
    let live = live_by_function(&t.report);
    assert_eq!(
        live.get(&(pid, "second_alloc".into())),
        Some(&(3 * MIB)),
        "{}\n{live:#?}",
        t.stdout
    );
    assert_eq!(live.get(&(pid, "plugin_alloc".into())), Some(&(6 * MIB)));
    assert_eq!(live.get(&(pid, "main_after".into())), Some(&MIB));
}

#[test]
fn a_deepbind_library_is_seen_when_the_program_links_the_runtime() {
    let deep = scenario("libfault_deep.so");
    let t = run_traced("fault_deepbind_main", &[deep.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout, "deepbind_main: ok\n");
    let p = processes(&t.report)[0];
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["unmatched_frees"], 0);
    let d0 = device(p, 0);
    assert_eq!(u(&d0["allocations"]), 4, "{d0}");
    assert_eq!(u(&d0["frees"]), 1);
    assert_eq!(u(&d0["live_at_exit_bytes"]), 7 * MIB);
    let pid = u(&p["pid"]);
    // Deep binding takes the library's cudaMalloc past the shim's runtime hook; the driver
    // hook sees the allocation, so the runtime's own cudaMalloc is the innermost frame.
    assert_eq!(live_through(&t.report, pid, "deep_alloc"), 6 * MIB);
    assert_eq!(
        live_by_function(&t.report).get(&(pid, "main_keep".into())),
        Some(&MIB)
    );
}

/// What holds today for a DEEPBIND library that brings its own runtime: the program runs,
/// unharmed, with its exit code (it is just not traced: see the ignored test below).
#[test]
fn a_deepbind_library_with_its_own_runtime_runs_unharmed() {
    let deep = scenario("libfault_deep.so");
    let t = run_traced("fault_deepbind_nolink", &[deep.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert!(!t.stderr.contains("panicked"), "{}", t.stderr);
}

#[test]
#[ignore = "known gap: with RTLD_DEEPBIND and no CUDA in the program's own scope, the \
            library's libcudart resolves cudaMalloc and the driver entry points past the \
            preloaded shim: nothing is recorded"]
fn a_deepbind_library_is_seen_when_it_brings_the_runtime_itself() {
    let deep = scenario("libfault_deep.so");
    let t = run_traced("fault_deepbind_nolink", &[deep.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let procs = processes(&t.report);
    assert_eq!(procs.len(), 1, "{:#}", t.report["processes"]);
    let pid = u(&procs[0]["pid"]);
    assert_eq!(live_through(&t.report, pid, "deep_alloc"), 6 * MIB);
}

/// Both images of an exec'd process: one pid, two process entries (one per connection).
fn exec_images(t: &Traced) -> (Value, Value) {
    let procs = processes(&t.report);
    assert_eq!(procs.len(), 2, "{:#}", t.report["processes"]);
    assert_eq!(procs[0]["pid"], procs[1]["pid"], "exec keeps the pid");
    assert_eq!(procs[0]["ppid"], procs[1]["ppid"]);
    let after = procs
        .iter()
        .find(|p| p["command"].as_str().unwrap().ends_with(" after"))
        .expect("the exec'd image");
    let before = procs
        .iter()
        .find(|p| p["pid"] == after["pid"] && *p != after);
    ((*before.unwrap()).clone(), (*after).clone())
}

#[test]
fn exec_traces_the_new_image_as_a_second_process_with_the_same_pid() {
    // With the program's own oomtrace_flush() before execv, and without: the shim flushes
    // at exec itself, so image 1 is complete either way.
    for args in [&["flush"][..], &[][..]] {
        let t = run_traced("fault_exec_self", args, &[]);
        assert_eq!(t.status.code(), Some(4), "{}", t.stderr);
        assert_eq!(t.stdout, "exec_self: exec\nexec_self: after exec\n");
        let (before, after) = exec_images(&t);
        let pid = u(&after["pid"]);
        // Image 1 never says goodbye (exec runs no atexit handlers); a later image with the
        // same pid and parent tells the report why its stream ended.
        assert_eq!(before["status"], "replaced by exec", "{args:?}");
        let b0 = device(&before, 0);
        assert_eq!(u(&b0["allocations"]), 2, "{args:?}: {b0}");
        assert_eq!(u(&b0["frees"]), 1);
        assert_eq!(u(&b0["live_at_exit_bytes"]), 2 * MIB);
        assert_eq!(after["status"], "exited");
        let a0 = device(&after, 0);
        assert_eq!(u(&a0["allocations"]), 1, "{a0}");
        assert_eq!(u(&a0["live_at_exit_bytes"]), 3 * MIB);
        // Findings carry only the pid, so both images' sites are listed under it.
        let live = live_by_function(&t.report);
        assert_eq!(live.get(&(pid, "before_exec".into())), Some(&(2 * MIB)));
        assert_eq!(live.get(&(pid, "after_exec".into())), Some(&(3 * MIB)));
    }
}

#[test]
fn a_sigkilled_program_is_reported_as_ended_without_goodbye() {
    let dir = scratch("app-sigkill");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let collector = start_collector(&socket, &trace);
    let mut app = slow_loop_against(&socket, "30");
    std::thread::sleep(Duration::from_millis(500));
    app.kill().expect("SIGKILL the program");
    let status = wait_within(&mut app, Duration::from_secs(10), "the killed program");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    // Time to read what waited in the socket before SIGINT ends the collection.
    std::thread::sleep(Duration::from_millis(200));
    let r = stop_collector(collector, &trace);
    assert_eq!(r["trace"]["complete"], true, "{}", r["trace"]);
    let procs = processes(&r);
    assert_eq!(procs.len(), 1, "{:#}", r["processes"]);
    let p = procs[0];
    assert_eq!(u(&p["pid"]), app.id() as u64);
    assert_eq!(p["status"], "ended without goodbye (killed or crashed)");
    assert!(u(&p["events"]) > 0, "{p}");
    assert!(u(&device(p, 0)["allocations"]) > 0, "{p}");
}

#[test]
fn a_stopped_collector_never_holds_the_program_back() {
    let dir = scratch("collector-stop");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let collector = start_collector(&socket, &trace);
    let mut app = slow_loop_against(&socket, "2");
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    signal(&collector, libc::SIGSTOP);
    let status = wait_within(&mut app, Duration::from_secs(30), "the program");
    let took = start.elapsed();
    signal(&collector, libc::SIGCONT);
    let mut out = String::new();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(app.stdout.as_mut().unwrap(), &mut out);
    let _ = std::io::Read::read_to_string(app.stderr.as_mut().unwrap(), &mut err);
    assert_eq!(status.code(), Some(7), "the program's own exit code; {err}");
    assert_eq!(out, "slow_loop: done (allocated)\n");
    assert!(!err.contains("panicked"), "{err}");
    // The collector never came back before the program ended: the shim says the trace ends
    // early (the loss counts can no longer reach the collector).
    assert!(
        err.contains("did not take the end of this process's stream"),
        "{err}"
    );
    // 2 s of work plus at most the shim's bounded exit flush (2.5 s), with slack.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // Time to read what waited in the socket before SIGINT ends the collection.
    std::thread::sleep(Duration::from_millis(500));
    let r = stop_collector(collector, &trace);
    assert_eq!(r["trace"]["complete"], true);
    let procs = processes(&r);
    assert_eq!(procs.len(), 1, "{:#}", r["processes"]);
    let p = procs[0];
    let d0 = device(p, 0);
    eprintln!(
        "collector stopped: program took {took:?}; stderr {err:?}; status {}, events {}, \
         lost {} ({} frees), allocations {}, frees {}, unmatched frees {}, live at exit {} B",
        p["status"],
        p["events"],
        p["lost_events"],
        p["lost_frees"],
        d0["allocations"],
        d0["frees"],
        p["unmatched_frees"],
        d0["live_at_exit_bytes"]
    );
    // It exited: its counter page says so even when its goodbye never reached the collector
    // (never "killed or crashed").
    assert!(
        ["exited", "exited (end of stream lost)"].contains(&p["status"].as_str().unwrap()),
        "{p}"
    );
    // Something of the program reached the collector, delivered or counted as lost. Not
    // necessarily an allocation: on a loaded machine the collector can be stopped before the
    // program's first allocation arrives (waiting for one instead made the stop come after
    // the program's end of stream, which this test is not about).
    assert!(u(&p["events"]) + u(&p["lost_events"]) > 0);
    assert!(u(&p["lost_frees"]) <= u(&p["lost_events"]));
    // What arrived is a prefix of 1 MiB alloc/free pairs: never more than one block live.
    assert!(u(&d0["peak_bytes"]) <= MIB, "{d0}");
    assert!(u(&d0["frees"]) <= u(&d0["allocations"]));
}

/// A collector that stops for a while and comes back: the program is not held back, and the
/// losses of the stall reach the report, counted by kind.
#[test]
fn a_collector_that_stalls_and_resumes_gets_the_loss_counts() {
    let dir = scratch("collector-stall");
    let socket = dir.join("c.sock");
    let trace = dir.join("t.oomt");
    let collector = start_collector(&socket, &trace);
    let start = Instant::now();
    let mut app = slow_loop_against(&socket, "3");
    std::thread::sleep(Duration::from_millis(300));
    // Long enough to fill the queue and the shim's 16 MiB of waiting stream at this rate:
    // a stopped collector is given up on after 250 ms of taking nothing, then events count.
    signal(&collector, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2000));
    signal(&collector, libc::SIGCONT);
    let status = wait_within(&mut app, Duration::from_secs(30), "the program");
    let took = start.elapsed();
    assert_eq!(status.code(), Some(7));
    // The stall cost the program little it can see: 3 s of work, a short wait, a short exit.
    assert!(took < Duration::from_secs(8), "took {took:?}");
    // Let the collector catch up with what waited in the socket.
    std::thread::sleep(Duration::from_secs(2));
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(app.stderr.as_mut().unwrap(), &mut err);
    let r = stop_collector(collector, &trace);
    let p = processes(&r)[0];
    if p["status"] != "exited" {
        // A machine too loaded for the collector to catch up within the shim's 2 s exit
        // bound: then the shim must have said that the trace ends early.
        assert!(
            err.contains("did not take the end of this process's stream")
                || err.contains("could not be delivered within"),
            "{p}\n{err}"
        );
        return;
    }
    let lost = u(&p["lost_events"]);
    eprintln!(
        "stall of 2 s: events {}, lost {lost} ({} frees), unmatched frees {}",
        p["events"], p["lost_frees"], p["unmatched_frees"]
    );
    assert!(
        lost > 0,
        "a 2 s stall at this rate must overflow the queue: {p}"
    );
    // Every lost event is attributed: allocations to their device, frees as frees.
    let d0 = device(p, 0);
    assert!(u(&d0["lost_events"]) + u(&p["lost_frees"]) >= lost, "{p}");
}
