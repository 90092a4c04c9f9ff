//! `oomtrace run` prints the report its collector built from what it saw (`cli/src/handoff.rs`)
//! instead of reading the trace back: the summary and the JSON must be the trace's, byte for
//! byte, whatever the run held. The corpus checks every leak program the same way
//! (tests/it/corpus.rs); here, the other shapes a run can take.

use oomtrace_tests::*;

#[test]
fn runs_of_every_shape_say_what_their_trace_says() {
    // An out-of-memory (the allocator remedies' predictions), two processes (fork), eight
    // threads, two devices, VMM growth, many call sites, the basic runtime calls.
    for (name, args) in [
        ("oom", &[][..]),
        ("fork_child", &[]),
        ("threads", &[]),
        ("multi_device", &[]),
        ("vmm_growth", &[]),
        ("many_sites", &[]),
        ("runtime_basic", &[]),
        // Faults: a busy fork, an exec of itself (two images of one pid, the first never
        // saying goodbye), a thread that exits the process, 25 threads, frees in thread-local
        // destructors.
        ("fault_fork_busy", &[]),
        ("fault_exec_self", &[]),
        ("fault_exit_thread", &[]),
        ("fault_many_threads", &["25"]),
        ("fault_tls_dtor_free", &[]),
    ] {
        let t = run_traced(name, args, &[]);
        t.assert_run_said_what_the_trace_says();
    }
}

#[test]
fn reading_the_trace_back_gives_what_the_collector_handed_over() {
    // `--report-from-trace` takes the old way (and the way when the collector hands nothing
    // over): the same summary.
    let t = run_traced_with("oom", &["--report-from-trace"], &[], &[]);
    t.assert_run_said_what_the_trace_says();
}

#[test]
fn summary_of_several_traces_is_one_line() {
    let a = run_traced("runtime_basic", &[], &[]);
    let b = run_traced("runtime_basic", &[], &[]);
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("report")
        .arg("--summary")
        .arg(&a.trace)
        .arg(&b.trace);
    let out = output_within(cmd, TIMEOUT);
    crate::cli::assert_one_line_error(&out, "--summary reports one trace, not 2");
}
