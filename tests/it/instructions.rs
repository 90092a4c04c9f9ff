//! Instructions per cudaMalloc+cudaFree pair and per tensor do not regress:
//! `scripts/bench-instructions.sh` (valgrind's callgrind, a release build) against the committed table
//! `bench/instructions.tsv`. Instructions do not swing with the machine's load, so a figure
//! more than 10 % above the table is a change in the code, not noise (the drain thread's, which
//! depends on valgrind's thread scheduling, 50 %). Every figure of the
//! per-pair table is held: the program's thread (over untraced and in all), the shim's drain
//! thread, the collector, and `run`'s replay at exit.
//!
//! Per tensor on real PyTorch (the pinned release, installed by `scripts/torch-env.sh` if
//! missing, as the torch tier does), the untraced and the default (`methods`) rows are held too,
//! from 300 and 1,200 tensors: the script counts the timed loop alone, so fewer tensors give the
//! same figures, in about three minutes. `OOMTRACE_INSTRUCTIONS_TORCH=1` holds every PyTorch
//! mode (the trace tracker, `_record_memory_history`) at the table's own 1,000 and 4,000, about
//! ten minutes. After an improvement, write the new figures into the table with
//! `scripts/bench-instructions.sh --tsv bench/instructions.tsv`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use oomtrace_tests::{import_check, precondition, repo};

/// How far a figure may rise over the committed one.
const TOLERANCE: f64 = 0.10;
/// The PyTorch modes every run holds (the rest with `OOMTRACE_INSTRUCTIONS_TORCH=1`).
const QUICK_TORCH_MODES: [&str; 2] = ["untraced", "methods"];
/// The drain thread's figure depends on how many messages it finds per wake-up, which is how
/// valgrind happened to schedule the threads: one build measured 313 to 363 instructions a
/// pair in six runs (its other figures within 3), another 311 to 403 on 2026-12-05, and the
/// builds of that night 305 to 425: a table written from a low run must not fail a high one.
/// A code change is still seen beyond this.
const DRAIN_TOLERANCE: f64 = 0.50;
/// Figures this small (the untraced rows' zeros, the drain thread with few events) may move
/// by this many instructions whatever their share.
const SLACK: i64 = 30;

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `mode<TAB>column<TAB>value` lines.
fn figures(text: &str) -> BTreeMap<(String, String), i64> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "not mode, column, value: {l:?}");
            let v = f[2]
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {l:?}"));
            ((f[0].to_string(), f[1].to_string()), v)
        })
        .collect()
}

/// The release build the script measures (the shim, the CLI, simcuda and bench_pairs), made
/// here so that the figures are this tree's. Cargo's lock for the release directory is not the
/// one the running `cargo test` holds.
fn build_release(root: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "oomtrace-shim",
            "-p",
            "oomtrace",
            "-p",
            "oomtrace-tests",
        ])
        .status()
        .expect("cargo build --release");
    assert!(status.success(), "the release build failed");
}

#[test]
fn instructions_per_pair_and_tensor_hold_against_the_committed_table() {
    if !precondition(on_path("valgrind"), "valgrind (Debian: valgrind)") {
        return;
    }
    let root = repo();
    build_release(&root);
    let torch = std::env::var_os("OOMTRACE_INSTRUCTIONS_TORCH").is_some_and(|v| v == "1");
    let dir = oomtrace_tests::scratch("instructions");
    let tsv = dir.join("now.tsv");
    let mut cmd = Command::new(root.join("scripts/bench-instructions.sh"));
    cmd.arg("--tsv").arg(&tsv);
    if !torch {
        cmd.args(["--torch-modes", &QUICK_TORCH_MODES.join(" "), "300", "1200"]);
        eprintln!(
            "instructions: per pair, and per tensor untraced and methods only \
             (OOMTRACE_INSTRUCTIONS_TORCH=1 adds the other PyTorch modes, about ten minutes)"
        );
    }
    let out = cmd.output().expect("bench-instructions.sh");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench-instructions.sh failed: {table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{table}");
    let now = figures(&std::fs::read_to_string(&tsv).expect("the figures"));
    let committed = figures(
        &std::fs::read_to_string(root.join("bench/instructions.tsv")).expect("the committed table"),
    );
    assert!(!now.is_empty(), "the script measured nothing");
    let mut worse = Vec::new();
    for ((mode, column), &value) in &now {
        let Some(&was) = committed.get(&(mode.clone(), column.clone())) else {
            worse.push(format!(
                "{mode} {column}: {value}, not in bench/instructions.tsv (add it)"
            ));
            continue;
        };
        let share = if column == "drain" {
            DRAIN_TOLERANCE
        } else {
            TOLERANCE
        };
        let bound = was + ((was as f64 * share) as i64).max(SLACK);
        if value > bound {
            worse.push(format!(
                "{mode} {column}: {value} instructions, the table says {was} (at most {bound})"
            ));
        }
    }
    for (mode, column) in committed.keys() {
        let measured =
            mode.starts_with("pairs-") || torch || QUICK_TORCH_MODES.contains(&mode.as_str());
        if measured && !now.contains_key(&(mode.clone(), column.clone())) {
            let why = if mode.starts_with("pairs-") {
                ""
            } else {
                " (the PyTorch rows need scripts/torch-env.sh to succeed)"
            };
            worse.push(format!(
                "{mode} {column}: in the table, no longer measured{why}"
            ));
        }
    }
    assert!(
        worse.is_empty(),
        "instructions regressed:\n{}",
        worse.join("\n")
    );
}

/// Every `static` of the shim's `CacheLine` type (`shim/src/cache_line.rs`), found in the
/// sources (comments left out), with its module path (`oomtrace::transport::fd_guard::LOCKED`).
fn cache_line_statics(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for path in import_check::sources(src) {
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a source file");
        let module: Vec<String> = path
            .strip_prefix(src)
            .unwrap()
            .with_extension("")
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .filter(|c| c != "mod" && c != "lib")
            .collect();
        for line in import_check::code_of(&text).lines() {
            let Some((_, rest)) = line.trim_start().split_once("static ") else {
                continue;
            };
            if let Some((name, ty)) = rest.split_once(':') {
                if ty.trim_start().starts_with("CacheLine<") {
                    found.push(format!("oomtrace::{}::{}", module.join("::"), name.trim()));
                }
            }
        }
    }
    found.sort();
    found
}

/// A `CacheLine` static keeps its whole line in the release build: under fat LTO, LLVM split
/// such a global into its fields and dropped the padding, and the hooks' mode shared its line
/// with the statics after it. The symbol's size in `liboomtrace.so` is the type's, 128 bytes,
/// for each one in the sources.
#[test]
fn cache_line_statics_keep_their_lines_in_the_release_build() {
    let root = repo();
    build_release(&root);
    let statics = cache_line_statics(&root.join("shim/src"));
    assert!(
        statics.iter().any(|s| s == "oomtrace::guard::MODE"),
        "the hooks' mode was not found among the CacheLine statics: {statics:?}"
    );
    let lib = root.join("target/release/liboomtrace.so");
    let nm = Command::new("nm")
        .args(["-C", "-S"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) lists the release library's symbols");
    assert!(nm.status.success(), "nm {} failed", lib.display());
    let listing = String::from_utf8_lossy(&nm.stdout);
    for name in &statics {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("{name} is not in {}", lib.display()));
        let size = line.split_whitespace().nth(1).expect("nm -S gives a size");
        assert_eq!(
            u64::from_str_radix(size, 16).ok(),
            Some(128),
            "{name} is {size} bytes in the release build, not its whole line (is it #[used]?)"
        );
    }
}
