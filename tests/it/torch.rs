//! The real-PyTorch tier: the pinned `torch` CUDA wheel from PyPI (its own cudart, cuBLAS,
//! cuBLASLt and caching allocator) runs on simcuda, and every oomtrace mode is checked on the
//! training scripts in `tests/scenarios/torch/`.
//!
//! The wheel lives in a virtual environment outside the clone, made (or found) by
//! `scripts/torch-env.sh`: a machine without it installs it here, never skips.
//!
//! Every script runs in five modes:
//! - `run`: `oomtrace run` with no flag (oomtrace's trace tracker on PyTorch's own caching
//!   allocator, the default: every tensor, and PyTorch's statistics keep working; steps come
//!   from the optimizer hook that `run` installs);
//! - `preload`: plain `LD_PRELOAD` (the shim starts its own collector and, in a Python
//!   program, sets up the same tracker and optimizer hook), then `oomtrace report` on the
//!   trace it leaves, right after the program returns;
//! - `segments`: `oomtrace run --segments` (no tracker: the shim sees the caching allocator's
//!   segments, as for a program without PyTorch);
//! - `torch_swap`: `oomtrace run --torch=swap` (every tensor through oomtrace's allocator);
//! - `own_allocator`: the user's own `change_current_allocator(CUDAPluggableAllocator(...))`
//!   pointing at oomtrace's entry points, under `oomtrace run`.
//!
//! Kernels are no-ops on simcuda, so the values computed are garbage; what a memory tracer
//! sees (allocations, frees, streams, copies, the allocator's decisions) is PyTorch's own.
//! PyTorch runs with address-space randomisation off (see simcuda's README: with it on,
//! cuBLAS's first GEMM sometimes picks another kernel on the simulated driver).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use oomtrace_tests::*;
use serde_json::Value;

mod every_version;
mod fit;
mod fragmentation;
mod memory_cap;
mod one_bug;
mod python_api;
mod simulate;
mod slow_leaks;
mod snapshots;
mod step_memory;
mod whatif;
mod words;

/// How long one PyTorch run may take (importing torch alone takes a few seconds).
pub(crate) const TORCH_TIMEOUT: Duration = Duration::from_secs(240);
const STEPS: u64 = 40;

/// The torch release the tier runs with when `TORCH_TIER_VERSION` is unset: the one
/// `scripts/torch-env.sh` pins (its `PINNED_VERSION=` line, read from the script so that the
/// two cannot disagree).
pub(crate) fn pinned_torch() -> &'static str {
    static PINNED: OnceLock<String> = OnceLock::new();
    PINNED.get_or_init(|| {
        let path = repo().join("scripts/torch-env.sh");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.lines()
            .find_map(|l| l.strip_prefix("PINNED_VERSION="))
            .unwrap_or_else(|| panic!("no PINNED_VERSION= line in {}", path.display()))
            .trim()
            .to_string()
    })
}

/// The torch release under test: `TORCH_TIER_VERSION` (a test-only variable, set by
/// `scripts/torch-tier.sh VERSION`), or the pinned one when it is unset or empty.
pub(crate) fn torch_version() -> String {
    match std::env::var("TORCH_TIER_VERSION") {
        Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
        _ => pinned_torch().to_string(),
    }
}

/// The interpreter of the venv with the torch release under test ([`torch_version`]), from
/// `scripts/torch-env.sh VERSION` (which installs the wheel if missing: never skipped).
pub(crate) fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let version = torch_version();
        let out = Command::new(repo().join("scripts/torch-env.sh"))
            .arg(&version)
            .output()
            .expect("run scripts/torch-env.sh");
        assert!(
            out.status.success(),
            "scripts/torch-env.sh {version} failed: the real-PyTorch tier needs it\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(path.is_file(), "torch-env.sh printed {}", path.display());
        path
    })
}

fn script(name: &str) -> PathBuf {
    repo().join("tests/scenarios/torch").join(name)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Run,
    Preload,
    Segments,
    /// `oomtrace run --torch`: what `run` does by default, said explicitly.
    Torch,
    TorchSwap,
    OwnAllocator,
}

impl Mode {
    /// Tensor-level modes see every tensor with the Python line that made it.
    fn tensor_level(self) -> bool {
        self != Mode::Segments
    }

    /// PyTorch allocates through oomtrace's pluggable allocator (no caching, no statistics,
    /// and no OutOfMemoryError).
    fn swapped(self) -> bool {
        matches!(self, Mode::TorchSwap | Mode::OwnAllocator)
    }

    /// The API a tensor's allocation is recorded under.
    fn tensor_api(self) -> &'static str {
        if self.swapped() {
            "oomtrace_malloc"
        } else {
            "oomtrace_torch_alloc"
        }
    }
}

struct TorchRun {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    report: Value,
    /// `oomtrace report` (text) on the trace.
    text: String,
    trace: PathBuf,
    _dir: Scratch,
}

