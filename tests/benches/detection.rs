//! Detection quality on the labeled corpus (`scenarios/corpus/`): recall, false positives
//! and epochs-to-detect, with step markers and without, over all cases and per class of
//! program (`corpus::Class`).
//!
//! `cargo bench -p oomtrace-tests --bench detection`
//!
//! Each program runs under the shim with no collector to start (`OOMTRACE_COLLECTOR` points
//! nowhere), so the shim writes its trace itself; the trace is then replayed through the
//! collector library, whose detectors are the ones the live collector runs. Scoring rules
//! are `oomtrace_tests::corpus::score`, the same the integration test applies.

use std::time::Instant;

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::{self, ReportOptions};
use oomtrace_tests::corpus::{
    self, Class, Label, Score, BUDGET_EPOCHS, CORPUS, SPARSE_BUDGET_EPOCHS,
};
use oomtrace_tests::{base_command, output_within, scenario, scratch, shim, TIMEOUT};

fn main() {
    let mut scores = Vec::new();
    let started = Instant::now();
    println!(
        "{:<20} {:<10} {:<8} {:<14} {:<8} {:>6}  result",
        "scenario", "class", "markers", "label", "epochs", "delay"
    );
    for case in CORPUS {
        for markers in [true, false] {
            let dir = scratch(case.name);
            let trace = dir.join("trace.oomt");
            let mut cmd = base_command(scenario(case.name));
            cmd.current_dir(&dir)
                .env("LD_PRELOAD", shim())
                .env("OOMTRACE_COLLECTOR", dir.join("no-collector"))
                .env("OOMTRACE_OUTPUT", &trace);
            for (k, v) in corpus::env(case, markers) {
                cmd.env(k, v);
            }
            let out = output_within(cmd, TIMEOUT);
            assert!(
                out.status.success(),
                "{} failed: {:?}",
                case.name,
                out.status
            );
            let t = Trace::load(&trace).expect("trace");
            let r = report::build(
                &t,
                &ReportOptions {
                    top: 5,
                    path: trace.display().to_string(),
                    symbolize: true,
                },
            );
            let json = serde_json::to_value(&r).expect("json");
            let s = corpus::score(case, markers, &json);
            let label = match case.label {
                Label::Leak { .. } => "leak",
                Label::Clean => "clean",
                Label::Bounded => "bounded",
                Label::Fragmentation => "fragmentation",
            };
            println!(
                "{:<20} {:<10} {:<8} {:<14} {:<8} {:>6}  {}",
                case.name,
                case.class.name(),
                if markers { "yes" } else { "no" },
                label,
                s.epoch_source,
                s.delay.map_or("-".into(), |d| d.to_string()),
                s.failure.clone().unwrap_or_else(|| "ok".into())
            );
            let _ = std::fs::remove_dir_all(&dir);
            scores.push((case.class, case.label, s));
        }
    }
    for markers in [Some(true), Some(false), None] {
        let pick: Vec<_> = scores
            .iter()
            .filter(|(_, _, s)| markers.is_none_or(|m| s.markers == m))
            .collect();
        println!(
            "\n{}: {}",
            match markers {
                Some(true) => "with markers",
                Some(false) => "without markers",
                None => "all runs",
            },
            summary(&pick)
        );
    }
    println!("\nper class:");
    let mut classes: Vec<Class> = scores.iter().map(|(c, _, _)| *c).collect();
    classes.sort_unstable();
    classes.dedup();
    for class in classes {
        for markers in [true, false] {
            let pick: Vec<_> = scores
                .iter()
                .filter(|(c, _, s)| *c == class && s.markers == markers)
                .collect();
            println!(
                "{:<10} {:<8} {}",
                class.name(),
                if markers { "markers" } else { "none" },
                summary(&pick)
            );
        }
    }
    println!(
        "\n{} runs in {:.1} s",
        scores.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Recall, false positives and the median delay of some runs.
fn summary(pick: &[&(Class, Label, Score)]) -> String {
    let leaks: Vec<_> = pick
        .iter()
        .filter(|(_, l, _)| matches!(l, Label::Leak { .. }))
        .collect();
    let found = leaks
        .iter()
        .filter(|(_, _, s)| s.found && s.delay.is_some_and(|d| d <= corpus::case(s.case).budget))
        .count();
    let not_leaks: Vec<_> = pick
        .iter()
        .filter(|(_, l, _)| !matches!(l, Label::Leak { .. }))
        .collect();
    let fp = not_leaks
        .iter()
        .filter(|(_, _, s)| !s.false_leaks.is_empty())
        .count();
    let wrong_site = leaks
        .iter()
        .filter(|(_, _, s)| !s.false_leaks.is_empty())
        .count();
    let delays: Vec<Score> = leaks.iter().map(|(_, _, s)| s.clone()).collect();
    format!(
        "recall {found}/{} within budget ({BUDGET_EPOCHS} epochs, sparse {SPARSE_BUDGET_EPOCHS}); false positives {fp}/{} non-leak \
         runs, {wrong_site} leak runs with an extra site; median epochs-to-detect {}",
        leaks.len(),
        not_leaks.len(),
        corpus::median_delay(&delays).map_or("-".into(), |d| format!("{d:.1}"))
    )
}
