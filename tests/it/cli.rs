use oomtrace_tests::*;

fn oomtrace(args: &[&str]) -> std::process::Output {
    let dir = scratch("cli");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir).args(args);
    output_within(cmd, TIMEOUT)
}

/// Bad input: exactly one line on stderr, starting "oomtrace:", a non-zero exit, no panic.
pub(crate) fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomtrace: "), "{err}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The bytes of a good trace (its directory is gone once read).
fn good_trace() -> Vec<u8> {
    std::fs::read(run_traced("runtime_basic", &[], &[]).trace).unwrap()
}

#[test]
fn corrupt_and_foreign_files_give_one_clear_line() {
    let dir = scratch("corrupt");
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    assert_one_line_error(
        &oomtrace(&["report", garbage.to_str().unwrap()]),
        "bad magic",
    );

    let mut bytes = good_trace();
    bytes[8] = 99; // format version
    let future = dir.join("future.oomt");
    std::fs::write(&future, &bytes).unwrap();
    assert_one_line_error(
        &oomtrace(&["report", future.to_str().unwrap()]),
        "version 99",
    );

    let mut bytes = good_trace();
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    let flipped = dir.join("flipped.oomt");
    std::fs::write(&flipped, &bytes).unwrap();
    assert_one_line_error(
        &oomtrace(&["report", "--json", flipped.to_str().unwrap()]),
        "corrupt",
    );

    assert_one_line_error(&oomtrace(&["report", "/nonexistent.oomt"]), "cannot open");
}

#[test]
fn truncated_traces_report_what_was_written() {
    let bytes = good_trace();
    let dir = scratch("truncated");
    // Cut inside the last records (the end marker and the connection close).
    let cut = dir.join("cut.oomt");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).unwrap();
    let out = oomtrace(&["report", cut.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("keep_weights"));
    let r = report_json(&cut);
    assert_eq!(r["trace"]["truncated"], true);
    assert_eq!(device(processes(&r)[0], 0)["live_at_exit_bytes"], 28 * MIB);
}

#[test]
fn bad_flags_and_missing_programs_are_one_line() {
    assert_one_line_error(&oomtrace(&["report", "--bogus", "x"]), "--bogus");
    assert_one_line_error(&oomtrace(&["frobnicate"]), "frobnicate");
    let dir = scratch("no-program");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .args(["run", "--", "/nonexistent/program"]);
    let out = output_within(cmd, TIMEOUT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot run"), "{err}");
    assert!(
        traces_in(&dir).is_empty(),
        "a program that never ran leaves no trace"
    );
}

#[test]
fn json_report_has_the_documented_fields() {
    let t = run_traced("runtime_basic", &[], &[]);
    let r = report_json(&t.trace);
    assert_eq!(r["version"], 1);
    let p = processes(&r)[0];
    for k in ["pid", "command", "devices"] {
        assert!(!p[k].is_null(), "process.{k}");
    }
    let d = device(p, 0);
    for k in [
        "device",
        "peak_bytes",
        "live_at_exit_bytes",
        "events",
        "lost_events",
    ] {
        assert!(d[k].is_number(), "device.{k}");
    }
    let f = findings(&r, "live_at_exit")[0];
    for k in [
        "kind",
        "level",
        "pid",
        "device",
        "bytes",
        "growth_bytes_per_step",
        "steps",
        "stack",
    ] {
        assert!(f.get(k).is_some(), "finding.{k}");
    }
    for k in ["function", "file", "line", "module"] {
        assert!(f["stack"][0].get(k).is_some(), "frame.{k}");
    }
    assert!(p["command"].as_str().unwrap().contains("runtime_basic"));
}

/// The newcomer's first command tells the demo's story: the planted leak found live and
/// confirmed at its line, and the OOM it causes blamed on it.
#[test]
fn the_demo_finds_its_planted_leak_and_blames_the_oom_on_it() {
    let dir = scratch("demo");
    let trace = dir.join("demo.oomt");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .arg("demo")
        .arg("--output")
        .arg(&trace);
    let out = output_within(cmd, TIMEOUT);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("[confirmed leak]") && l.contains("keep_history")),
        "{text}"
    );
    // Each step sleeps 60 ms, so the leak (16 MiB a step) grows at most ~267 MiB/s, and the
    // 3 GiB left fill in seconds, not milliseconds (a loop with no pause read "5.67 TiB/s" and
    // "full in 1 ms").
    for l in text.lines() {
        assert!(!l.contains("TiB/s") && !l.contains("GiB/s"), "{l}");
        let full_in_ms = l
            .split("full in ")
            .nth(1)
            .is_some_and(|t| t.split_whitespace().nth(1) == Some("ms"));
        assert!(!full_in_ms, "{l}");
    }
    let r = report_json(&trace);
    assert_eq!(r["findings"][0]["kind"], "oom");
    assert!(
        r["findings"][0]["hint"].as_str().unwrap().contains("leak"),
        "{}",
        r["findings"][0]
    );
    let leaks = findings(&r, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(leaks[0]["level"], "confirmed");
    assert_eq!(functions(leaks[0])[0], "keep_history");
    assert_eq!(leaks[0]["growth_bytes_per_step"], 16.0 * 1048576.0);
}
