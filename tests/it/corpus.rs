//! Each corpus program through `oomtrace run`, with step markers and without (the epoch
//! clock must then find the iteration itself), judged by `oomtrace_tests::corpus::score`:
//! the report and the live stderr lines must name the leaking function within
//! `BUDGET_EPOCHS` of onset, and clean look-alikes must produce no leak finding.

use oomtrace_tests::corpus::{self, Label, BUDGET_EPOCHS, SPARSE_BUDGET_EPOCHS};
use oomtrace_tests::{
    base_command, findings, oomtrace_bin, output_within, run_traced, run_traced_with, TIMEOUT,
};

fn check(name: &str) {
    let case = corpus::case(name);
    for markers in [true, false] {
        let env = corpus::env(case, markers);
        let t = run_traced(name, &[], &env);
        assert!(t.status.success(), "{name}: {:?}\n{}", t.status, t.stderr);
        t.assert_run_said_what_the_trace_says();
        let s = corpus::score(case, markers, &t.report);
        let mode = if markers { "markers" } else { "no markers" };
        assert!(
            s.failure.is_none(),
            "{name} ({mode}, epochs from {}): {}\nstderr:\n{}",
            s.epoch_source,
            s.failure.unwrap_or_default(),
            t.stderr
        );
        let expected_sources: &[&str] = if markers { &["markers"] } else { case.sources };
        if case.label != Label::Fragmentation {
            assert!(
                expected_sources.contains(&s.epoch_source.as_str()),
                "{name} ({mode}): epochs from {}, expected one of {expected_sources:?}",
                s.epoch_source
            );
            assert!(
                (0.0..=1.0).contains(&s.epoch_confidence),
                "{name} ({mode}): confidence {}",
                s.epoch_confidence
            );
        }
        let live_leaks: Vec<&str> = t
            .stderr
            .lines()
            .filter(|l| l.contains("likely leak]") || l.contains("confirmed leak]"))
            .collect();
        match case.label {
            Label::Leak { function, .. } => {
                assert!(
                    live_leaks
                        .iter()
                        .any(|l| l.contains(function) && l.contains("/step")),
                    "{name} ({mode}): no live line names {function}:\n{}",
                    t.stderr
                );
                let f = findings(&t.report, "leak")
                    .into_iter()
                    .find(|f| oomtrace_tests::functions(f).iter().any(|n| n == function))
                    .expect("leak finding");
                let ev = &f["evidence"];
                for field in ["trend", "surviving_epochs", "onset_step", "detected_step"] {
                    assert!(
                        !ev[field].is_null(),
                        "{name}: evidence.{field} missing: {f}"
                    );
                }
                assert!(f["growth_bytes_per_step"].as_f64().unwrap_or(0.0) >= 1.0e6);
                assert!(!f["hint"].as_str().unwrap_or("").is_empty());
                let ci = &ev["trend"]["slope_ci"];
                assert!(ci[0].as_f64() <= ci[1].as_f64(), "{ci}");
            }
            Label::Clean => assert!(
                live_leaks.is_empty(),
                "{name} ({mode}): a clean run printed leak lines:\n{}",
                t.stderr
            ),
            Label::Bounded | Label::Fragmentation => {}
        }
    }
}

macro_rules! corpus_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { check(stringify!($name)); })*
        /// Every corpus program has a test here.
        #[test]
        fn every_case_is_tested() {
            let tested = [$(stringify!($name)),*];
            for c in corpus::CORPUS {
                assert!(tested.contains(&c.name), "{} has no test", c.name);
            }
            assert!(corpus::CORPUS.len() >= 15);
        }
    };
}

corpus_tests!(
    leak_history,
    leak_slow_sawtooth,
    leak_periodic,
    leak_late,
    leak_ext,
    leak_vmm,
    leak_total_loss,
    leak_async,
    clean_static,
    clean_dynamic,
    clean_grad_accum,
    clean_eval,
    clean_lru,
    clean_oneoff,
    clean_warmup,
    clean_empty_cache,
    bounded_cache,
    frag_retry,
    leak_realloc,
    clean_realloc,
    leak_pool,
    clean_pool,
    leak_ext_step,
    clean_ext_step,
    leak_ext_static,
    clean_ext_static,
    leak_irregular,
    clean_irregular,
    leak_one_per_step,
    leak_one_per_step_pinned,
    clean_one_per_step,
    leak_sparse,
    clean_sparse,
    leak_threads,
    clean_threads,
    leak_phase,
    clean_phase,
);

