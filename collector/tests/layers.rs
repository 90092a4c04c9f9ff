//! The crate's layers import one way (README.md "Layers"): a module may name (`crate::x`) only
//! the layers above it. Checked on the source, so that a wrong import fails a test instead of
//! waiting for a review. Inside the analysis, its detectors are peers
//! (`analysis_detectors_are_peers`).

use std::path::{Path, PathBuf};

/// Each layer, and the `crate::` roots it must never name.
const RULES: &[(&str, &[&str])] = &[
    (
        "units.rs",
        &[
            "model",
            "analysis",
            "report",
            "server",
            "inbox",
            "trace_writer",
            "console",
            "metrics",
        ],
    ),
    (
        "console.rs",
        &[
            "model",
            "analysis",
            "report",
            "server",
            "inbox",
            "trace_writer",
            "metrics",
        ],
    ),
    (
        "snapshot",
        &[
            "units",
            "model",
            "analysis",
            "whatif",
            "fit",
            "report",
            "server",
            "inbox",
            "trace_writer",
            "console",
            "metrics",
        ],
    ),
    (
        "model",
        &[
            "units",
            "analysis",
            "fit",
            "report",
            "server",
            "inbox",
            "trace_writer",
            "console",
            "metrics",
        ],
    ),
    (
        "analysis",
        &[
            "fit",
            "report",
            "server",
            "inbox",
            "trace_writer",
            "console",
            "metrics",
        ],
    ),
    (
        "whatif",
        &[
            "analysis",
            "fit",
            "report",
            "server",
            "inbox",
            "trace_writer",
            "console",
            "metrics",
        ],
    ),
    (
        "fit",
        &[
            "report",
            "server",
            "inbox",
            "trace_writer",
            "console",
            "metrics",
        ],
    ),
    (
        "report",
        &["server", "inbox", "trace_writer", "console", "metrics"],
    ),
];

fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut v = Vec::new();
    for entry in std::fs::read_dir(path).expect("source directory") {
        v.extend(sources(&entry.expect("entry").path()));
    }
    v
}

#[test]
fn layers_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for (layer, forbidden) in RULES {
        for file in sources(&src.join(layer)) {
            let text = std::fs::read_to_string(&file).expect("readable source");
            for (n, line) in text.lines().enumerate() {
                // Code only: a comment may name another layer.
                let code = line.split("//").next().unwrap_or("");
                for f in *forbidden {
                    if code.contains(&format!("crate::{f}")) {
                        wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
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
];

/// The analysis modules a line of code names: the first segment of each path after `super::`
/// or `analysis::`, inside a `{...}` group too (`use super::{growth, window::Sample}`).
fn named_modules(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for prefix in ["super::", "analysis::"] {
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            rest = &rest[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level items of the group, up to its closing brace.
                let mut depth = 0;
                let mut start = 0;
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            names.push(ident(&group[start..j]));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            names.push(ident(&group[start..j]));
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
            } else {
                names.push(ident(rest));
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// Joins `use` statements that span lines, so that a group is read whole; comments dropped.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ")
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
