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
    // Every site row carries a stable key and its stack.
    for row in s["sites"].as_array().unwrap() {
        assert!(row["key"].as_str().unwrap().starts_with("keep_"), "{row}");
    }

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
    assert_eq!(
        by_end,
        ["keep_weights", "keep_cache"],
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
