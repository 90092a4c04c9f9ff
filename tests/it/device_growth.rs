//! Device growth (`device_growth` findings) on the labeled corpus (tests/scenarios/corpus/),
//! with step markers and without (epochs found automatically): a leak also grows its device
//! and is found there at the leak's rate, printed live; no clean look-alike reports or prints
//! device growth; a cache that fills up and stops ends as `info`, never as growth. The
//! segment-level case (growth spread over call sites, Python lines) is in `python.rs`.

use oomtrace_tests::corpus::{self, Label};
use oomtrace_tests::{findings, run_traced};

fn check(name: &str) {
    let case = corpus::case(name);
    for markers in [true, false] {
        let t = run_traced(name, &[], &corpus::env(case, markers));
        let mode = if markers { "markers" } else { "no markers" };
        assert!(t.status.success(), "{name}: {:?}\n{}", t.status, t.stderr);
        let growth = findings(&t.report, "device_growth");
        let live: Vec<&str> = t
            .stderr
            .lines()
            .filter(|l| l.starts_with("oomtrace: [") && l.contains(" device growth] pid "))
            .collect();
        match case.label {
            Label::Leak { .. } => {
                assert_eq!(
                    growth.len(),
                    1,
                    "{name} ({mode}): {:#?}",
                    t.report["findings"]
                );
                let g = growth[0];
                assert!(
                    matches!(g["level"].as_str(), Some("likely" | "confirmed")),
                    "{name} ({mode}): {g:#}"
                );
                // The device grows as fast as the leaks on it.
                let leaks: f64 = findings(&t.report, "leak")
                    .iter()
                    .filter_map(|f| f["growth_bytes_per_step"].as_f64())
                    .sum();
                let rate = g["growth_bytes_per_step"].as_f64().unwrap();
                assert!(
                    (rate / leaks - 1.0).abs() < 0.1,
                    "{name} ({mode}): device {rate}/step, leaks {leaks}/step"
                );
                assert!(
                    live.iter().any(|l| l.contains(": CUDA memory grows +")),
                    "{name} ({mode}): nothing printed live:\n{}",
                    t.stderr
                );
            }
            Label::Clean => {
                assert!(growth.is_empty(), "{name} ({mode}): {growth:#?}");
                assert!(live.is_empty(), "{name} ({mode}):\n{}", t.stderr);
            }
            Label::Bounded => assert!(
                growth.iter().all(|g| g["level"] == "info"),
                "{name} ({mode}): {growth:#?}"
            ),
            // Reserved memory does grow there, until each out-of-memory retry empties the
            // cache: device growth may be reported; the fragmentation finding explains it.
            Label::Fragmentation => {}
        }
    }
}

macro_rules! device_growth_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { check(stringify!($name)); })*
    };
}

device_growth_tests!(
    leak_history,
    leak_periodic,
    leak_late,
    leak_vmm,
    clean_static,
    clean_dynamic,
    clean_grad_accum,
    clean_eval,
    clean_lru,
    clean_oneoff,
    clean_warmup,
    clean_empty_cache,
    bounded_cache,
);