#[test]
fn fail_on_leak_exits_3_only_for_a_confirmed_leak() {
    let t = run_traced_with("leak_history", &["--fail-on-leak"], &[], &[]);
    assert_eq!(t.status.code(), Some(3), "{}", t.stderr);
    assert!(t.stderr.contains("--fail-on-leak"), "{}", t.stderr);
    for clean in ["clean_static", "bounded_cache"] {
        let t = run_traced_with(clean, &["--fail-on-leak"], &[], &[]);
        assert_eq!(t.status.code(), Some(0), "{clean}: {}", t.stderr);
    }
}

#[test]
fn retries_are_fragmentation_and_recovered_failures_are_not_errors() {
    let case = corpus::case("frag_retry");
    let t = run_traced("frag_retry", &[], &corpus::env(case, true));
    let frag = findings(&t.report, "fragmentation");
    assert_eq!(frag.len(), 1, "{}", t.report);
    assert!(frag[0]["evidence"]["retries"].as_u64().unwrap_or(0) >= 3);
    assert!(frag[0]["message"].as_str().unwrap().contains("retrying"));
    assert!(frag[0]["hint"]
        .as_str()
        .unwrap()
        .contains("expandable_segments"));
    let ooms = findings(&t.report, "oom");
    assert!(!ooms.is_empty());
    assert!(
        ooms.iter().all(|o| o["level"] == "warning"),
        "every failure was retried successfully: {ooms:?}"
    );
    // The report opens with the OOMs, then fragmentation.
    assert_eq!(t.report["findings"][0]["kind"], "oom");
    assert!(t.stderr.contains("[fragmentation"), "{}", t.stderr);
}

#[test]
fn capacity_warnings_fire_once_per_threshold() {
    // clean_oneoff peaks at 986 MiB: on a 1 GiB device that crosses 85, 90 and 95 %.
    let case = corpus::case("clean_oneoff");
    let mut env = corpus::env(case, true);
    env.push(("SIMCUDA_MEMORY", "1073741824"));
    let t = run_traced("clean_oneoff", &[], &env);
    let th = findings(&t.report, "threshold");
    assert_eq!(th.len(), 1, "{}", t.report);
    assert_eq!(th[0]["evidence"]["percent"], 95);
    assert_eq!(th[0]["level"], "error");
    assert_eq!(th[0]["evidence"]["crossings"], 1);
    let lines = t
        .stderr
        .lines()
        .filter(|l| l.starts_with("oomtrace: [threshold"))
        .count();
    assert_eq!(lines, 3, "85, 90 and 95 %, once each:\n{}", t.stderr);
    assert!(findings(&t.report, "leak").is_empty());
}

#[test]
fn budget_is_the_design_target() {
    assert_eq!(BUDGET_EPOCHS, 10);
    assert_eq!(SPARSE_BUDGET_EPOCHS, 20);
    for c in corpus::CORPUS {
        let sparse = c.name.ends_with("_sparse");
        let want = if sparse {
            SPARSE_BUDGET_EPOCHS
        } else {
            BUDGET_EPOCHS
        };
        assert_eq!(c.budget, want, "{}", c.name);
    }
}

