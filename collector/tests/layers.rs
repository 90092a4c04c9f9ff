//! The crate's layers import one way (README.md "Layers"): a module may name (`crate::x`) only
//! the layers above it. Checked on the source, so that a wrong import fails a test instead of
//! waiting for a review.

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
        "model",
        &[
            "units",
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
        "analysis",
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
        "whatif",
        &[
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
