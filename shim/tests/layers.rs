//! The shim's module map (README.md "Module map") as a checked rule: each module may name
//! (`crate::x`, `use crate::{x, y}`) only the modules its row allows, so that an import against
//! the layers fails a test instead of waiting for a review. Checked on the source, like the
//! collector's `tests/layers.rs`.

use std::path::{Path, PathBuf};

/// Each module (a file, or a directory and everything in it), and the `crate::` roots it may
/// name. Keep it the README's table: a change here is a change of the map.
const ALLOWED: &[(&str, &[&str])] = &[
    // Top: the ways in, and the lifecycle that wires the process.
    (
        "lifecycle.rs",
        &[
            "clock",
            "config",
            "guard",
            "log",
            "once",
            "recording",
            "secure",
            "stack",
            "symbols",
            "transport",
        ],
    ),
    (
        "pluggable.rs",
        &[
            "recording",
            "driver_query",
            "symbols",
            "guard",
            "cuda",
            "log",
        ],
    ),
    (
        "torch_allocator.rs",
        &[
            "torch_tracker",
            "torch_abi",
            "torch_reserve",
            "recording",
            "transport",
            "driver_query",
            "config",
            "symbols",
            "guard",
            "log",
        ],
    ),
    (
        "torch_tracker.rs",
        &["torch_abi", "recording", "symbols", "guard", "log"],
    ),
    (
        "hooks",
        &[
            "hooks",
            "recording",
            "driver_query",
            "symbols",
            "modules",
            "guard",
            "cuda",
            "clock",
            "once",
            "log",
        ],
    ),
    // Below every way in, knowing none of them.
    (
        "recording.rs",
        &[
            "stack",
            "transport",
            "driver_query",
            "torch_reserve",
            "clock",
        ],
    ),
    // Capture.
    (
        "stack",
        &[
            "stack",
            "python",
            "transport",
            "modules",
            "config",
            "cache_line",
        ],
    ),
    ("python", &["python", "transport", "symbols", "log"]),
    // Transport.
    (
        "transport",
        &[
            "transport",
            "config",
            "clock",
            "symbols",
            "guard",
            "once",
            "log",
            "cache_line",
        ],
    ),
    // Leaves. `guard` asks the crate root's `start_tracing` (which is `lifecycle::start`) on a
    // process's first hook: the one sanctioned upward call.
    ("guard.rs", &["cache_line", "log", "once", "start_tracing"]),
    ("torch_abi.rs", &["symbols"]),
    ("torch_reserve.rs", &[]),
    ("driver_query.rs", &["symbols", "cuda"]),
    ("symbols.rs", &["modules", "once", "log"]),
    ("modules.rs", &["log", "once", "symbols"]),
    ("config.rs", &["log", "once", "symbols"]),
    ("cuda.rs", &["log", "once", "symbols"]),
    ("clock.rs", &["log", "once", "symbols"]),
    ("once.rs", &["log", "once", "symbols"]),
    ("log.rs", &["log", "once", "symbols"]),
    ("python_env.rs", &["log", "once", "symbols", "secure"]),
    ("secure.rs", &[]),
    ("cache_line.rs", &["log", "once", "symbols"]),
];

/// Within `transport/`, the siblings (`super::x`) a file may name: the drain loop sits on top
/// of its parts, and no part names the loop.
const TRANSPORT_SIBLINGS: &[(&str, &[&str])] = &[
    ("fd_guard.rs", &[]),
    ("sink.rs", &[]),
    ("spawn.rs", &[]),
    ("file.rs", &["fd_guard"]),
    ("socket.rs", &["fd_guard", "sink"]),
    ("msg.rs", &[]),
    ("ring.rs", &["msg"]),
    ("outbox.rs", &["msg", "ring"]),
    ("frame.rs", &["msg", "outbox"]),
    ("hello.rs", &["fd_guard"]),
    (
        "delivery.rs",
        &[
            "fd_guard", "file", "frame", "sink", "socket", "spawn", "outbox", "msg",
        ],
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
    v.sort();
    v
}

/// The source without comments (a comment may name any module), lines kept.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The roots named after each `prefix` (`crate::`, `super::`) in `code`, with their line:
/// `prefix::x` names `x`, `prefix::{x::y, z}` names `x` and `z`.
fn named(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut rest = code;
    let mut offset = 0;
    while let Some(at) = rest.find(prefix) {
        let start = offset + at + prefix.len();
        // `$crate::` and `foo_crate::` are not this crate's root.
        let before = code[..offset + at].chars().next_back();
        let line = code[..start].matches('\n').count() + 1;
        let after = &code[start..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            if let Some(group) = after.strip_prefix('{') {
                let mut depth = 0;
                let mut item = String::new();
                let mut items = Vec::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                        _ if depth == 0 => item.push(c),
                        _ => {}
                    }
                }
                items.push(item);
                for item in items {
                    let root = ident(item.trim());
                    if !root.is_empty() && root != "self" {
                        found.push((line, root));
                    }
                }
            } else {
                let root = ident(after);
                if !root.is_empty() {
                    found.push((line, root));
                }
            }
        }
        offset = start;
        rest = &code[start..];
    }
    found
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn modules_import_only_what_the_map_allows() {
    let src = src();
    let mut wrong = Vec::new();
    for (module, allowed) in ALLOWED {
        for file in sources(&src.join(module)) {
            let code = code_of(&std::fs::read_to_string(&file).expect("readable source"));
            for (line, root) in named(&code, "crate::") {
                if !allowed.contains(&root.as_str()) {
                    wrong.push(format!("{}:{line}: crate::{root}", file.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the module map (shim/README.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn transport_parts_do_not_name_the_drain_loop() {
    let dir = src().join("transport");
    let mut wrong = Vec::new();
    for (file, allowed) in TRANSPORT_SIBLINGS {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            wrong.push(format!("{}: listed but missing", path.display()));
            continue;
        };
        for (line, root) in named(&code_of(&text), "super::") {
            let sibling = dir.join(format!("{root}.rs")).is_file() || dir.join(&root).is_dir();
            if sibling && !allowed.contains(&root.as_str()) {
                wrong.push(format!("{}:{line}: super::{root}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against transport's layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_has_a_row() {
    let src = src();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&src).expect("source directory") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8");
        if name != "lib.rs" && !ALLOWED.iter().any(|(m, _)| *m == name) {
            missing.push(name);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "modules without a row in the module map: {missing:?}"
    );
}

#[test]
fn the_check_sees_single_and_grouped_imports() {
    let code = code_of(
        "use crate::a::b;\nuse crate::{c, d::e, self};\n// crate::f\n$crate::g\nlet x = crate::h();",
    );
    let roots: Vec<_> = named(&code, "crate::").into_iter().collect();
    assert_eq!(
        roots,
        vec![
            (1, "a".to_string()),
            (2, "c".to_string()),
            (2, "d".to_string()),
            (5, "h".to_string())
        ]
    );
}
