//! The CLI reads the collector through its report contract (`oomtrace_collector::report`) and
//! its other public rooms, never through the analysis: a detector's module, a finding's
//! internals or the epoch clock named here would tie a front end to how a finding is made.
//! Checked on the source by the import checker the layers tests share.

use std::path::Path;

#[path = "../../tests/src/import_check.rs"]
mod import_check;

use import_check::{code_of, named, sources};

/// What of the collector the CLI may name.
const ALLOWED: &[&str] = &[
    "report", "model", "whatif", "fit", "units", "console", "metrics", "server", "snapshot",
];

#[test]
fn the_cli_names_the_report_contract_not_the_analysis() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in sources(&src) {
        if file.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        for (line, root) in named(&code_of(&text), "oomtrace_collector::") {
            if !ALLOWED.contains(&root.as_str()) {
                wrong.push(format!(
                    "{}:{line}: oomtrace_collector::{root}",
                    file.display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the CLI names the collector outside its contract:\n{}",
        wrong.join("\n")
    );
}