/// The command for one mode, in `dir`, with the simulated driver and this build's oomtrace.
fn command(script_name: &str, mode: Mode, dir: &Path, env: &[(&str, &str)]) -> Command {
    let trace = dir.join("trace.oomt");
    let json = dir.join("report.json");
    let mut cmd = match mode {
        Mode::Preload => {
            let mut c = base_command(python());
            c.env("LD_PRELOAD", shim())
                .env("OOMTRACE_COLLECTOR", oomtrace_bin());
            c
        }
        _ => {
            let mut c = base_command(oomtrace_bin());
            c.arg("run").arg("--json").arg(&json).arg("-o").arg(&trace);
            match mode {
                Mode::Torch => {
                    c.arg("--torch");
                }
                Mode::TorchSwap => {
                    c.arg("--torch=swap");
                }
                Mode::Segments => {
                    c.arg("--segments");
                }
                _ => {}
            }
            c.arg("--").arg(python());
            c
        }
    };
    cmd.arg(script(script_name)).current_dir(dir);
    torch_env(&mut cmd, dir);
    cmd.env("STEPS", STEPS.to_string())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("OWN_ALLOCATOR");
    if mode == Mode::OwnAllocator {
        cmd.env("OWN_ALLOCATOR", "1");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    without_aslr(&mut cmd);
    cmd
}

/// What every PyTorch run here gets: lazy module loading (as the real driver defaults to),
/// no `__pycache__` written into the repository's scripts, and PyTorch's own cache directory
/// (which `import torch` makes, `/tmp/torchinductor_<user>` by default) inside the test's
/// scratch directory, so that a test run leaves nothing behind.
pub(crate) fn torch_env(cmd: &mut Command, dir: &Path) {
    cmd.env("CUDA_MODULE_LOADING", "LAZY")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TORCHINDUCTOR_CACHE_DIR", dir.join("torchinductor"));
}

/// Runs the command with address-space randomisation off (see the module doc); inherited by
/// everything it starts.
pub(crate) fn without_aslr(cmd: &mut Command) {
    // SAFETY: personality(2) is async-signal-safe; it only sets a flag the exec keeps.
    unsafe {
        cmd.pre_exec(|| {
            libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            Ok(())
        });
    }
}

/// PyTorch's autograd thread sometimes aborts the interpreter at exit ("terminate called
/// without an active exception", pytorch#38228), with or without tracing: not ours.
pub(crate) fn pytorch_exit_abort(status: &std::process::ExitStatus, stderr: &str) -> bool {
    (status.signal() == Some(libc::SIGABRT) || status.code() == Some(134))
        && stderr.contains("terminate called without an active exception")
}

fn run_torch(script_name: &str, mode: Mode, env: &[(&str, &str)]) -> TorchRun {
    let python = python();
    for attempt in 0..2 {
        let dir = scratch(&format!(
            "torch-{}-{mode:?}",
            script_name.trim_end_matches(".py")
        ));
        let out = output_within(command(script_name, mode, &dir, env), TORCH_TIMEOUT);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if attempt == 0 && pytorch_exit_abort(&out.status, &stderr) {
            eprintln!("{script_name} {mode:?}: PyTorch aborted at exit (pytorch#38228); once more");
            continue;
        }
        let trace = match mode {
            Mode::Preload => {
                let found = traces_in(&dir);
                assert_eq!(
                    found.len(),
                    1,
                    "one trace in {}: {found:?}\n{stderr}",
                    dir.display()
                );
                found[0].clone()
            }
            _ => dir.join("trace.oomt"),
        };
        let report = match mode {
            Mode::Preload => report_json(&trace),
            _ => serde_json::from_str(
                &std::fs::read_to_string(dir.join("report.json"))
                    .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}")),
            )
            .expect("valid JSON"),
        };
        let text = report_text(&trace);
        if mode != Mode::Preload {
            // Said by the collector (`cli/src/handoff.rs`): the trace's own, tensors, roles,
            // levers and all.
            assert_run_said_what_the_trace_says(&stderr, &trace, &dir.join("report.json"));
        }
        // Nothing was rebuilt between the run and the report: every module's file matches
        // (real PyTorch's libraries carry SystemTap probe notes of the build id's note type,
        // which a careless reader took for the id: every library looked rebuilt).
        assert_eq!(
            report["stale_modules"],
            serde_json::json!([]),
            "no module changed since the run\n{stderr}"
        );
        let _ = python;
        return TorchRun {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
            report,
            text,
            trace,
            _dir: dir,
        };
    }
    unreachable!()
}

// ---- What every run must show --------------------------------------------------------------

/// The program ran to its end, with its own exit code, and the trace is whole.
fn assert_ran(r: &TorchRun, code: i32) {
    assert_eq!(
        r.status.code(),
        Some(code),
        "exit status {:?}\nstdout:\n{}\nstderr:\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
    assert_eq!(
        r.report["trace"]["complete"], true,
        "{:#}",
        r.report["trace"]
    );
    assert!(!r.text.contains("incomplete trace"), "{}", r.text);
    assert!(!r.stderr.contains("ends early"), "{}", r.stderr);
    let procs = processes(&r.report);
    assert_eq!(procs.len(), 1, "{:#}", r.report["processes"]);
    assert!(
        procs[0]["lost_events"].as_u64() == Some(0),
        "{:#}",
        procs[0]
    );
}

fn assert_done(r: &TorchRun) {
    assert!(
        r.stdout.contains(&format!("done {STEPS}")),
        "stdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
}

/// Leak-like findings: a site that leaks, or a process whose device memory keeps growing.
fn growth_findings(report: &Value) -> Vec<&Value> {
    report["findings"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|f| matches!(f["kind"].as_str(), Some("leak" | "device_growth")))
                .collect()
        })
        .unwrap_or_default()
}