/// Without markers the report says where its steps came from and how sure that is, in the JSON
/// and in the text report, and a replay of the trace finds the same steps as the live
/// collector did: an iteration found by its structure (`leak_irregular`) and one found by its
/// pace (`leak_one_per_step_pinned`, one allocation per step).
#[test]
fn epochs_name_their_source_and_confidence_live_and_in_replay() {
    for (name, how, least) in [
        (
            "leak_irregular",
            "iterations found in the allocations (one every ",
            0.85,
        ),
        (
            "leak_one_per_step_pinned",
            "iterations found in the allocations (one every 1.0 allocations)",
            0.4,
        ),
    ] {
        let t = run_traced(name, &[], &corpus::env(corpus::case(name), false));
        assert!(t.status.success(), "{name}: {}", t.stderr);
        let live = &t.report["processes"][0]["epochs"];
        assert_eq!(live["source"], "auto", "{name}: {live:#}");
        let confidence = live["confidence"].as_f64().expect("epochs.confidence");
        assert!((least..=1.0).contains(&confidence), "{name}: {live:#}");
        let replay = |json: bool| {
            let mut cmd = base_command(oomtrace_bin());
            cmd.arg("report").arg(&t.trace);
            if json {
                cmd.arg("--json");
            }
            let out = output_within(cmd, TIMEOUT);
            assert!(out.status.success(), "{name}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let replayed: serde_json::Value = serde_json::from_str(&replay(true)).expect("JSON");
        assert_eq!(&replayed["processes"][0]["epochs"], live, "{name}");
        let text = replay(false);
        let line = format!(
            "epochs: {} from {how}",
            live["count"].as_u64().expect("epochs.count")
        );
        assert!(
            text.contains(&line) && text.contains(&format!("confidence {confidence:.2}")),
            "{name}: no `{line}` with its confidence in:\n{text}"
        );
    }
}

/// What oomtrace can see of a framework's own pool (scenarios/corpus/pool.h): the reservation
/// and each chunk the pool grows by, never a sub-allocation. The leak is reported at the
/// chunks (pool_grow), with the chunks' bytes; a pool that stays within its reservation is
/// one allocation and one free.
#[test]
fn a_pool_is_seen_by_its_reservation_and_chunks_only() {
    const MIB: u64 = 1 << 20;
    let t = run_traced(
        "leak_pool",
        &[],
        &corpus::env(corpus::case("leak_pool"), true),
    );
    let chunks: u64 = t
        .stdout
        .trim()
        .strip_prefix("leak_pool: ok (")
        .and_then(|s| s.strip_suffix(" chunks)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("chunk count in {:?}", t.stdout));
    assert!(chunks > 20, "{chunks}");
    let device = &t.report["processes"][0]["devices"][0];
    // The reservation plus one cudaMalloc per chunk: the 2 MiB and 4 MiB sub-allocations of
    // 60 steps never reach CUDA.
    assert_eq!(device["allocations"], chunks, "{device}");
    assert_eq!(
        device["live_at_exit_bytes"].as_u64(),
        Some(32 * MIB + (chunks - 1) * 4 * MIB)
    );
    let leak = findings(&t.report, "leak")
        .into_iter()
        .find(|f| oomtrace_tests::functions(f).first().map(String::as_str) == Some("pool_grow"))
        .expect("a leak at pool_grow");
    assert_eq!(leak["bytes"].as_u64(), Some((chunks - 1) * 4 * MIB));
    assert_eq!(leak["count"].as_u64(), Some(chunks - 1));

    let t = run_traced(
        "clean_pool",
        &[],
        &corpus::env(corpus::case("clean_pool"), true),
    );
    let device = &t.report["processes"][0]["devices"][0];
    assert_eq!(
        (device["allocations"].as_u64(), device["frees"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(findings(&t.report, "leak").is_empty());
}

/// One buffer re-allocated 1 MiB larger every step (leak_realloc): one leak finding at its
/// site, with its rate and what was replaced; no allocation of it survived three steps.
#[test]
fn a_reallocated_buffer_is_one_leak_that_says_its_allocations_are_replaced() {
    const MIB: f64 = (1u64 << 20) as f64;
    for markers in [true, false] {
        let t = run_traced(
            "leak_realloc",
            &[],
            &corpus::env(corpus::case("leak_realloc"), markers),
        );
        let at: Vec<_> = findings(&t.report, "leak")
            .into_iter()
            .filter(|f| {
                oomtrace_tests::functions(f).first().map(String::as_str) == Some("grow_buffer")
            })
            .collect();
        assert_eq!(at.len(), 1, "markers {markers}: {}", t.report);
        let f = &at[0];
        assert_eq!(f["growth_bytes_per_step"].as_f64(), Some(MIB), "{f}");
        assert!(
            f["hint"].as_str().unwrap().contains("freed and replaced"),
            "{f}"
        );
        let ev = &f["evidence"];
        assert!(ev["surviving_epochs"].as_u64().unwrap() < 3, "{f}");
        let r = &ev["replaced"];
        assert!(r["frees_in_window"].as_u64().unwrap() >= 7, "{f}");
        assert!(
            r["largest_allocation_bytes"].as_f64().unwrap() >= 20.0 * MIB,
            "{f}"
        );
        assert_eq!(f["count"], 1, "one buffer live: {f}");
    }
}
