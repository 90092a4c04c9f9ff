//! The shim's module map (README.md "Module map") as a checked rule: each module may name
//! (`crate::x`, `use crate::{x, y}`) only the modules its row allows, so that an import against
//! the layers fails a test instead of waiting for a review. Checked on the source by the one
//! import checker both crates' layers tests share (`tests/src/import_check.rs`).

use std::path::{Path, PathBuf};

#[path = "../../tests/src/import_check.rs"]
mod import_check;

use import_check::{against_rows, circles, code_of, named, without_rows};

/// Each module (a file, or a directory and everything in it), and the `crate::` roots it may
/// name. Keep it the README's table: a change here is a change of the map.
const ALLOWED: &[(&str, &[&str])] = &[
    // Top: the ways in, and the lifecycle that wires the process.
    (
        "lifecycle.rs",
        &[
            "clock",
            "config",
            "device_watch",
            "guard",
            "log",
            "once",
            "recording",
            "secure",
            "stack",
            "symbols",
            "torch_reserve",
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
            "device_watch",
            "transport",
            "driver_query",
            "config",
            "cuda",
            "symbols",
            "guard",
            "log",
        ],
    ),
    (
        "torch_tracker.rs",
        &[
            "torch_abi",
            "torch_layout",
            "recording",
            "cuda",
            "symbols",
            "guard",
            "log",
        ],
    ),
    (
        "hooks",
        &[
            "hooks",
            "recording",
            "device_watch",
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
        &["stack", "transport", "driver_query", "clock", "this_thread"],
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
            "this_thread",
            "log",
            "once",
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
            "this_thread",
        ],
    ),
    // Leaves. `guard` asks the crate root's `start_tracing` (which is `lifecycle::start`) on a
    // process's first hook: the one sanctioned upward call.
    (
        "guard.rs",
        &["cache_line", "log", "once", "this_thread", "start_tracing"],
    ),
    ("torch_abi.rs", &["symbols"]),
    ("torch_layout.rs", &[]),
    ("torch_reserve.rs", &["cuda", "this_thread"]),
    ("device_watch.rs", &[]),
    ("driver_query.rs", &["symbols", "cuda"]),
    ("symbols.rs", &["modules", "once", "log"]),
    // The bottom: `log` writes through `once`; `modules`, `once` and the rest of the leaves
    // name nothing above them, so that no two leaves allow a circle.
    ("modules.rs", &[]),
    ("config.rs", &["log", "once", "symbols"]),
    ("cuda.rs", &["log", "once", "symbols"]),
    ("clock.rs", &["log", "once", "symbols"]),
    ("once.rs", &[]),
    ("log.rs", &["once"]),
    ("python_env.rs", &["log", "once", "symbols", "secure"]),
    ("secure.rs", &[]),
    ("this_thread.rs", &[]),
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

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn modules_import_only_what_the_map_allows() {
    let wrong = against_rows(&src(), ALLOWED, "crate::");
    assert!(
        wrong.is_empty(),
        "imports against the module map (shim/README.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_rows_allow_a_circle() {
    let found = circles(ALLOWED);
    assert!(found.is_empty(), "circles the module map allows: {found:?}");
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
    let missing = without_rows(&src(), ALLOWED, &["lib.rs"]);
    assert!(
        missing.is_empty(),
        "modules without a row in the module map: {missing:?}"
    );
}
