use std::path::Path;

use oomtrace_tests::*;
use serde_json::Value;

fn oomtrace(args: &[&str]) -> std::process::Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(args);
    output_within(cmd, TIMEOUT)
}

fn stdout_of(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_str(&stdout_of(out)).expect("valid JSON")
}

/// The innermost function of a stack-bearing entry.
fn first_function(v: &Value) -> String {
    functions(v).into_iter().next().unwrap_or_default()
}

/// (function, bytes, count) of each peak consumer.
fn consumers(s: &Value) -> Vec<(String, u64, u64)> {
    s["peak_consumers"]
        .as_array()
        .expect("peak_consumers")
        .iter()
        .map(|c| {
            (
                first_function(c),
                c["bytes"].as_u64().unwrap(),
                c["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn site_order(trace: &Path, sort: Option<&str>) -> Vec<String> {
    let mut args = vec!["report", "--json"];
    if let Some(s) = sort {
        args.extend(["--sort", s]);
    }
    let t = trace.to_str().unwrap();
    args.push(t);
    let r = json_of(&oomtrace(&args));
    r["sections"][0]["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .map(first_function)
        .collect()
}

/// runtime_basic: 3 x 8 MiB weights and one 4 MiB cache kept, then 100 x 1 MiB allocated and
/// freed at once; no step markers, so the run is one step and all 100 are temporary. The peak
/// (29 MiB) is reached with one temporary live: the peak consumers say so, where the live-at-
/// exit list cannot.
#[test]
fn report_sections_have_the_numbers_of_a_known_program() {
    let t = run_traced("runtime_basic", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let r = report_json(&t.trace);
    assert_eq!(r["version"], 1, "the contract's version is unchanged");
    let sections = r["sections"].as_array().expect("sections");
    assert_eq!(sections.len(), 1, "{sections:?}");
    let s = &sections[0];
    assert_eq!(s["device"], 0);
    assert_eq!(s["memory"], "device");
    let tot = &s["totals"];
    assert_eq!(tot["allocations"], 104);
    assert_eq!(tot["frees"], 100);
    assert_eq!(tot["temporary"], 100);
    assert_eq!(tot["bytes_allocated"], 128 * MIB);
    assert_eq!(tot["peak_bytes"], 29 * MIB);
    assert_eq!(tot["live_at_exit_bytes"], 28 * MIB);
    assert_eq!(tot["live_at_exit_count"], 4);
    assert_eq!(tot["steps"], 0);
    assert_eq!(
        consumers(s),
        vec![
            ("keep_weights".to_string(), 24 * MIB, 3),
            ("keep_cache".to_string(), 4 * MIB, 1),
            ("temporaries".to_string(), MIB, 1),
        ]
    );
    let most = &s["most_allocations"];
    assert_eq!(first_function(&most[0]), "temporaries");
    assert_eq!(most[0]["allocations"], 100);
    assert_eq!(most[0]["bytes_allocated"], 100 * MIB);
    let temp = s["most_temporary"].as_array().expect("most_temporary");
    assert_eq!(temp.len(), 1, "only one site frees what it allocates");
    assert_eq!(first_function(&temp[0]), "temporaries");
    assert_eq!(temp[0]["temporary"], 100);
    let hist: Vec<(u64, u64, u64, u64)> = s["size_histogram"]
        .as_array()
        .expect("size_histogram")
        .iter()
        .map(|b| {
            (
                b["min_bytes"].as_u64().unwrap(),
                b["max_bytes"].as_u64().unwrap(),
                b["count"].as_u64().unwrap(),
                b["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hist,
        vec![
            (MIB, 2 * MIB - 1, 100, 100 * MIB),
            (4 * MIB, 8 * MIB - 1, 1, 4 * MIB),
            (8 * MIB, 16 * MIB - 1, 3, 24 * MIB),
        ]
    );
    // Every site row carries a stable key and its stack; the table sorted by what is live
    // at exit still lists every site, those with nothing left last.
    let keys: Vec<&str> = s["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(keys[0].starts_with("keep_weights <- "), "{keys:?}");
    assert!(keys[1].starts_with("keep_cache <- "), "{keys:?}");
    assert!(keys[2].starts_with("temporaries <- "), "{keys:?}");

    let text = report_text(&t.trace);
    for needle in [
        "Sections: pid ",
        "totals: 104 allocations, 100 frees (100 temporary), 128.00 MiB allocated in total, \
         peak 29.00 MiB",
        "28.00 MiB in 4 live at exit",
        "peak consumers (held at the peak):",
        "24.00 MiB in     3  keep_weights",
        "1.00 MiB in     1  temporaries",
        "100 allocations, 100.00 MiB in total  temporaries",
        "100 of     100 allocations  temporaries",
        "[1.00 MiB, 2.00 MiB)      100 allocations  100.00 MiB",
        "call sites (by end):",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

#[test]
fn sort_orders_the_call_site_table() {
    let t = run_traced("runtime_basic", &[], &[]);
    let by_end = site_order(&t.trace, None);
    // Sorting never filters: `temporaries` holds nothing at exit and comes last.
    assert_eq!(
        by_end,
        ["keep_weights", "keep_cache", "temporaries"],
        "default: live at exit"
    );
    assert_eq!(site_order(&t.trace, Some("end")), by_end);
    assert_eq!(
        site_order(&t.trace, Some("count")),
        ["temporaries", "keep_weights", "keep_cache"]
    );
    assert_eq!(
        site_order(&t.trace, Some("peak")),
        ["keep_weights", "keep_cache", "temporaries"]
    );
    // No step markers: every growth is 0, so ties go by peak, and nothing is left out.
    assert_eq!(
        site_order(&t.trace, Some("growth")),
        ["keep_weights", "keep_cache", "temporaries"]
    );
    let text = stdout_of(&oomtrace(&[
        "report",
        "--sort",
        "count",
        t.trace.to_str().unwrap(),
    ]));
    assert!(text.contains("call sites (by count):"), "{text}");
    let out = oomtrace(&["report", "--sort", "size", t.trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("peak, end, count or growth"), "{err}");
}

/// leak_late keeps 2 MiB a step from step 30 on: with 60 steps it leaks 60 MiB at
/// retain_after_switch; with CORPUS_STEPS=30 the same binary never reaches the switch and is
/// clean. Its other call sites are the same code with the same stacks, and must match.
#[test]
fn diff_shows_a_leak_appear_and_disappear() {
    let leaky = run_traced("leak_late", &[], &[]);
    let clean = run_traced("leak_late", &[], &[("CORPUS_STEPS", "30")]);
    assert!(leaky.status.success() && clean.status.success());
    let (l, c) = (leaky.trace.to_str().unwrap(), clean.trace.to_str().unwrap());

    let fwd = json_of(&oomtrace(&["diff", "--json", c, l]));
    assert_eq!(fwd["version"], 1);
    assert_eq!(fwd["before"], c);
    assert_eq!(fwd["after"], l);
    assert_eq!(fwd["threshold"]["percent"], 10.0);
    assert_eq!(fwd["regression"], true);
    let appeared = fwd["findings"]["appeared"].as_array().unwrap();
    assert!(
        appeared
            .iter()
            .any(|f| f["kind"] == "leak" && f["name"] == "retain_after_switch"),
        "{appeared:?}"
    );
    assert!(fwd["findings"]["disappeared"]
        .as_array()
        .unwrap()
        .is_empty());
    let sites = fwd["sites"].as_array().unwrap();
    let leak = &sites[0];
    assert_eq!(leak["name"], "retain_after_switch", "most changed first");
    assert_eq!(leak["status"], "new");
    assert_eq!(leak["before"], Value::Null);
    assert_eq!(leak["after"]["live_at_exit_bytes"], 60 * MIB);
    assert_eq!(leak["live_at_exit_delta_bytes"], 60 * MIB);
    assert_eq!(leak["regression"], true);
    assert!(leak["after"]["growth_per_step"].as_f64().unwrap() > 0.0);
    // The shared skeleton matched across the two runs: nothing else is new or gone.
    for s in &sites[1..] {
        assert!(
            s["status"] == "same" || s["status"] == "changed",
            "unmatched site: {s}"
        );
        assert_eq!(s["regression"], false, "{s}");
    }
    let dev = &fwd["devices"][0];
    assert_eq!(dev["device"], 0);
    assert_eq!(dev["before_live_at_exit_bytes"], 0);
    assert_eq!(dev["after_live_at_exit_bytes"], 60 * MIB);

    let back = json_of(&oomtrace(&["diff", "--json", l, c]));
    assert_eq!(back["regression"], false, "{back}");
    assert!(back["findings"]["appeared"].as_array().unwrap().is_empty());
    assert!(back["findings"]["disappeared"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["kind"] == "leak" && f["name"] == "retain_after_switch"));
    assert_eq!(back["sites"][0]["status"], "gone");

    let text = stdout_of(&oomtrace(&["diff", c, l]));
    assert!(text.contains("+ leak at retain_after_switch"), "{text}");
    assert!(text.contains("REGRESSION"), "{text}");
    let text = stdout_of(&oomtrace(&["diff", l, c]));
    assert!(text.contains("- leak at retain_after_switch"), "{text}");
    assert!(text.contains("No regression."), "{text}");

    // Exit codes: 0 without the flag, 3 with it when AFTER regressed, 0 the other way.
    assert_eq!(oomtrace(&["diff", c, l]).status.code(), Some(0));
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", c, l])
            .status
            .code(),
        Some(3)
    );
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", l, c])
            .status
            .code(),
        Some(0)
    );
    // A run against itself changes nothing.
    let same = json_of(&oomtrace(&["diff", "--json", "--fail-on-regression", l, l]));
    assert_eq!(same["regression"], false);
    assert!(same["sites"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["status"] == "same"));
}

/// A byte threshold: the 60 MiB leak passes a 1 GiB limit on sizes, but its new leak finding
/// is still a regression; a 1 MiB limit catches the sizes too.
#[test]
fn diff_threshold_in_bytes() {
    let leaky = run_traced("leak_late", &[], &[]);
    let clean = run_traced("leak_late", &[], &[("CORPUS_STEPS", "30")]);
    let (l, c) = (leaky.trace.to_str().unwrap(), clean.trace.to_str().unwrap());
    let loose = json_of(&oomtrace(&["diff", "--json", "--threshold", "1GiB", c, l]));
    assert_eq!(loose["threshold"]["bytes"], 1u64 << 30);
    let reasons: Vec<&str> = loose["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["new leak finding at retain_after_switch on device 0"],
        "{loose}"
    );
    let tight = json_of(&oomtrace(&["diff", "--json", "--threshold", "1MiB", c, l]));
    assert!(
        tight["regressions"].as_array().unwrap().len() >= 3,
        "{tight}"
    );
    let out = oomtrace(&["diff", "--threshold", "ten", c, l]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn diff_refuses_bad_input_in_one_line() {
    let dir = scratch("diff-bad");
    let good = run_traced("runtime_basic", &[], &[]);
    let g = good.trace.to_str().unwrap();
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    let fifo = dir.join("fifo.oomt");
    let cpath = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let missing = dir.join("missing.oomt");
    for (args, needle) in [
        (vec![g, missing.to_str().unwrap()], "cannot open"),
        (vec![garbage.to_str().unwrap(), g], "garbage.oomt"),
        (vec![g, fifo.to_str().unwrap()], "FIFO"),
        (vec![g], "AFTER"),
    ] {
        let mut all = vec!["diff"];
        all.extend(args);
        let out = oomtrace(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{all:?}: {err}");
        assert!(err.starts_with("oomtrace: "), "{err}");
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        assert!(out.stdout.is_empty(), "{all:?}");
    }
}

/// leak_history keeps 2 MiB every step, marked: its growth per step, between the first and
/// the last marker, is exactly 2 MiB; `--sort growth` orders the table by it.
#[test]
fn growth_per_step_is_measured_between_markers() {
    let t = run_traced("leak_history", &[], &[("CORPUS_MARKERS", "1")]);
    assert!(t.status.success(), "{}", t.stderr);
    let r = json_of(&oomtrace(&[
        "report",
        "--json",
        "--sort",
        "growth",
        t.trace.to_str().unwrap(),
    ]));
    let s = &r["sections"][0];
    assert_eq!(s["sort"], "growth");
    assert_eq!(s["totals"]["steps"], 60);
    let sites = s["sites"].as_array().unwrap();
    let growth: Vec<f64> = sites
        .iter()
        .map(|r| r["growth_per_step"].as_f64().unwrap())
        .collect();
    assert!(growth.windows(2).all(|w| w[0] >= w[1]), "{growth:?}");
    let history = sites
        .iter()
        .find(|r| first_function(r) == "history_append")
        .expect("history_append in the table");
    assert_eq!(history["growth_per_step"].as_f64(), Some((2 * MIB) as f64));
    assert_eq!(history["live_at_exit_bytes"], 120 * MIB);
}

/// leak_then_eval on a 1 GiB device (see the scenario): `args` are its leak and evaluation
/// sizes in MiB.
fn leak_then_eval(args: &[&str]) -> Traced {
    let t = run_traced("leak_then_eval", args, &[("SIMCUDA_MEMORY", "1GiB")]);
    assert!(t.trace.is_file(), "{args:?}: no trace\n{}", t.stderr);
    t
}

/// The demo's story: the leak left too little room for the evaluation buffer (an OOM); the
/// fix lets it fit, and the device's peak goes up. That is the work the fix made possible:
/// the leak and the OOM are gone (improvements), the peaks are not compared (one line says
/// why), and `--fail-on-regression` passes. The other way round, the new leak and OOM are
/// regressions.
#[test]
fn diff_knows_a_fix_that_raised_the_peak() {
    let before = leak_then_eval(&["2", "768"]);
    let after = leak_then_eval(&["0", "768"]);
    assert!(before.stdout.contains("out of memory"), "{}", before.stdout);
    assert!(after.stdout.contains("allocated"), "{}", after.stdout);
    let (b, a) = (
        before.trace.to_str().unwrap(),
        after.trace.to_str().unwrap(),
    );

    let d = json_of(&oomtrace(&["diff", "--json", b, a]));
    assert_eq!(d["regression"], false, "{d}");
    assert!(d["regressions"].as_array().unwrap().is_empty(), "{d}");
    let dev = &d["devices"][0];
    assert!(
        dev["after_peak_bytes"].as_u64() > dev["before_peak_bytes"].as_u64(),
        "the fix raised the peak: {dev}"
    );
    assert_eq!(dev["regression"], false);
    assert_eq!(d["peaks_compared"], false);
    assert_eq!(d["live_at_exit_compared"], false);
    assert_eq!(d["before_work"]["steps"], 60);
    assert_eq!(d["after_work"]["steps"], 60);
    assert_eq!(d["before_work"]["out_of_memory"], 1);
    assert_eq!(d["after_work"]["out_of_memory"], 0);
    let why = d["not_compared"].as_str().expect("a reason");
    assert!(why.contains("BEFORE ran out of memory"), "{why}");
    let improvements: Vec<&str> = d["improvements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert!(
        improvements.contains(&"leak at keep_history (device 0) is gone"),
        "{improvements:?}"
    );
    assert!(
        improvements.contains(&"oom at evaluate (device 0) is gone"),
        "{improvements:?}"
    );
    let eval = d["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "evaluate")
        .expect("evaluate among the sites");
    assert_eq!(eval["regression"], false, "{eval}");

    let out = oomtrace(&["diff", "--fail-on-regression", b, a]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout_of(&out));
    let text = stdout_of(&out);
    assert!(!text.contains("REGRESSION"), "{text}");
    assert!(text.contains("No regression."), "{text}");
    assert!(text.contains("\nImprovements (2)\n"), "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not compared"))
        .collect();
    assert_eq!(lines.len(), 1, "one line says why: {text}");
    assert!(lines[0].contains("BEFORE ran out of memory"), "{text}");
    // Growth is a rate with a unit: the leak's site gave up 2 MiB a step.
    assert!(text.contains("growth -2.00 MiB/step"), "{text}");
    assert!(!text.contains("2097152"), "{text}");

    // Undoing the fix brings back the leak and the OOM: regressions, exit 3.
    let back = json_of(&oomtrace(&["diff", "--json", a, b]));
    assert_eq!(back["regression"], true, "{back}");
    let reasons = back["regressions"].to_string();
    assert!(
        reasons.contains("new leak finding at keep_history"),
        "{reasons}"
    );
    assert!(reasons.contains("new oom finding at evaluate"), "{reasons}");
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", a, b])
            .status
            .code(),
        Some(3)
    );
}

/// A run that crashed after 30 steps (killed) against the fixed one that made all 60 and
/// evaluated, with a higher peak: BEFORE stopped early, so the sizes are not compared and the
/// reason names the crash and the steps; not a regression.
#[test]
fn diff_does_not_compare_sizes_of_a_run_that_stopped_early() {
    let before = leak_then_eval(&["2", "768", "30"]);
    assert!(!before.status.success(), "{}", before.stderr);
    let after = leak_then_eval(&["0", "768"]);
    let (b, a) = (
        before.trace.to_str().unwrap(),
        after.trace.to_str().unwrap(),
    );
    let d = json_of(&oomtrace(&["diff", "--json", b, a]));
    assert_eq!(d["regression"], false, "{d}");
    // Killed: the markers still in the shim's buffer died with it.
    let steps = d["before_work"]["steps"].as_u64().unwrap();
    assert!((1..=30).contains(&steps), "{d}");
    assert_eq!(d["after_work"]["steps"], 60);
    assert!(d["before_work"]["stopped_early"].is_string(), "{d}");
    assert_eq!(d["after_work"]["stopped_early"], Value::Null, "{d}");
    let why = d["not_compared"].as_str().unwrap();
    assert!(why.contains("BEFORE stopped early (pid "), "{why}");
    assert!(
        why.contains(&format!("BEFORE made {steps} steps and AFTER 60")),
        "{why}"
    );
    assert!(
        d["devices"][0]["after_peak_bytes"].as_u64()
            > d["devices"][0]["before_peak_bytes"].as_u64(),
        "{d}"
    );
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", b, a])
            .status
            .code(),
        Some(0)
    );
}

/// The same work (60 steps, no OOM) with a bigger evaluation buffer: the peaks are compared
/// and the growth is a regression, by a percentage and by a byte threshold; a threshold above
/// it passes.
#[test]
fn diff_still_finds_a_higher_peak_of_the_same_work() {
    let before = leak_then_eval(&["0", "512"]);
    let after = leak_then_eval(&["0", "768"]);
    let (b, a) = (
        before.trace.to_str().unwrap(),
        after.trace.to_str().unwrap(),
    );
    let d = json_of(&oomtrace(&["diff", "--json", b, a]));
    assert_eq!(d["peaks_compared"], true, "{d}");
    assert_eq!(d["not_compared"], Value::Null, "{d}");
    assert_eq!(d["regression"], true, "{d}");
    assert_eq!(d["devices"][0]["regression"], true, "{d}");
    let eval = d["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "evaluate")
        .expect("evaluate among the sites");
    assert_eq!(eval["regression"], true, "{eval}");
    assert_eq!(eval["peak_delta_bytes"], 256 * MIB);
    let text = stdout_of(&oomtrace(&["diff", b, a]));
    assert!(text.contains("REGRESSION"), "{text}");
    assert!(!text.contains("not compared"), "{text}");
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", b, a])
            .status
            .code(),
        Some(3)
    );
    let loose = json_of(&oomtrace(&[
        "diff",
        "--json",
        "--threshold",
        "300MiB",
        b,
        a,
    ]));
    assert_eq!(loose["regression"], false, "{loose}");
}

/// keep_buffers on a 4 GiB device: 60 steps that each keep 78 MiB fill it, and the 53rd
/// allocation runs out of memory in both runs; BEFORE then frees its 52 buffers, AFTER keeps
/// them (3.96 GiB) at exit. Both ran out of memory at the same call site: the same work up to
/// the same failure, so their sizes compare and AFTER's memory kept at exit is a regression
/// (text, JSON, exit 3 with --fail-on-regression); the other way round it is not. Without the
/// failure (50 steps on the default device) the same holds.
#[test]
fn diff_finds_memory_kept_at_exit_after_the_same_out_of_memory() {
    let run = |free: &str, steps: &str| {
        let t = run_traced(
            "keep_buffers",
            &[free, "78", steps],
            &[("SIMCUDA_MEMORY", "4GiB")],
        );
        assert!(t.status.success(), "{}", t.stderr);
        t
    };
    let (freed, kept) = (run("1", "60"), run("0", "60"));
    assert!(freed.stdout.contains("out of memory"), "{}", freed.stdout);
    assert!(kept.stdout.contains("52 buffers kept"), "{}", kept.stdout);
    let (b, a) = (freed.trace.to_str().unwrap(), kept.trace.to_str().unwrap());

    let d = json_of(&oomtrace(&["diff", "--json", b, a]));
    assert_eq!(d["before_work"]["out_of_memory"], 1, "{d}");
    assert_eq!(d["after_work"]["out_of_memory"], 1, "{d}");
    assert_eq!(d["live_at_exit_compared"], true, "{d}");
    assert_eq!(d["peaks_compared"], true, "{d}");
    assert_eq!(d["not_compared"], Value::Null, "{d}");
    assert_eq!(d["regression"], true, "{d}");
    let dev = &d["devices"][0];
    assert_eq!(dev["before_live_at_exit_bytes"], 0, "{dev}");
    assert_eq!(dev["after_live_at_exit_bytes"], 52 * 78 * MIB, "{dev}");
    assert_eq!(dev["regression"], true, "{dev}");
    let reasons = d["regressions"].to_string();
    assert!(
        reasons.contains("device 0: peak 3.96 GiB -> 3.96 GiB, live at exit 0 B -> 3.96 GiB"),
        "{reasons}"
    );
    let site = &d["sites"][0];
    assert_eq!(site["name"], "keep_buffer", "{site}");
    assert_eq!(site["regression"], true, "{site}");
    assert_eq!(site["live_at_exit_delta_bytes"], 52 * 78 * MIB, "{site}");

    let out = oomtrace(&["diff", "--fail-on-regression", b, a]);
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("live at exit 0 B -> 3.96 GiB (+3.96 GiB)  REGRESSION"),
        "{text}"
    );
    assert!(!text.contains("No regression"), "{text}");
    assert!(!text.contains("not compared"), "{text}");
    // Freeing it all at exit is the fix, not a regression.
    let back = json_of(&oomtrace(&["diff", "--json", a, b]));
    assert_eq!(back["regression"], false, "{back}");
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", a, b])
            .status
            .code(),
        Some(0)
    );

    // No failure: 50 steps fit (3.81 GiB at exit, where BEFORE freed all).
    let (freed, kept) = (run("1", "50"), run("0", "50"));
    let (b, a) = (freed.trace.to_str().unwrap(), kept.trace.to_str().unwrap());
    let d = json_of(&oomtrace(&["diff", "--json", b, a]));
    assert_eq!(d["regression"], true, "{d}");
    assert_eq!(d["devices"][0]["after_live_at_exit_bytes"], 50 * 78 * MIB);
    assert_eq!(
        oomtrace(&["diff", "--fail-on-regression", b, a])
            .status
            .code(),
        Some(3)
    );
}

/// The same trace twice, by the same path, by another path to the same file, through its
/// directory, or as a copy: refused in one line, exit 2, nothing on stdout.
#[test]
fn report_refuses_the_same_trace_twice() {
    let t = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("report-twice");
    let copy = dir.join("copy.oomt");
    std::fs::copy(&t.trace, &copy).unwrap();
    let link = dir.join("link.oomt");
    std::fs::hard_link(&copy, &link).unwrap();
    let trace = t.trace.to_str().unwrap();
    let other_path = format!("{}/./trace.oomt", t.trace.parent().unwrap().display());
    for (args, says) in [
        (vec![trace, trace], "are the same trace file"),
        (vec![trace, other_path.as_str()], "are the same trace file"),
        (
            vec![copy.to_str().unwrap(), link.to_str().unwrap()],
            "are the same trace file",
        ),
        (vec![dir.to_str().unwrap()], "are the same trace file"),
        (
            vec![trace, copy.to_str().unwrap()],
            "are the same trace (the same processes)",
        ),
    ] {
        let mut all = vec!["report"];
        all.extend(&args);
        let out = oomtrace(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("oomtrace: ") && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// Two runs of unrelated programs (no launcher job id): reported side by side, each its own
/// report, with a line saying so; `--merge` makes one report of them and says that instead.
/// Two traces of one Slurm job are merged without asking, and the line names the job.
#[test]
fn report_merges_only_traces_of_one_job() {
    let a = run_traced("runtime_basic", &[], &[]);
    let b = run_traced("leak_history", &[], &[("CORPUS_STEPS", "20")]);
    let (ta, tb) = (a.trace.to_str().unwrap(), b.trace.to_str().unwrap());
    let text = stdout_of(&oomtrace(&["report", ta, tb]));
    assert!(
        text.contains("2 traces of 2 separate runs (no launcher job id or world of ranks in common), reported one after another; --merge makes one report of them"),
        "{text}"
    );
    assert!(
        text.contains("=== run 1 of 2 ===") && text.contains("=== run 2 of 2 ==="),
        "{text}"
    );
    assert_eq!(text.matches("Processes (1)").count(), 2, "{text}");
    assert!(!text.contains("Processes (2)"), "{text}");
    let r = json_of(&oomtrace(&["report", "--json", ta, tb]));
    assert_eq!(r["combined"]["how"], "separate_runs", "{}", r["combined"]);
    assert_eq!(r["combined"]["runs"], 2);
    assert_eq!(r["runs"].as_array().unwrap().len(), 2);
    assert_eq!(r["runs"][0]["traces"][0], ta);
    assert_eq!(
        r["processes"].as_array().unwrap().len(),
        2,
        "every process is listed"
    );

    let merged = stdout_of(&oomtrace(&["report", "--merge", ta, tb]));
    assert!(
        merged.contains("2 traces of 2 separate runs (no launcher job id or world of ranks in common), merged into one report as asked (--merge)"),
        "{merged}"
    );
    assert!(merged.contains("Processes (2)"), "{merged}");
    assert!(!merged.contains("=== run "), "{merged}");
    let m = json_of(&oomtrace(&["report", "--json", "--merge", ta, tb]));
    assert_eq!(m["combined"]["how"], "merged_on_request");
    assert!(m.get("runs").is_none(), "{m}");

    let job = |rank: &str| {
        run_traced(
            "runtime_basic",
            &[],
            &[
                ("SLURM_JOB_ID", "777"),
                ("SLURM_PROCID", rank),
                ("SLURM_NTASKS", "2"),
            ],
        )
    };
    let (r0, r1) = (job("0"), job("1"));
    let (t0, t1) = (r0.trace.to_str().unwrap(), r1.trace.to_str().unwrap());
    let text = stdout_of(&oomtrace(&["report", t0, t1]));
    assert!(
        text.contains("2 traces of one job (job 777), merged into one report"),
        "{text}"
    );
    assert!(text.contains("Ranks (2 of 2)"), "{text}");
    let j = json_of(&oomtrace(&["report", "--json", t0, t1]));
    assert_eq!(j["combined"]["how"], "one_job");
    assert_eq!(j["processes"][0]["job"], "777");
    assert_eq!(j["ranks"]["rows"].as_array().unwrap().len(), 2);

    // No job id (RANK and WORLD_SIZE set by hand, a torchrun without --rdzv-id): ranks of one
    // world that no two traces both hold are one job; two runs of the same rank are two.
    let ranked = |rank: &str| {
        run_traced(
            "runtime_basic",
            &[],
            &[
                ("RANK", rank),
                ("WORLD_SIZE", "2"),
                ("TORCHELASTIC_RUN_ID", "none"),
            ],
        )
    };
    let (q0, q1, again) = (ranked("0"), ranked("1"), ranked("0"));
    let paths = |ts: &[&Traced]| -> Vec<String> {
        ts.iter().map(|t| t.trace.display().to_string()).collect()
    };
    let mut args = vec!["report".to_string()];
    args.extend(paths(&[&q0, &q1]));
    let text = stdout_of(&oomtrace(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert!(
        text.contains("2 traces of one job (ranks of one world, no launcher job id), merged"),
        "{text}"
    );
    assert!(text.contains("Ranks (2 of 2)"), "{text}");
    let mut args = vec!["report".to_string()];
    args.extend(paths(&[&q0, &again]));
    let text = stdout_of(&oomtrace(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert!(text.contains("2 traces of 2 separate runs"), "{text}");
}

/// A leak that ran the device out of memory: no "at this rate the device is full in ..."
/// after it did (text or JSON); the counts read "1 allocation", not "1 allocations"; a list
/// with nothing in it has no heading; growth is a size per step.
#[test]
fn a_report_after_an_oom_forecasts_nothing_and_counts_right() {
    let t = leak_then_eval(&["16", "768"]);
    assert_eq!(t.status.code(), Some(90), "{}", t.stderr);
    let r = report_json(&t.trace);
    let leaks = findings(&r, "leak");
    assert!(!leaks.is_empty(), "{r}");
    for f in leaks.iter().chain(findings(&r, "device_growth").iter()) {
        let e = &f["evidence"];
        assert!(
            e["time_to_oom_s"].is_null() && e["steps_to_oom"].is_null(),
            "{e}"
        );
    }
    let text = report_text(&t.trace);
    assert!(!text.contains("device is full in"), "{text}");
    // The evaluation never ran: its site did not allocate. A single allocation reads as one.
    assert!(!text.contains(" 1 allocations"), "{text}");
    assert!(!text.contains(" 1 steps"), "{text}");
    assert!(!text.contains("16777216"), "{text}");
    assert!(text.contains("16.00 MiB/step"), "{text}");
    // Every heading of a section is followed by a row of it.
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':') {
            let next = lines.get(i + 1).copied().unwrap_or("");
            assert!(next.starts_with("    "), "empty heading {l:?}:\n{text}");
        }
    }

    // Without the OOM (a 4 GiB device), the same leak's forecast is there.
    let roomy = run_traced(
        "leak_then_eval",
        &["16", "768"],
        &[("SIMCUDA_MEMORY", "4GiB")],
    );
    let r = report_json(&roomy.trace);
    assert!(
        findings(&r, "leak")
            .iter()
            .any(|f| f["evidence"]["time_to_oom_s"].as_f64().is_some()),
        "{r}"
    );
}

/// runtime_basic's keep_cache makes one allocation: "1 allocation," in the list of most
/// allocations, never "1 allocations".
#[test]
fn report_text_says_1_allocation() {
    let t = run_traced("runtime_basic", &[], &[]);
    let text = report_text(&t.trace);
    assert!(
        text.contains("      1 allocation,    4.00 MiB in total  keep_cache"),
        "{text}"
    );
    assert!(!text.contains(" 1 allocations"), "{text}");
    assert!(!text.contains(" 1 allocs"), "{text}");
}