fn python_frames(finding: &Value) -> Vec<(String, u64)> {
    finding["stack"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter(|fr| fr["python"] == true)
                .map(|fr| {
                    let file = fr["file"].as_str().unwrap_or("");
                    (
                        file.rsplit('/').next().unwrap_or(file).to_string(),
                        fr["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn has_frame(finding: &Value, file: &str, line: u64) -> bool {
    python_frames(finding)
        .iter()
        .any(|(f, l)| f == file && *l == line)
}

/// Steps counted from the optimizer: one per training step (plus one when the first step
/// carries the program's own marker too). In every mode: `run` installs the hook, and so does
/// the shim in a Python program under plain `LD_PRELOAD`.
fn assert_steps_from_optimizer(r: &TorchRun) {
    let steps = processes(&r.report)[0]["steps"].as_u64().unwrap_or(0);
    assert!(
        (STEPS..=STEPS + 1).contains(&steps),
        "steps {steps}: {:#}",
        processes(&r.report)[0]
    );
}

/// Both halves of --torch worked on torch 2.15 (the tracker attached, or the allocator was
/// swapped; the step hook reaches torch.optim.optimizer, which `import torch` hides): nothing
/// is said.
fn assert_torch_said_nothing(r: &TorchRun) {
    for said in [
        "not swapped",
        "no oomtrace trace tracker",
        "not marked",
        "cannot set up tracing",
    ] {
        assert!(!r.stderr.contains(said), "{}", r.stderr);
    }
}

fn assert_no_growth_finding(r: &TorchRun) {
    let found = growth_findings(&r.report);
    assert!(
        found.is_empty(),
        "a clean loop reported as growing:\n{:#?}\n{}",
        found.iter().map(|f| &f["message"]).collect::<Vec<_>>(),
        r.stderr
    );
    assert!(!r.stderr.contains(" leak]"), "{}", r.stderr);
}

// ---- The leaky loop: an activation kept in a list every step ---------------------------------

fn leak_activations(mode: Mode) {
    let r = run_torch("leak_activations.py", mode, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    check_activation_leak(&r, mode, "leak_activations.py", 10);
}

/// What a 4 MiB-per-step leak at `file:line` shows in each mode.
fn check_activation_leak(r: &TorchRun, mode: Mode, file: &str, line: u64) {
    let found = growth_findings(&r.report);
    match mode {
        Mode::Run | Mode::Preload | Mode::Torch | Mode::TorchSwap | Mode::OwnAllocator => {
            assert_steps_from_optimizer(r);
            if mode != Mode::OwnAllocator {
                assert_torch_said_nothing(r);
            }
            let leak = found
                .iter()
                .find(|f| f["kind"] == "leak" && has_frame(f, file, line))
                .unwrap_or_else(|| panic!("no leak at {file}:{line}: {:#?}\n{}", found, r.text));
            assert_eq!(leak["level"], "confirmed", "{leak:#}");
            // Tensor level: exactly the 4 MiB each step keeps.
            let rate = leak["growth_bytes_per_step"].as_f64().unwrap();
            assert!(
                (rate - 4.0 * MIB as f64).abs() < 0.01 * MIB as f64,
                "{rate}"
            );
            // Its evidence as detected, never "0 B held" after the list is freed at exit.
            let at = &leak["evidence"]["at_detection"];
            assert!(at["bytes"].as_u64().unwrap() >= 12 * MIB, "{at:#}");
            assert!(
                !leak["message"].as_str().unwrap().contains(" 0 B held"),
                "{leak:#}"
            );
            // Text and JSON agree on the Python frames; the live line names the line (plain
            // LD_PRELOAD prints nothing by design).
            assert_text_has_python_frames(&r.text, &leak["stack"]);
            assert!(
                mode == Mode::Preload || r.stderr.contains(&format!("({file}:{line})")),
                "no live line naming {file}:{line}:\n{}",
                r.stderr
            );
            // A device growth the leak accounts for says so in a short line: the leak's own
            // line names the place (it ran past 400 characters with the cache's lines).
            for l in r.stderr.lines().filter(|l| l.contains("explained by")) {
                assert!(l.chars().count() <= 200 && !l.contains("grew at"), "{l}");
            }
            // Every tensor went through oomtrace's allocator, and the bytes are exact: 40 steps
            // of 4 MiB, still held at the end (or said to be freed at exit).
            assert_eq!(leak["api"], mode.tensor_api(), "{leak:#}");
            let end = &leak["evidence"]["at_end"];
            if end["state"] == "held" {
                assert_eq!(end["bytes"].as_u64(), Some(STEPS * 4 * MIB), "{end:#}");
                assert_eq!(end["count"].as_u64(), Some(STEPS), "{end:#}");
                assert!(
                    leak["message"]
                        .as_str()
                        .unwrap()
                        .contains("160.00 MiB still held in 40"),
                    "{leak:#}"
                );
            } else {
                assert!(
                    leak["message"].as_str().unwrap().contains("freed at exit"),
                    "{leak:#}"
                );
            }
        }
        Mode::Segments => {
            assert_steps_from_optimizer(r);
            // Segment level: the process's CUDA memory grows step after step, at the
            // segments' rate (close to the 4 MiB the tensors keep), live and in the report.
            let f = found
                .iter()
                .find(|f| f["kind"] == "device_growth")
                .unwrap_or_else(|| {
                    panic!(
                        "no device growth at segment level:\n{}\n{}",
                        r.text, r.stderr
                    )
                });
            assert!(
                matches!(f["level"].as_str(), Some("likely" | "confirmed")),
                "{f:#}"
            );
            assert_eq!(f["evidence"]["events"], "segments", "{f:#}");
            let rate = f["growth_bytes_per_step"].as_f64().unwrap();
            assert!(
                (2.0 * MIB as f64..8.0 * MIB as f64).contains(&rate),
                "{rate}: {f:#}"
            );
            // Live while the job runs.
            assert!(r.stderr.contains("device growth] pid"), "{}", r.stderr);
            // Which lines made the cache grow: the leaking line, or the backward pass whose
            // cuBLAS workspace happened to need the new segment (named by its forward line, or
            // the autograd thread's kind where no node says it); in text as in JSON.
            let lines = f["evidence"]["python_lines"]
                .as_array()
                .expect("python_lines");
            assert!(
                lines.iter().any(|l| {
                    (l["file"].as_str().unwrap_or("").ends_with(file) && l["line"] == line)
                        || l["description"].as_str().is_some_and(|d| {
                            d.starts_with("backward") || d.contains("autograd thread")
                        })
                }),
                "{lines:#?}"
            );
            assert!(r.text.contains("cache grew at: "), "{}", r.text);
            // It says what names the tensor.
            assert!(
                f["hint"]
                    .as_str()
                    .unwrap()
                    .contains("`oomtrace run` traces each tensor by default"),
                "{f:#}"
            );
        }
    }
}

// ---- `total_loss += loss`: every step's graph retained -----------------------------------

fn total_loss(mode: Mode) {
    let r = run_torch("total_loss.py", mode, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    let found = growth_findings(&r.report);
    assert_steps_from_optimizer(&r);
    let f = found
        .iter()
        .find(|f| !mode.tensor_level() || has_frame(f, "total_loss.py", 11))
        .unwrap_or_else(|| panic!("no growth found: {:#?}\n{}\n{}", found, r.text, r.stderr));
    assert!(
        matches!(f["level"].as_str(), Some("likely" | "confirmed")),
        "{f:#}"
    );
    let rate = f["growth_bytes_per_step"].as_f64().unwrap();
    assert!(rate >= 0.5 * MIB as f64, "{rate}: {f:#}");
    if mode.tensor_level() {
        // The graph's tensors are made at line 11, by the loss computed outside no_grad.
        assert_text_has_python_frames(&r.text, &f["stack"]);
        assert_eq!(f["api"], mode.tensor_api(), "{f:#}");
    }
}

// ---- Clean loops: no leak in any mode ----------------------------------------------------

fn clean(script_name: &str, mode: Mode) {
    let r = run_torch(script_name, mode, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    assert_no_growth_finding(&r);
    assert_steps_from_optimizer(&r);
}

// ---- Out of memory at a known line on a small device --------------------------------------

fn oom(mode: Mode) {
    let r = run_torch("oom.py", mode, &[("SIMCUDA_MEMORY", "512MiB")]);
    if mode.swapped() {
        // PyTorch's pluggable allocator does not raise for the NULL oomtrace_malloc returns:
        // the program goes on (its tensor has no memory), and oomtrace says so, live, once
        // per failure (rate-limited).
        assert_ran(&r, 0);
        assert!(
            r.stderr.contains("does not turn into an OutOfMemoryError"),
            "{}",
            r.stderr
        );
    } else {
        // The program's own exit code: Python's, for an uncaught torch.OutOfMemoryError
        // (raised by PyTorch's own allocator, with the tracker attached or not).
        assert_ran(&r, 1);
        assert!(r.stderr.contains("torch.OutOfMemoryError"), "{}", r.stderr);
    }
    let ooms: Vec<&Value> = findings(&r.report, "oom");
    let oom = ooms
        .iter()
        .find(|f| f["level"] == "error")
        .unwrap_or_else(|| panic!("no OOM error: {:#?}\n{}", r.report["findings"], r.text));
    // The failed request names the line that asked for the memory, in JSON, text and live.
    assert!(
        has_frame(oom, "oom.py", 10),
        "OOM not at oom.py:10: {:?}\n{}",
        python_frames(oom),
        r.text
    );
    assert_text_has_python_frames(&r.text, &oom["stack"]);
    if mode != Mode::Preload {
        assert!(
            r.stderr.contains("[oom error]") && r.stderr.contains("(oom.py:10)"),
            "{}",
            r.stderr
        );
    }
    if mode.tensor_level() && !mode.swapped() {
        // One OOM, one finding: the cudaMalloc refusals PyTorch's allocator met while placing
        // the scratch (before and after emptying its cache) are that tensor's out-of-memory,
        // said once, live too, and never by oomtrace's entry point's name.
        let errors = ooms.iter().filter(|f| f["level"] == "error").count();
        assert_eq!(errors, 1, "{:#?}", r.report["findings"]);
        // What the device's memory was then (docs/anatomy.md), in JSON and text; the parts
        // add up to the device's bytes then.
        let a = &oom["anatomy"];
        let parts = a["tensor_bytes"].as_u64().unwrap()
            + a["reserve_gap_bytes"].as_u64().unwrap()
            + a["outside_pytorch_bytes"].as_u64().unwrap();
        assert_eq!(Some(parts), a["device_bytes"].as_u64(), "{a:#}");
        assert!(
            r.text.contains("what the device's memory was then"),
            "{}",
            r.text
        );
        assert!(!r.text.contains("oomtrace_torch_alloc"), "{}", r.text);
        if mode != Mode::Preload {
            assert_eq!(r.stderr.matches("[oom error]").count(), 1, "{}", r.stderr);
            assert!(!r.stderr.contains("oomtrace_torch_alloc"), "{}", r.stderr);
            // The run's summary says the OOM as the report does, with what held the memory.
            let summary = &r.stderr[r.stderr.find("first out-of-memory:").expect("summary")..];
            assert!(
                summary.contains("memory held at that moment by:"),
                "{summary}"
            );
        }
    }
    let o = &oom["oom"];
    assert_eq!(o["total_bytes"].as_u64(), Some(512 * MIB), "{o:#}");
    let asked = o["requested_bytes"].as_u64().unwrap_or(0);
    // Tensor level: the scratch buffer itself, a multiple of the 8 MiB it grows by; segment
    // level: the caching allocator's segment for it. Either did not fit in what the driver
    // said was free, after the scratch had grown past half the device (how far depends on
    // what else is held then: cuBLAS's 64 MiB workspace on the releases and paths that make
    // one).
    let free = o["free_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(asked >= 256 * MIB && asked > free, "{o:#}");
    if mode.tensor_level() {
        assert_eq!(asked % (8 * MIB), 0, "{o:#}");
    }
}

// ---- expandable_segments:True: the allocator grows one segment with VMM -------------------

fn expandable(mode: Mode) {
    let r = run_torch(
        "leak_activations.py",
        mode,
        &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")],
    );
    assert_ran(&r, 0);
    assert_done(&r);
    if mode == Mode::Segments {
        // The segment is mapped physical memory: cuMemCreate, not cudaMalloc.
        assert!(r.text.contains("cuMemCreate"), "{}", r.text);
    }
    if mode.tensor_level() && !mode.swapped() {
        // Listed where segments are, as PyTorch's cache.
        let segments = report_output(&["--segments"], &[&r.trace]);
        assert!(
            segments.contains("of PyTorch's cache (cuMemCreate)"),
            "{segments}"
        );
        // The physical memory mapped into the segment is PyTorch's cache, never memory
        // "outside PyTorch's allocator" (it was, before mapped segments counted as reserve):
        // what the device holds at exit is the cache plus what is outside it, to the byte.
        for f in r.report["findings"].as_array().expect("findings") {
            assert!(
                !(f["api"] == "cuMemCreate" && f["held"] == "outside_torch"),
                "{f:#}\n{}",
                r.text
            );
        }
        // `report --json` has the sections (`run --json` only the findings).
        let full = report_json(&r.trace);
        let section = &full["sections"][0];
        let device = &processes(&full)[0]["devices"][0];
        assert_eq!(
            section["outside_torch"]["live_at_exit_bytes"]
                .as_u64()
                .unwrap()
                + section["torch_cache"]["reserved_bytes"].as_u64().unwrap(),
            device["live_at_exit_bytes"].as_u64().unwrap(),
            "{section:#}\n{device:#}"
        );
    }
    check_activation_leak(&r, mode, "leak_activations.py", 10);
}

/// One test per mode named, each `mod $name::$mode` (run, preload, segments, torch_swap,
/// own_allocator). The default (`run`, `preload`) of the leaky and clean loops runs in
/// `every_version` (on every CI release), so those are not repeated here.
macro_rules! in_modes {
    ($($name:ident => $body:expr, [$($mode:ident),*];)*) => {
        $(
            mod $name {
                use super::*;
                $(
                    #[test]
                    fn $mode() { ($body)(Mode::named(stringify!($mode))) }
                )*
            }
        )*
    };
}

impl Mode {
    /// The mode a test of `in_modes!` is named after.
    fn named(name: &str) -> Mode {
        match name {
            "run" => Mode::Run,
            "preload" => Mode::Preload,
            "segments" => Mode::Segments,
            "torch_swap" => Mode::TorchSwap,
            "own_allocator" => Mode::OwnAllocator,
            other => panic!("no mode {other}"),
        }
    }
}

in_modes! {
    leaky_loop => leak_activations, [segments, torch_swap, own_allocator];
    total_loss_keeps_graphs => total_loss, [run, preload, segments, torch_swap, own_allocator];
    clean_loop => |m| clean("clean.py", m), [preload, segments, torch_swap, own_allocator];
    clean_loop_with_eval => |m| clean("clean_eval.py", m), [run, segments];
    clean_loop_with_dynamic_shapes => |m| clean("clean_dynamic.py", m), [segments, torch_swap];
    out_of_memory => oom, [run, preload, segments, torch_swap, own_allocator];
    expandable_segments => expandable, [run, preload, segments, torch_swap, own_allocator];
}

/// A KV cache grown by torch.cat (+1 MiB per step, each step's tensor replacing the last):
/// no tensor survives, yet the cat line's memory grows; `--torch` names that line as a leak
/// with its rate. The same cache kept at a fixed size is clean.
#[test]
fn kv_cache_grown_by_cat_is_a_leak_at_the_cat_line() {
    let r = run_torch("kv_cache.py", Mode::Torch, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    let leak = findings(&r.report, "leak")
        .into_iter()
        .find(|f| has_frame(f, "kv_cache.py", 18))
        .unwrap_or_else(|| panic!("no leak at kv_cache.py:18\n{}", r.text));
    let rate = leak["growth_bytes_per_step"].as_f64().unwrap();
    assert!(
        (rate - MIB as f64).abs() < 0.01 * MIB as f64,
        "{rate}: {leak:#}\n{}",
        r.text
    );
    assert!(leak["evidence"]["replaced"].is_object(), "{leak:#}");
    assert!(
        leak["hint"].as_str().unwrap().contains("torch.cat"),
        "{leak:#}"
    );
    assert!(r.stderr.contains("(kv_cache.py:18)"), "{}", r.stderr);

    let r = run_torch("kv_cache.py", Mode::Torch, &[("KV_WINDOW", "1")]);
    assert_ran(&r, 0);
    assert_done(&r);
    assert_no_growth_finding(&r);
}

// ---- The swap loses PyTorch's statistics (every_version.rs: the default keeps them) --------

/// The same script under the swap: PyTorch's statistics raise (what `--torch=swap` costs).
#[test]
fn torch_swap_loses_pytorch_statistics() {
    let r = run_torch("leak_logged.py", Mode::TorchSwap, &[]);
    assert_ne!(r.status.code(), Some(0), "{}", r.stdout);
    assert!(!r.stdout.contains("done"), "{}", r.stdout);
}

/// Device memory an extension allocates itself (cudaMalloc outside PyTorch's allocator),
/// growing while the tensors stay flat, is not the allocator's reserve: no fragmentation.
#[test]
fn memory_outside_pytorch_allocator_is_not_reserve() {
    let r = run_torch("extension_malloc.py", Mode::Torch, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    assert_torch_said_nothing(&r);
    let frag = findings(&r.report, "fragmentation");
    assert!(frag.is_empty(), "{frag:#?}\n{}", r.text);
    // The growth is seen, at the extension's line.
    let found = growth_findings(&r.report);
    assert!(
        found
            .iter()
            .any(|f| has_frame(f, "extension_malloc.py", 21)),
        "{found:#?}\n{}",
        r.text
    );
}

/// `oomtrace_malloc` reached through the pluggable-allocator API before anything loaded the
/// driver (torch has not initialized CUDA when `change_current_allocator` runs): it loads the
/// driver itself and hands out memory.
#[test]
fn own_allocator_works_before_cuda_is_initialized() {
    let r = run_torch("clean.py", Mode::OwnAllocator, &[]);
    assert_ran(&r, 0);
    assert!(!r.stderr.contains("no CUDA driver"), "{}", r.stderr);
    assert!(r.text.contains("oomtrace_malloc"), "{}", r.text);
}

// ---- The simulated driver itself ------------------------------------------------------------

/// What simcuda must do for real PyTorch (`driver_surface.py` checks each on its own line),
/// untraced: the tier's ground truth.
fn driver_surface_untraced(env: &[(&str, &str)]) {
    let dir = scratch("torch-driver-surface");
    let mut cmd = base_command(python());
    cmd.arg(script("driver_surface.py")).current_dir(&dir);
    torch_env(&mut cmd, &dir);
    cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF");
    for (k, v) in env {
        cmd.env(k, v);
    }
    without_aslr(&mut cmd);
    let out = output_within(cmd, TORCH_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    for what in [
        "ok device NVIDIA H100",
        "ok copies",
        "ok streams and events",
        "ok training step",
        "ok memory history",
        "ok mem_get_info",
        "done",
    ] {
        assert!(stdout.contains(what), "no `{what}`:\n{stdout}\n{stderr}");
    }
    assert!(!dir.join("__pycache__").exists());
}

#[test]
fn simcuda_runs_real_pytorch() {
    driver_surface_untraced(&[]);
}

#[test]
fn simcuda_runs_real_pytorch_with_expandable_segments() {
    driver_surface_untraced(&[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]);
}

/// The same script traced (segment level): it still passes every check, and the trace holds
/// the cuBLAS handle's workspace and PyTorch's segments.
#[test]
fn real_pytorch_runs_unchanged_under_oomtrace_run() {
    let r = run_torch("driver_surface.py", Mode::Run, &[]);
    assert_ran(&r, 0);
    assert!(r.stdout.contains("ok memory history"), "{}", r.stdout);
    assert!(r.text.contains("cublasCreate_v2"), "{}", r.text);
}

// ---- Plain LD_PRELOAD: the step hook in Python programs only, and only when nobody said ------

/// The shim's constructor sets up the tracker and the optimizer hook in a Python interpreter
/// (the hook alone with `OOMTRACE_TORCH=segments`), leaves any other program's environment
/// alone, and keeps out when `OOMTRACE_TORCH` is set otherwise (even empty).
#[test]
fn plain_preload_sets_up_tensors_and_steps_only_in_python() {
    let dir = scratch("preload-env");
    let preloaded_env = |program: &Path, args: &[&str], extra: &[(&str, &str)]| {
        let mut cmd = base_command(program);
        torch_env(&mut cmd, &dir);
        cmd.args(args)
            .current_dir(&dir)
            .env("LD_PRELOAD", shim())
            .env_remove("OOMTRACE_TORCH")
            .env("PYTHONPATH", "/user/path");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = output_within(cmd, TIMEOUT);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let show = "import os; print(os.environ.get('PYTHONPATH'), os.environ.get('OOMTRACE_TORCH'))";
    let shown = preloaded_env(python(), &["-c", show], &[]);
    let (path, torch) = shown.trim().rsplit_once(' ').expect("two words");
    let parts: Vec<&str> = path.split(':').collect();
    assert!(
        parts[0].ends_with("/boot") && parts[2] == "/user/path",
        "{shown}"
    );
    assert!(
        Path::new(parts[0]).join("sitecustomize.py").is_file(),
        "{shown}"
    );
    assert_eq!(torch, "tracker,steps", "{shown}");
    // Tensors opted out of: the step hook alone, said back with it named.
    let segments = preloaded_env(python(), &["-c", show], &[("OOMTRACE_TORCH", "segments")]);
    let (path, torch) = segments.trim().rsplit_once(' ').expect("two words");
    assert!(
        path.split(':').next().unwrap().ends_with("/boot"),
        "{segments}"
    );
    assert_eq!(torch, "segments,steps", "{segments}");
    // A Python child inherits both and is left alone: no second copy of the paths.
    let child = "import subprocess, sys; print(subprocess.run([sys.executable, '-c', \
                 \"import os; print(os.environ.get('PYTHONPATH'), \
                 os.environ.get('OOMTRACE_TORCH'))\"], capture_output=True, text=True)\
                 .stdout.strip())";
    let nested = preloaded_env(python(), &["-c", child], &[("OOMTRACE_TORCH", "segments")]);
    assert_eq!(nested.trim(), segments.trim(), "{nested}");
    // Not a Python interpreter: nothing changes.
    let env = preloaded_env(Path::new("/usr/bin/env"), &[], &[]);
    assert!(env.contains("PYTHONPATH=/user/path\n"), "{env}");
    assert!(!env.contains("OOMTRACE_TORCH"), "{env}");
    // Said not to: nothing changes either.
    let off = preloaded_env(python(), &["-c", show], &[("OOMTRACE_TORCH", "")]);
    assert_eq!(off.trim(), "/user/path", "{off}");
}

// ---- A leak made in the backward pass ------------------------------------------------------

/// The 1-based line of `tests/scenarios/torch/<name>` that contains `marker`.
fn torch_line_of(name: &str, marker: &str) -> u64 {
    line_of(&script(name), marker)
}

/// `leak_backward.py` keeps each step's input gradient, which `AddmmBackward0` allocates on
/// the autograd thread without Python frames: the leak (JSON, text, live line) names that node
/// and the forward line whose `addmm` created it.
#[test]
fn torch_a_backward_pass_leak_names_its_node_and_forward_line() {
    let r = run_torch("leak_backward.py", Mode::Torch, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    let forward = torch_line_of("leak_backward.py", "# FORWARD HERE");
    let leak = growth_findings(&r.report)
        .into_iter()
        .find(|f| f["kind"] == "leak" && f["backward_node"].is_object())
        .unwrap_or_else(|| panic!("no backward leak: {:#}\n{}", r.report["findings"], r.text));
    assert!(python_frames(leak).is_empty(), "{leak:#}");
    let node = &leak["backward_node"];
    assert_eq!(node["name"], "AddmmBackward0", "{node:#}");
    assert_eq!(node["forward_op"], "addmm", "{node:#}");
    let line = &node["forward_lines"][0];
    assert!(
        line["file"]
            .as_str()
            .unwrap()
            .ends_with("/leak_backward.py")
            && line["line"] == forward,
        "{node:#}"
    );
    let rate = leak["growth_bytes_per_step"].as_f64().unwrap();
    assert!((rate - (256 << 10) as f64).abs() < 1024.0, "{rate}");
    let culprit = leak["culprit"]["function"].as_str().unwrap();
    assert!(
        culprit.starts_with("torch::autograd::generated::AddmmBackward0::apply"),
        "{culprit}"
    );
    let said = format!(
        "in the backward pass, autograd node AddmmBackward0; its forward op `addmm` ran at \
         leak_backward.py:{forward} ("
    );
    assert!(r.text.contains(&said), "{}", r.text);
    assert!(r.stderr.contains(&said), "{}", r.stderr);
    // Every list names it by its forward line: the live line and the finding's head.
    let named = format!("backward of addmm at leak_backward.py:{forward}");
    assert!(
        r.stderr
            .lines()
            .any(|l| l.contains(" leak] ") && l.ends_with(&format!(" at {named}"))),
        "{}",
        r.stderr
    );
    assert_eq!(leak["site_name"], named.as_str(), "{leak:#}");
    assert!(
        r.text
            .contains(&format!(" leak] pid {} at {named}:", leak["pid"])),
        "{}",
        r.text
    );
}

/// `oomtrace ARGS...`'s standard output; fails the test if it fails.
fn oomtrace_stdout(args: &[&str]) -> String {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(args);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "oomtrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What no name of a backward-pass site may say where its forward line is known: a C++ name
/// of its node, or that it has no Python frames.
fn assert_no_cpp_names(what: &str, text: &str) {
    for bad in [
        "AddmmBackward0::apply(",
        "torch::autograd::",
        "no Python frames",
        "AddmmBackward0.apply",
    ] {
        assert!(!text.contains(bad), "{what} says {bad:?}:\n{text}");
    }
}

/// `mlp_backward.py` trains two `nn.Linear` layers: their gradients are made on the autograd
/// thread (no Python frames) inside `AddmmBackward0`. Every place that names a call site names
/// them by the forward lines whose `addmm` made the node (`backward of addmm at
/// mlp_backward.py:FC1 and mlp_backward.py:FC2`), and what the engine allocates outside any
/// node by the line that ran `loss.backward()`: the report's sections and live-at-exit list
/// (text and JSON), `diff` (text and JSON) and the exports (folded, chrome, JSON lines,
/// memory-viz's last frame); never by a C++ name or as "no Python frames". `report --native`
/// and the JSON frames keep the C++ frames.
#[test]
fn torch_backward_allocations_are_named_by_their_forward_lines() {
    let script = "mlp_backward.py";
    let r = run_torch(script, Mode::Run, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    let fc1 = torch_line_of(script, "# FORWARD FC1");
    let fc2 = torch_line_of(script, "# FORWARD FC2");
    let call = torch_line_of(script, "# BACKWARD CALL");
    let addmm = format!("backward of addmm at {script}:{fc1} and {script}:{fc2}");
    let engine = format!("backward at {script}:{call} (autograd engine)");
    let trace = r.trace.to_str().unwrap();

    // The text report: its sections list them by name, and nothing names them in C++.
    let sections = r.text.split("\nSections: ").nth(1).expect(&r.text);
    for name in [&addmm, &engine] {
        assert!(
            sections.contains(&format!("  {name}\n")),
            "no {name}:\n{sections}"
        );
    }
    assert_no_cpp_names("the report", &r.text);
    // Still live at exit: the weights' gradients, by their node and forward lines.
    assert!(
        r.text.contains(&format!(
            "in the backward pass, autograd node AddmmBackward0; its forward op `addmm` ran at \
             {script}:{fc1} ("
        )),
        "{}",
        r.text
    );
    assert!(
        r.text.lines().all(|l| l.chars().count() <= 200),
        "{}",
        r.text
    );

    // The JSON: the sections' rows and the live-at-exit findings have the same names; the
    // frames stay C++.
    let json = report_json(&r.trace);
    let mut names: Vec<&str> = Vec::new();
    for s in json["sections"].as_array().unwrap() {
        for list in ["peak_consumers", "sites", "most_allocations"] {
            names.extend(
                s[list]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["name"].as_str().unwrap()),
            );
        }
    }
    assert!(
        names.contains(&addmm.as_str()) && names.contains(&engine.as_str()),
        "{names:#?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.contains("::") || n.contains("no Python")),
        "{names:#?}"
    );
    let grads = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["kind"] == "live_at_exit"
                && f["site_name"] == addmm.as_str()
                && f["held"] == "tensors"
        })
        .unwrap_or_else(|| panic!("no live gradients named {addmm}: {:#}", json["findings"]));
    // The two weights' gradients (WIDTH x WIDTH floats each).
    assert!(grads["bytes"].as_u64().unwrap() >= 32 * MIB, "{grads:#}");
    assert_eq!(
        grads["backward_node"]["name"], "AddmmBackward0",
        "{grads:#}"
    );
    assert!(
        grads["culprit"]["function"]
            .as_str()
            .unwrap()
            .starts_with("torch::autograd::generated::AddmmBackward0::apply"),
        "{grads:#}"
    );
    assert!(
        json["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "live_at_exit" && f["site_name"] == engine.as_str()),
        "{:#}",
        json["findings"]
    );
    // `--native` keeps the C++ frames for who wants them.
    let native = report_output(&["--native"], &[&r.trace]);
    assert!(native.contains("AddmmBackward0::apply"), "{native}");

    // `oomtrace diff`: the same names, matched by the same keys; every row says what it is
    // (tensors, PyTorch's cache as one row per device, outside PyTorch) and reads apart from
    // every other (what tells two rows of one line apart is shown), in the user's words.
    let diff = oomtrace_stdout(&["diff", "--top", "1000", trace, trace]);
    assert!(
        diff.contains(&format!("same    tensors: {addmm}")),
        "{diff}"
    );
    assert!(diff.contains(&engine), "{diff}");
    assert_no_cpp_names("diff", &diff);
    assert_eq!(
        diff.matches("same    PyTorch's cache (device 0)").count(),
        1,
        "{diff}"
    );
    let rows: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with("  same    "))
        .map(|l| l.split_once(": peak").map_or(l, |(head, _)| head))
        .collect();
    let unique: std::collections::BTreeSet<&&str> = rows.iter().collect();
    assert_eq!(unique.len(), rows.len(), "rows that read alike:\n{diff}");
    assert!(
        rows.iter().all(|r| r.contains("tensors: ")
            || r.contains("outside PyTorch: ")
            || r.contains("PyTorch's cache")),
        "a row that does not say what it is:\n{diff}"
    );
    let diff_json: Value = serde_json::from_str(&oomtrace_stdout(&[
        "diff", "--json", "--top", "1000", trace, trace,
    ]))
    .unwrap();
    let sites = diff_json["sites"].as_array().unwrap();
    assert!(
        sites.iter().any(|s| s["name"] == addmm.as_str()),
        "{diff_json:#}"
    );
    assert!(sites.iter().all(|s| s["held"].is_string()), "{diff_json:#}");
    let cache: Vec<&Value> = sites
        .iter()
        .filter(|s| s["held"] == "torch_reserve")
        .collect();
    assert_eq!(cache.len(), 1, "{cache:#?}");
    assert_eq!(cache[0]["name"], "PyTorch's cache");

    // The exports.
    let dir = r.trace.parent().unwrap();
    let export = |format: &str| {
        let out = dir.join(format!("export.{format}"));
        oomtrace_stdout(&[
            "export",
            "--format",
            format,
            trace,
            "-o",
            out.to_str().unwrap(),
        ]);
        out
    };
    let folded = std::fs::read_to_string(export("folded")).unwrap();
    assert!(folded.contains(&format!(";{addmm};")), "{folded}");
    let chrome = std::fs::read_to_string(export("chrome")).unwrap();
    assert!(
        chrome.contains(&format!(": {addmm}\"")),
        "no counter named {addmm}"
    );
    let lines = std::fs::read_to_string(export("json")).unwrap();
    assert!(
        lines.contains(&format!("\"backward\":\"{addmm}\"")),
        "no site named {addmm}"
    );
    // memory-viz keeps PyTorch's frame format; its last frame is the forward line.
    let pickle = std::fs::read(export("memory-viz")).unwrap();
    let what = b"backward of addmm";
    assert!(
        pickle.windows(what.len()).any(|w| w == what),
        "no forward line in the pickle"
    );
}

/// Another backend (`backend:cudaMallocAsync`) or a pluggable allocator of the user's own in
/// place: the tracker is not attached, one line says why, and the program runs on.
#[test]
fn tracker_keeps_off_allocators_it_does_not_know() {
    let r = run_torch(
        "clean.py",
        Mode::Torch,
        &[("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")],
    );
    assert_ran(&r, 0);
    assert_done(&r);
    assert!(
        r.stderr.contains(
            "no oomtrace trace tracker (PyTorch's allocator backend is 'cudaMallocAsync'"
        ),
        "{}",
        r.stderr
    );
    let r = run_torch("clean.py", Mode::Torch, &[("OWN_ALLOCATOR", "1")]);
    assert_ran(&r, 0);
    assert_done(&r);
    assert!(
        r.stderr
            .contains("no oomtrace trace tracker (PyTorch's allocator backend is 'pluggable'"),
        "{}",
        r.stderr
    );
    // The user's allocator is oomtrace's entry points: its tensors are still traced.
    assert!(r.text.contains("oomtrace_malloc"), "{}", r.text);
}

/// `oomtrace.install()` after PyTorch initialised CUDA (under `oomtrace run --segments`, which
/// attaches nothing itself): the tracker attaches at once (the swap could not be had then) and
/// names the leak's line.
#[test]
fn install_after_cuda_init_attaches_the_tracker() {
    let r = run_torch("install_late.py", Mode::Segments, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    assert!(
        !r.stderr.contains("no oomtrace trace tracker"),
        "{}",
        r.stderr
    );
    let found = growth_findings(&r.report);
    let leak = found
        .iter()
        .find(|f| f["kind"] == "leak" && has_frame(f, "install_late.py", 15))
        .unwrap_or_else(|| panic!("no leak at install_late.py:15: {found:#?}\n{}", r.text));
    assert_eq!(leak["api"], "oomtrace_torch_alloc", "{leak:#}");
}

// ---- Distributed: torchrun's workers, labelled by rank --------------------------------------

/// `oomtrace run --torch -- python LAUNCH... SCRIPT` for a two-rank job whose rank 1 alone
/// keeps a tensor per step at `SCRIPT:line`: both workers are traced, each labelled by its
/// rank, and the report (JSON, text) and the live line say that rank 1 alone leaks, there.
fn check_rank_one_leaks(launch: &[&str], script_name: &str, line: u64) {
    let dir = scratch(&format!("torch-{}", script_name.trim_end_matches(".py")));
    let (trace, json) = (dir.join("trace.oomt"), dir.join("report.json"));
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(["run", "--torch", "--json"])
        .arg(&json)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(python())
        .args(launch)
        .arg(script(script_name))
        .current_dir(&dir)
        .env("STEPS", STEPS.to_string())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    torch_env(&mut cmd, &dir);
    // torchrun and torch.multiprocessing leave their own files (torchelastic_*,
    // pytorch-errorfile-*) in the temporary directory: the scratch one, removed with the test.
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    cmd.env("TMPDIR", &tmp);
    without_aslr(&mut cmd);
    let out = output_within(cmd, TORCH_TIMEOUT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ranked: Vec<(u64, u64)> = processes(&report)
        .iter()
        .filter_map(|p| Some((p["rank"].as_u64()?, p["world_size"].as_u64()?)))
        .collect();
    assert_eq!(
        ranked.len(),
        2,
        "two workers with ranks: {ranked:?}\n{stderr}"
    );
    assert!(
        ranked.contains(&(0, 2)) && ranked.contains(&(1, 2)),
        "{ranked:?}"
    );
    let verdicts = &report["ranks"]["verdicts"];
    assert_eq!(verdicts[0]["pattern"], "leak_on_one_rank", "{verdicts:#}");
    assert_eq!(verdicts[0]["ranks"][0], 1, "{verdicts:#}");
    let leak = findings(&report, "leak")
        .into_iter()
        .find(|f| has_frame(f, script_name, line))
        .unwrap_or_else(|| panic!("no leak at {script_name}:{line}\n{stderr}"));
    assert_eq!(leak["rank"], 1);
    let text = report_text(&trace);
    assert!(text.contains("only rank 1 grows"), "{text}");
    assert!(
        stderr.contains("(rank 1)"),
        "the live line names the rank: {stderr}"
    );
}

/// torchrun puts RANK and WORLD_SIZE in each worker's environment: the shim reads them there.
#[test]
fn torchrun_workers_are_labelled_and_the_leaking_rank_named() {
    check_rank_one_leaks(
        &[
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
        ],
        "torchrun_one_rank.py",
        16,
    );
}

/// torch.multiprocessing.spawn passes the rank as an argument: the rank comes from
/// init_process_group (wrapped by the `oomtrace` package), sent after the Hello.
#[test]
fn spawned_workers_are_labelled_by_init_process_group() {
    check_rank_one_leaks(&[], "spawn_one_rank.py", 24);
}

// ---- For other tiers (the view's test of a real PyTorch trace) -----------------------------

/// `oomtrace run --torch -o trace.oomt -- python tests/scenarios/torch/<script_name>` in `dir`,
/// as this tier runs it; returns the trace once the program has run to its end.
pub(crate) fn torch_trace(script_name: &str, dir: &Path) -> PathBuf {
    torch_trace_with(script_name, dir, &[])
}

/// [`torch_trace`] with extra environment for the script.
pub(crate) fn torch_trace_with(script_name: &str, dir: &Path, env: &[(&str, &str)]) -> PathBuf {
    for attempt in 0..2 {
        let out = output_within(command(script_name, Mode::Torch, dir, env), TORCH_TIMEOUT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if attempt == 0 && pytorch_exit_abort(&out.status, &stderr) {
            continue;
        }
        assert!(out.status.success(), "{script_name} failed:\n{stderr}");
        let trace = dir.join("trace.oomt");
        assert!(trace.is_file(), "no trace; stderr:\n{stderr}");
        return trace;
    }
    unreachable!()
}

/// The 1-based line of `tests/scenarios/torch/<name>` that contains `marker`.
pub(crate) fn torch_script_line(name: &str, marker: &str) -> u64 {
    torch_line_of(name, marker)
}
