//! The crate's layers import one way (README.md "Layers"): a module may name (`crate::x`) only
//! the layers its row allows. Checked on the source by the one import checker both crates'
//! layers tests share (`tests/src/import_check.rs`), so that a wrong import fails a test
//! instead of waiting for a review; every layer has a row, and no two rows allow a circle.
//! Inside the analysis, its detectors are peers (`analysis_detectors_are_peers`).

use std::path::Path;

#[path = "../../tests/src/import_check.rs"]
mod import_check;

use import_check::{against_rows, circles, code_of, named, without_rows};

/// Each layer (a file, or a directory and everything in it), and the `crate::` roots it may
/// name. Keep it README.md's table: a change here is a change of the map.
const ALLOWED: &[(&str, &[&str])] = &[
    // The bottom: what names nothing of the crate.
    ("units.rs", &[]),
    ("console.rs", &[]),
    ("inbox.rs", &[]),
    ("snapshot", &[]),
    // What happened, what it means, what to tell.
    ("model", &["model", "snapshot"]),
    ("analysis", &["analysis", "model", "units"]),
    ("whatif", &["whatif", "model", "units"]),
    ("fit", &["fit", "model", "analysis", "whatif", "units"]),
    (
        "report",
        &["report", "model", "analysis", "whatif", "fit", "units"],
    ),
    // The collector process: its trace file, its metrics, the server on top.
    ("trace_writer.rs", &["trace_writer", "model"]),
    ("trace_writer", &["trace_writer", "model"]),
    (
        "metrics",
        &[
            "metrics",
            "model",
            "analysis",
            "report",
            "trace_writer",
            "console",
            "units",
        ],
    ),
    (
        "server",
        &[
            "model",
            "analysis",
            "whatif",
            "fit",
            "report",
            "trace_writer",
            "inbox",
            "metrics",
            "console",
            "units",
            "snapshot",
        ],
    ),
];

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn layers_import_one_way() {
    let wrong = against_rows(&src(), ALLOWED, "crate::");
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_layer_has_a_row_and_no_two_rows_allow_a_circle() {
    let missing = without_rows(&src(), ALLOWED, &["lib.rs"]);
    assert!(missing.is_empty(), "modules without a row: {missing:?}");
    let found = circles(ALLOWED);
    assert!(found.is_empty(), "circles the layers allow: {found:?}");
}

/// The analysis's detectors (one file each, `analysis/mod.rs`).
const DETECTORS: &[&str] = &[
    "growth",
    "site_growth",
    "device_growth",
    "fragmentation",
    "oom",
    "threshold",
];

/// The growth detectors' shared vocabulary, and what the detectors share besides: none of
/// these may name a detector.
const SHARED: &[&str] = &[
    "detector.rs",
    "trend.rs",
    "window.rs",
    "evidence.rs",
    "leaks.rs",
    "advice.rs",
    "growth_finding.rs",
    "births.rs",
    "stats.rs",
    "refusal.rs",
    "together.rs",
];

/// The detectors that must not name one another: the growth detectors (the leak detector is
/// read through `leaks.rs`, which names none), and the OOM and fragmentation detectors (what
/// both speak of is in `refusal.rs`).
const PEER_DETECTORS: &[&str] = &[
    "growth",
    "site_growth",
    "device_growth",
    "fragmentation",
    "oom",
    "threshold",
];

/// The analysis modules a file's code names: after `super::` or `analysis::`.
fn named_modules(code: &str) -> Vec<String> {
    ["super::", "analysis::"]
        .iter()
        .flat_map(|prefix| named(code, prefix))
        .map(|(_, name)| name)
        .collect()
}

/// Detectors are peers (`analysis/mod.rs`): the shared vocabulary names no detector, and no
/// detector names another.
#[test]
fn analysis_detectors_are_peers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/analysis");
    let mut wrong = Vec::new();
    let mut check = |file: &str, forbidden: &[&str]| {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).expect("readable source");
        for name in named_modules(&code_of(&text)) {
            if forbidden.contains(&name.as_str()) {
                wrong.push(format!("{} names {name}", path.display()));
            }
        }
    };
    for file in SHARED {
        check(file, DETECTORS);
    }
    for detector in PEER_DETECTORS {
        let others: Vec<&str> = DETECTORS
            .iter()
            .copied()
            .filter(|d| d != detector)
            .collect();
        check(&format!("{detector}.rs"), &others);
    }
    assert!(
        wrong.is_empty(),
        "imports against the detectors' rule:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn named_modules_reads_paths_and_groups() {
    assert_eq!(named_modules("use super::growth::{self, X};"), ["growth"]);
    assert_eq!(
        named_modules("use super::{Alert, growth, window::{self, Sample}};"),
        ["Alert", "growth", "window"]
    );
    assert_eq!(
        named_modules("let x = crate::analysis::site_growth::Replaced;"),
        ["site_growth"]
    );
    assert!(named_modules("let growth = 1;").is_empty());
}
