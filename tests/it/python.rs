//! Python programs through the real shim, collector and CLI: Python frames with the GIL held
//! and released, `oomtrace run --torch` on a stand-in `torch` (tests/scenarios/python/
//! site-packages/torch, PyTorch's names and call paths on the simulated CUDA), optimizer steps
//! marked with and without `--torch` and the lines that say what could not be set up,
//! `import oomtrace` without `oomtrace run`, the pluggable-allocator ABI itself (also called
//! before anything loaded the driver), the text report's Python frames, and a leak freed at
//! exit.

use std::path::{Path, PathBuf};
use std::process::Output;

use oomtrace_tests::*;
use serde_json::Value;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/python")
        .join(name)
}

/// The 1-based line of `script` that contains `marker`.
fn script_line(name: &str, marker: &str) -> u64 {
    line_of(&script(name), marker)
}

/// `oomtrace run [flags] --json J -o T -- python3 SCRIPT args` in a scratch dir, with the
/// stand-in torch importable. The scratch dir comes back so the trace in it outlives the call.
fn run_python(
    name: &str,
    flags: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, Value, Scratch) {
    let dir = scratch(&format!("py-{name}"));
    let (out, report) = run_python_in(&dir, &script(name), flags, args, env);
    (out, report, dir)
}

/// `run_python` with the script at `program`, run from `dir` (trace `t.oomt`, report `r.json`).
fn run_python_in(
    dir: &Path,
    program: &Path,
    flags: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, Value) {
    let json = dir.join("r.json");
    let trace = dir.join("t.oomt");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir)
        .arg("run")
        .args(flags)
        .arg("--json")
        .arg(&json)
        .arg("-o")
        .arg(&trace)
        .args(["--", "python3"])
        .arg(program)
        .args(args)
        .env("PYTHONPATH", script("site-packages"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_within(cmd, TIMEOUT);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    (out, serde_json::from_str(&text).unwrap())
}

/// The Python frames of a finding: (function, file name, line), innermost first.
/// Frames of the installed (stand-in) torch are left out, as a user reads the stack.
fn python_frames(f: &Value) -> Vec<(String, String, u64)> {
    f["stack"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|fr| fr["python"] == true)
        .filter(|fr| {
            !fr["file"]
                .as_str()
                .unwrap_or("")
                .contains("/site-packages/")
        })
        .map(|fr| {
            let file = fr["file"].as_str().unwrap_or("");
            (
                fr["function"].as_str().unwrap_or("").to_string(),
                file.rsplit('/').next().unwrap_or("").to_string(),
                fr["line"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn frame(function: &str, file: &str, line: u64) -> (String, String, u64) {
    (function.to_string(), file.to_string(), line)
}

#[test]
fn python_frames_appear_with_the_gil_released_and_held() {
    let (out, r, _) = run_python("gil.py", &[], &[], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "gil ok\n");
    let live = findings(&r, "live_at_exit");
    let by_bytes = |b: u64| {
        live.iter()
            .find(|f| f["bytes"] == b)
            .unwrap_or_else(|| panic!("no site of {b} bytes: {live:#?}"))
    };
    let released = script_line("gil.py", "# RELEASED");
    let held = script_line("gil.py", "# HELD");
    let caller = script_line("gil.py", "# CALLER");
    // GIL released (CDLL), two calls through a method: one site, Python stack in order.
    let py = python_frames(by_bytes(2 * MIB));
    assert_eq!(
        py,
        vec![
            frame("alloc_released", "gil.py", released),
            frame(
                "Model.layer",
                "gil.py",
                script_line("gil.py", "alloc_released(1 << 20)")
            ),
            frame("<module>", "gil.py", caller),
        ],
        "{py:#?}"
    );
    // GIL held (PyDLL).
    let py = python_frames(by_bytes(5 * MIB));
    assert_eq!(py[0], frame("alloc_held", "gil.py", held), "{py:#?}");
    // Another thread: its own frames, not the main thread's.
    let py = python_frames(by_bytes(3 * MIB));
    assert_eq!(
        py[0],
        frame("alloc_released", "gil.py", released),
        "{py:#?}"
    );
    assert_eq!(py[1].0, "in_thread", "{py:#?}");
    assert!(py.iter().all(|f| f.0 != "<module>"), "{py:#?}");
    // Native frames are still there, merged: CUDA innermost, the interpreter around Python.
    let names = functions(by_bytes(3 * MIB));
    assert_eq!(names[0], "cudaMalloc", "{names:?}");
    assert!(names.iter().any(|n| n == "ffi_call"), "{names:?}");
}

/// What each capture asks of CPython before it reads Python's frames, it reads where
/// CPython's own functions do: the finalizing flag where `_Py_IsFinalizing`'s code loads it
/// (pyenv's `-fPIC` build reaches it through the GOT, Debian's directly), the thread state
/// from the key `PyGILState_GetThisThreadState` reads. Python frames still appear (of the
/// main thread and of another), and the program ends as it would.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_finalizing_flag_and_thread_state_are_read_where_cpython_reads_them() {
    let (out, r, _) = run_python("gil.py", &[], &[], &[("OOMTRACE_LOG", "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the finalizing flag is read from _PyRuntime+0x"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the thread state is read from its key (_PyRuntime+0x"),
        "{stderr}"
    );
    let live = findings(&r, "live_at_exit");
    let has = |function: &str| {
        live.iter()
            .any(|f| python_frames(f).iter().any(|p| p.0 == function))
    };
    assert!(has("<module>") && has("in_thread"), "{live:#?}");
}

/// The leak finding of a `train_leak.py` run, checked to name the allocating line and the
/// loop line that called it.
fn assert_names_the_leaking_line(r: &Value) {
    let leaks = findings(r, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = leaks[0];
    assert_eq!(
        leak["growth_bytes_per_step"].as_f64().map(|g| g.round()),
        Some(MIB as f64),
        "{leak:#?}"
    );
    let py = python_frames(leak);
    assert_eq!(
        py[0],
        frame(
            "forward",
            "train_leak.py",
            script_line("train_leak.py", "# ALLOC HERE")
        ),
        "{py:#?}"
    );
    assert_eq!(
        py[1],
        frame(
            "<module>",
            "train_leak.py",
            script_line("train_leak.py", "output = forward(step)")
        ),
        "{py:#?}"
    );
}

#[test]
fn torch_mode_traces_tensors_and_names_the_leaking_python_line() {
    let (out, r, _) = run_python("train_leak.py", &["--torch=swap"], &["40"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 40\n");
    assert_names_the_leaking_line(&r);
    // Tensor-level events from the pluggable allocator, steps from the optimizer hook.
    let p = &processes(&r)[0];
    assert_eq!(p["epochs"]["source"], "markers", "{p:#?}");
    assert_eq!(p["steps"], 40, "{p:#?}");
    let live = findings(&r, "live_at_exit");
    assert!(
        live.iter().all(|f| f["api"] == "oomtrace_malloc"),
        "{live:#?}"
    );
    // The live line names the Python function, not a native frame.
    assert!(
        stderr.contains("leak] pid") && stderr.contains("forward (train_leak.py:"),
        "{stderr}"
    );
}

/// A project that lives under a directory named `oomtrace` (what `git clone` of this repo is
/// called) is the user's code, not oomtrace's package: its lines must still be the culprit.
#[test]
fn a_project_under_a_directory_named_oomtrace_is_still_the_users_code() {
    let dir = scratch("py-under-oomtrace");
    let project = dir.join("oomtrace");
    std::fs::create_dir(&project).unwrap();
    let program = project.join("train_leak.py");
    std::fs::copy(script("train_leak.py"), &program).unwrap();
    let (out, r) = run_python_in(&project, &program, &["--torch=swap"], &["40"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_names_the_leaking_line(&r);
    let leak = findings(&r, "leak")[0];
    let file = leak["stack"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "forward")
        .map(|f| f["file"].as_str().unwrap().to_string());
    assert_eq!(file.as_deref(), program.to_str(), "{leak:#?}");
    assert!(
        stderr.contains("leak] pid") && stderr.contains("forward (train_leak.py:"),
        "{stderr}"
    );
}

#[test]
fn torch_mode_on_a_clean_loop_reports_no_leak() {
    let (out, r, _) = run_python("train_leak.py", &["--torch=swap"], &["40", "--clean"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(findings(&r, "leak").is_empty(), "{:#?}", r["findings"]);
    assert_eq!(processes(&r)[0]["steps"], 40);
}

/// `check.py` under `oomtrace run FLAGS` beside a sitecustomize of the user's own: prints
/// whether that sitecustomize ran and whether PyTorch's allocator is oomtrace's.
fn users_own_sitecustomize_under(flags: &[&str]) -> String {
    let dir = scratch("py-usersite");
    std::fs::write(
        dir.join("sitecustomize.py"),
        "import builtins\nbuiltins.USER_SITE_RAN = True\n",
    )
    .unwrap();
    let prog = dir.join("check.py");
    std::fs::write(&prog, "import builtins, torch\nprint(getattr(builtins, 'USER_SITE_RAN', False), torch.cuda.memory._current is not None)\n").unwrap();
    let mut cmd = base_command(oomtrace_bin());
    let pythonpath = std::env::join_paths([dir.to_path_buf(), script("site-packages")]).unwrap();
    cmd.current_dir(&dir)
        .arg("run")
        .args(flags)
        .args(["-o", "t.oomt", "--", "python3"])
        .arg(&prog)
        .env("PYTHONPATH", pythonpath);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn torch_mode_keeps_the_users_own_sitecustomize() {
    assert_eq!(
        users_own_sitecustomize_under(&["--torch=swap"]),
        "True True\n"
    );
}

/// Without --torch the step hook's sitecustomize is on PYTHONPATH too: the user's own still
/// runs, and PyTorch's allocator is left alone.
#[test]
fn plain_run_keeps_the_users_own_sitecustomize_and_pytorchs_allocator() {
    assert_eq!(users_own_sitecustomize_under(&[]), "True False\n");
}

/// The lines `oomtrace:` wrote on stderr about setting up torch (not findings or the summary).
fn setup_lines(stderr: &str) -> Vec<&str> {
    // Findings may name --torch too (a device growth's hint): neither the live lines
    // (`oomtrace: [likely device growth] ...`) nor the summary at the end are setup lines.
    let before_summary = stderr.split("\noomtrace summary\n").next().unwrap_or("");
    before_summary
        .lines()
        .filter(|l| !l.starts_with("oomtrace: ["))
        .filter(|l| l.contains("optimizer steps") || l.contains("--torch") || l.contains("set up"))
        .collect()
}

/// The APIs of the allocations in the trace `t.oomt` in `dir` (`oomtrace export --format json`).
fn allocation_apis(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(["export", "--format", "json", "-o", "-"])
        .arg(dir.join("t.oomt"));
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "event" && v["kind"] == "alloc")
        .map(|v| v["api"].as_str().unwrap_or("").to_string())
        .collect()
}

/// PyTorch 2.x deletes `torch.optim.optimizer` as an attribute (the stand-in does too): the
/// step hook is still installed under --torch, and nothing is said when all worked.
#[test]
fn torch_mode_marks_optimizer_steps_although_torch_optim_hides_its_submodule() {
    let (out, r, _) = run_python("train_leak.py", &["--torch=swap"], &["12", "--clean"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(setup_lines(&stderr), Vec::<&str>::new(), "{stderr}");
    let p = &processes(&r)[0];
    assert_eq!(p["epochs"]["source"], "markers", "{p:#}");
    assert_eq!(p["steps"], 12, "{p:#}");
}

/// The allocator is swapped but this PyTorch has no step hooks: one line says both, exactly.
#[test]
fn torch_mode_says_the_allocator_works_when_the_step_hook_cannot_be_installed() {
    let (out, r, dir) = run_python(
        "train_leak.py",
        &["--torch=swap"],
        &["12", "--clean"],
        &[("FAKE_TORCH_NO_STEP_HOOKS", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        setup_lines(&stderr),
        vec![
            "oomtrace: --torch=swap: PyTorch allocates through oomtrace (tensors are traced); \
             optimizer steps are not marked (PyTorch 0.0.0+stand-in has no \
             torch.optim.optimizer.register_optimizer_step_post_hook (PyTorch 2.0 added it)): \
             steps are found automatically"
        ],
        "{stderr}"
    );
    let p = &processes(&r)[0];
    assert_eq!(p["steps"], 0, "{p:#}");
    assert_ne!(p["epochs"]["source"], "markers", "{p:#}");
    assert_eq!(
        allocation_apis(&dir),
        ["oomtrace_malloc".to_string()].into()
    );
}

/// CUDA initialised during `import torch`: the allocator cannot be swapped, the step hook is
/// installed all the same, and the line says which is which.
#[test]
fn torch_mode_says_the_step_hook_works_when_the_allocator_cannot_be_swapped() {
    let (out, r, dir) = run_python(
        "train_leak.py",
        &["--torch=swap"],
        &["12", "--clean"],
        &[("FAKE_TORCH_INIT_CUDA_AT_IMPORT", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        setup_lines(&stderr),
        vec![
            "oomtrace: --torch=swap: PyTorch's allocator was not swapped (CUDA was already \
             initialised, and PyTorch cannot swap an allocator in use): tracing CUDA \
             allocations (segments, not tensors); a step is marked after every optimizer step"
        ],
        "{stderr}"
    );
    let p = &processes(&r)[0];
    assert_eq!(p["steps"], 12, "{p:#}");
    // The stand-in's runtime calls, seen at the driver: never the pluggable allocator.
    let apis = allocation_apis(&dir);
    assert!(
        !apis.is_empty() && !apis.contains("oomtrace_malloc"),
        "{apis:?}"
    );
}

/// Plain `oomtrace run` (no --torch): the optimizer marks the steps, PyTorch keeps its own
/// allocator, and the leak is found on those steps.
#[test]
fn plain_run_takes_steps_from_the_optimizer() {
    let (out, r, dir) = run_python("train_leak.py", &[], &["40"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Tensors are traced by default where the tracker can attach; the stand-in is no PyTorch
    // release oomtrace knows, and one line says what is traced instead.
    let lines = setup_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(STAND_IN_NOT_TRACED)
            && lines[0].ends_with("; a step is marked after every optimizer step"),
        "{stderr}"
    );
    let p = &processes(&r)[0];
    assert_eq!(p["epochs"]["source"], "markers", "{p:#}");
    assert_eq!(p["steps"], 40, "{p:#}");
    assert_names_the_leaking_line(&r);
    // The stand-in's runtime calls, seen at the driver: never the pluggable allocator.
    let apis = allocation_apis(&dir);
    assert!(
        !apis.is_empty() && !apis.contains("oomtrace_malloc"),
        "{apis:?}"
    );
}

/// What the default says on the stand-in torch, which is no release oomtrace knows.
const STAND_IN_NOT_TRACED: &str = "oomtrace: PyTorch 0.0.0+stand-in: tensors are not traced, \
     PyTorch's allocator has no oomtrace trace tracker (oomtrace was checked on PyTorch 2.4 to \
     2.15, and this release's headers do not declare";

/// `--no-step-hook` turns it off: no markers, steps found automatically, nothing said about
/// steps.
#[test]
fn plain_run_with_no_step_hook_marks_nothing() {
    let (out, r, _) = run_python("train_leak.py", &["--no-step-hook"], &["40"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = setup_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(STAND_IN_NOT_TRACED) && !lines[0].contains("step"),
        "{stderr}"
    );
    let p = &processes(&r)[0];
    assert_eq!(p["steps"], 0, "{p:#}");
    assert_ne!(p["epochs"]["source"], "markers", "{p:#}");
}

/// Without step hooks in this PyTorch, plain `run` says so in one line and still traces.
#[test]
fn plain_run_says_when_optimizer_steps_cannot_be_marked() {
    let (out, r, _) = run_python(
        "train_leak.py",
        &[],
        &["12", "--clean"],
        &[("FAKE_TORCH_NO_STEP_HOOKS", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = setup_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(STAND_IN_NOT_TRACED)
            && lines[0].ends_with(
                "; optimizer steps are not marked (PyTorch 0.0.0+stand-in has no \
                 torch.optim.optimizer.register_optimizer_step_post_hook (PyTorch 2.0 added \
                 it)): steps are found automatically"
            ),
        "{stderr}"
    );
    assert_eq!(processes(&r)[0]["steps"], 0);
}

/// `run --segments`: no tracker asked for, so nothing is said about tensors; the optimizer
/// still marks the steps.
#[test]
fn run_segments_opts_out_of_tensors_quietly() {
    let (out, r, _) = run_python("train_leak.py", &["--segments"], &["12", "--clean"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(setup_lines(&stderr), Vec::<&str>::new(), "{stderr}");
    assert_eq!(processes(&r)[0]["steps"], 12);
    // The same from the environment.
    let (out, r, _) = run_python(
        "train_leak.py",
        &[],
        &["12", "--clean"],
        &[("OOMTRACE_TORCH", "segments")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(setup_lines(&stderr), Vec::<&str>::new(), "{stderr}");
    assert_eq!(processes(&r)[0]["steps"], 12);
}

/// `run --segments` (tensors not traced) still learns PyTorch's own allocated and reserved:
/// the step hook sends them after each step marker, and the report's device says the last
/// reading, equal to what the program itself read after its last step.
#[test]
fn run_segments_reports_pytorchs_own_allocated_and_reserved_at_the_last_step() {
    let (out, r, _) = run_python(
        "train_leak.py",
        &["--segments"],
        &["12", "--stats"],
        &[("FAKE_TORCH_CACHING", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(setup_lines(&stderr), Vec::<&str>::new(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed: Vec<u64> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stats "))
        .unwrap_or_else(|| panic!("no stats line: {stdout}"))
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    let p = &processes(&r)[0];
    assert_eq!(p["steps"], 12, "{p:#}");
    let (device, read) = torch_memory_of(p);
    assert_eq!(read, printed, "{device:#}");
    // The leak keeps 1 MiB a step: 12 of them and the 8 MiB of weights are allocated; the
    // cache holds more than that (every step's activations).
    assert_eq!(printed[0], 20 << 20, "{stdout}");
    assert!(printed[2] > printed[0], "{stdout}");
    assert_eq!(device["torch_memory"]["step"], 12, "{device:#}");
    // Without tensors traced the device has no tracker totals: the readings are all there is.
    assert!(device.get("tensors").is_none(), "{device:#}");
}

/// A program whose statistics cannot be read (`memory_stats` raises, as it does under a
/// pluggable allocator) runs as it would untraced: its steps are marked, it ends normally,
/// and one line says the readings stopped.
#[test]
fn a_failing_memory_reading_never_breaks_the_program() {
    let (out, r, _) = run_python(
        "train_leak.py",
        &["--segments"],
        &["12", "--clean"],
        &[("FAKE_TORCH_CACHING", "1"), ("FAKE_TORCH_STATS", "raise")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 12\n");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("memory statistics"))
        .collect();
    assert_eq!(
        said,
        vec![
            "oomtrace: PyTorch's memory statistics are no longer sent with step markers \
             (RuntimeError: memory_stats: the stand-in was told to fail)"
        ],
        "{stderr}"
    );
    assert_eq!(setup_lines(&stderr), Vec::<&str>::new(), "{stderr}");
    let p = &processes(&r)[0];
    assert_eq!(p["steps"], 12, "{p:#}");
    assert!(
        p["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d.get("torch_memory").is_none()),
        "{p:#}"
    );
}

/// A program that marks its own steps (`oomtrace.mark_step()`) is not marked twice: the
/// optimizer hook stops at the program's first own mark. The first iteration carries both
/// (the hook's at `opt.step()`, then the program's): 40 iterations are 41 steps.
#[test]
fn the_programs_own_step_marks_replace_the_optimizer_hook() {
    let (out, r, _) = run_python("train_leak.py", &[], &["40", "--mark"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let p = &processes(&r)[0];
    assert_eq!(p["steps"], 41, "{p:#}");
    assert_names_the_leaking_line(&r);
}

/// The same with the program's marks made from an optimizer step hook of its own: stopping
/// oomtrace's hook while PyTorch runs the hooks must not break `optimizer.step()`.
#[test]
fn the_programs_own_step_hook_marks_replace_ours_without_breaking_the_step() {
    let (out, r, _) = run_python("train_leak.py", &[], &["40", "--mark-in-hook"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 40\n");
    assert_eq!(processes(&r)[0]["steps"], 41, "{stderr}");
}

#[test]
fn import_oomtrace_works_without_oomtrace_run() {
    let dir = scratch("py-install");
    let trace = dir.join("own.oomt");
    let mut cmd = base_command("python3");
    let pythonpath =
        std::env::join_paths([repo().join("python"), script("site-packages")]).unwrap();
    cmd.current_dir(&dir)
        .arg(script("train_leak.py"))
        .args(["40", "--install"])
        .env("PYTHONPATH", pythonpath)
        .env("OOMTRACE_COLLECTOR", oomtrace_bin())
        .env("OOMTRACE_OUTPUT", &trace);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 40\n");
    let r = report_json(&trace);
    assert_names_the_leaking_line(&r);
    assert_eq!(processes(&r)[0]["steps"], 40);
}

#[test]
fn pluggable_allocator_abi_capture_and_oom() {
    let (out, r, _) = run_python("pluggable.py", &[], &[], &[("SIMCUDA_MEMORY", "256MiB")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout,
        "alloc ok\n\
         plain cuMemAlloc during capture: 900\n\
         capture alloc ok\n\
         capture end: 0\n\
         zero NULL\n\
         huge NULL\n\
         kept ok\n",
        "{stderr}"
    );
    // The NULL is explained, once, on stderr.
    assert_eq!(
        stderr
            .matches("oomtrace_malloc: 1099511627776 bytes on device 0 failed (out of memory)")
            .count(),
        1,
        "{stderr}"
    );
    // Tensor-level events: the OOM and the kept tensor, at their Python lines.
    let oom = findings(&r, "oom");
    assert_eq!(oom.len(), 1, "{oom:#?}");
    assert_eq!(oom[0]["api"], "oomtrace_malloc", "{oom:#?}");
    let live = findings(&r, "live_at_exit");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0]["bytes"], 3 * MIB);
    assert_eq!(live[0]["api"], "oomtrace_malloc");
    assert_eq!(
        python_frames(live[0])[0],
        frame(
            "<module>",
            "pluggable.py",
            script_line("pluggable.py", "# KEPT")
        )
    );
    let p = &processes(&r)[0];
    assert_eq!(p["unmatched_frees"].as_u64().unwrap_or(0), 0, "{p:#?}");
}

/// PyTorch may call `oomtrace_malloc` for its first tensor before anything loaded the driver:
/// the entry points load `libcuda.so.1` themselves (tests/scenarios/pluggable_first.c links
/// no CUDA library and makes no CUDA call), and the tensors are recorded.
/// The pluggable-allocator scenarios' tensors, as the trace has them: two allocated through
/// `oomtrace_malloc` on device 0 (4 MiB at the peak), one freed, the 2 MiB one that
/// `keep_tensor` keeps live at exit.
fn two_tensors_one_kept(t: &Traced) {
    let p = &processes(&t.report)[0];
    let d = device(p, 0);
    assert_eq!(d["allocations"], 2, "{p:#}");
    assert_eq!(d["frees"], 1, "{p:#}");
    assert_eq!(d["peak_bytes"], 4 * MIB, "{p:#}");
    let live = findings(&t.report, "live_at_exit");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0]["api"], "oomtrace_malloc");
    assert_eq!(live[0]["bytes"], 2 * MIB);
    assert!(
        functions(live[0]).iter().any(|f| f == "keep_tensor"),
        "{:?}",
        functions(live[0])
    );
}

#[test]
fn pluggable_entry_points_load_the_driver_themselves() {
    let t = run_traced("pluggable_first", &[], &[]);
    assert!(t.status.success(), "{}\n{}", t.stdout, t.stderr);
    assert_eq!(
        t.stdout, "driver before: absent\nalloc: ok\ndriver after: loaded\nkept: ok\n",
        "{}",
        t.stderr
    );
    assert!(!t.stderr.contains("no CUDA driver"), "{}", t.stderr);
    two_tensors_one_kept(&t);
}

/// `oomtrace_malloc` called first thing, before anything initialised CUDA, does what the
/// runtime would (tests/scenarios/pluggable_init.c): the driver, which says
/// CUDA_ERROR_NOT_INITIALIZED until then, is initialised, the device's primary context is made
/// current and stays so, the memory is usable and traced; a tensor that cannot be had names
/// the driver call that failed and its real code, never "no CUDA driver".
#[test]
fn pluggable_entry_points_initialise_cuda_as_the_runtime_does() {
    let t = run_traced("pluggable_init", &[], &[]);
    assert!(t.status.success(), "{}\n{}", t.stdout, t.stderr);
    assert_eq!(
        t.stdout,
        "before: 3\nalloc: ok\ncontext: current\nround trip: ok\ndevice 7: NULL\n\
         huge: NULL\nkept: ok\n",
        "{}",
        t.stderr
    );
    assert!(
        t.stderr.contains(
            "oomtrace_malloc: 1048576 bytes on device 7 failed (cuDevicePrimaryCtxRetain \
             failed: CUDA_ERROR_INVALID_DEVICE, error 101)"
        ),
        "{}",
        t.stderr
    );
    assert!(
        t.stderr
            .contains("oomtrace_malloc: 1125899906842624 bytes on device 0 failed (out of memory)"),
        "{}",
        t.stderr
    );
    assert!(!t.stderr.contains("no CUDA driver"), "{}", t.stderr);
    two_tensors_one_kept(&t);

    // A driver that loads but has no device: cuInit's own error, in the message and in the
    // trace's failed allocation.
    let t = run_traced("pluggable_init", &["nodevice"], &[("SIMCUDA_DEVICES", "0")]);
    assert!(t.status.success(), "{}\n{}", t.stdout, t.stderr);
    assert_eq!(t.stdout, "before: 3\nalloc: NULL\n", "{}", t.stderr);
    assert!(
        t.stderr.contains(
            "oomtrace_malloc: 4194304 bytes on device 0 failed (cuInit failed: \
             CUDA_ERROR_NO_DEVICE, error 100)"
        ),
        "{}",
        t.stderr
    );
    assert!(!t.stderr.contains("no CUDA driver"), "{}", t.stderr);
}

/// Every place the text report (and `run`'s summary) shows a call site with Python frames
/// shows them, in the JSON's order (the user's all, libraries' runs folded): the OOM, each holder at the OOM, the failed
/// allocation and what was live at exit.
#[test]
fn text_reports_show_every_python_frame_of_ooms_holders_and_live_memory() {
    let (out, r, dir) = run_python(
        "oom_holders.py",
        &["--torch=swap"],
        &[],
        &[("SIMCUDA_MEMORY", "256MiB")],
    );
    let summary = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{summary}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "oom caught\n");
    let text = report_text(&dir.join("t.oomt"));
    let oom = findings(&r, "oom")[0];
    let msg = oom["message"].as_str().unwrap();
    assert_text_shows_python_frames(&text, msg, &oom["stack"]);
    assert_text_shows_python_frames(&summary, msg, &oom["stack"]);
    let holders = oom["oom"]["top_sites"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{holders:#?}");
    assert_text_shows_python_frames(&text, "128.00 MiB in     2", &holders[0]["stack"]);
    assert_text_shows_python_frames(&text, "2.00 MiB in     1", &holders[1]["stack"]);
    let failed = &processes(&r)[0]["failed_allocations"][0];
    assert_text_shows_python_frames(&text, "last asked for 1.00 TiB", &failed["stack"]);
    assert_text_shows_python_frames(&summary, "last asked for 1.00 TiB", &failed["stack"]);
    let live = findings(&r, "live_at_exit");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_text_shows_python_frames(&text, "Still live at exit", &live[0]["stack"]);
    assert_text_shows_python_frames(&summary, "live at exit: 2.00 MiB", &live[0]["stack"]);
}

/// A leak finding's Python frames in the text report and in `run`'s summary: the user's all,
/// libraries' runs folded, in the JSON's order, although native frames come first in its stack.
#[test]
fn text_reports_show_every_python_frame_of_a_leak() {
    let (out, r, dir) = run_python("train_leak.py", &["--torch=swap"], &["40"], &[]);
    let summary = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{summary}");
    let leak = findings(&r, "leak")[0];
    let msg = leak["message"].as_str().unwrap();
    assert_text_shows_python_frames(&report_text(&dir.join("t.oomt")), msg, &leak["stack"]);
    assert_text_shows_python_frames(&summary, msg, &leak["stack"]);
}

/// The leaked list of `train_leak.py` is freed as the interpreter exits, after the last step:
/// the leak keeps the evidence it was detected on and says the memory was kept through the
/// last step and only freed at exit; it never reads "0 B held in 0 allocations", nor "all of
/// it was freed" beside its level.
#[test]
fn a_leak_freed_at_exit_reports_its_evidence_and_its_end() {
    let (out, r, dir) = run_python("train_leak.py", &["--torch=swap"], &["40"], &[]);
    let summary = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{summary}");
    let leak = findings(&r, "leak")[0];
    let e = &leak["evidence"];
    let d = &e["at_detection"];
    let detected_bytes = d["bytes"].as_u64().unwrap();
    assert!(detected_bytes >= 3 * MIB, "{e:#}");
    assert_eq!(detected_bytes, d["count"].as_u64().unwrap() * MIB, "{e:#}");
    assert!(d["surviving_epochs"].as_u64().unwrap() >= 3, "{e:#}");
    assert_eq!(d["step"], e["detected_step"], "{e:#}");
    assert_eq!(d["time_s"], e["detected_s"], "{e:#}");
    assert_eq!(
        d["slope_bytes_per_step"].as_f64().map(|b| b.round()),
        Some(MIB as f64)
    );
    assert_eq!(
        (e["peak_bytes"].as_u64(), e["peak_step"].as_u64()),
        (Some(40 * MIB), Some(39))
    );
    let end = &e["at_end"];
    assert_eq!(end["state"], "freed", "{e:#}");
    assert_eq!(end["fate"], "freed_at_exit", "{e:#}");
    assert_eq!(end["process_ended"], true, "{e:#}");
    assert_eq!(end["last_step"], 39, "{e:#}");
    assert_eq!(end["freed_after_last_step_bytes"], 40 * MIB, "{e:#}");
    assert_eq!(
        (leak["bytes"].as_u64(), leak["count"].as_u64()),
        (Some(0), Some(0))
    );
    let msg = leak["message"].as_str().unwrap();
    assert!(
        !msg.contains(" 0 B") && !msg.contains(" 0 allocations"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("when detected at step {}", d["step"]))
            && msg.ends_with(
                "; kept through the last step (40.00 MiB at step 39) and only freed at exit"
            ),
        "{msg}"
    );
    let text = report_text(&dir.join("t.oomt"));
    assert!(find_wrapped(&text, msg).is_some(), "{text}");
    assert!(!text.contains("surviving from 0"), "{text}");
}

/// `cache_growth.py` on the stand-in's caching allocator, as PyTorch runs without `--torch`:
/// the events are segments, reserved at the output's line one step and the activations' line
/// the next. The device's growth is reported while the job runs (with the lines that made the
/// cache grow and how to see the tensors), and in the JSON and text reports.
#[test]
fn plain_run_reports_device_growth_and_the_lines_that_made_the_cache_grow() {
    let (out, r, dir) = run_python(
        "cache_growth.py",
        &[],
        &["40"],
        &[("FAKE_TORCH_CACHING", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 40\n");
    let growth = findings(&r, "device_growth");
    assert_eq!(growth.len(), 1, "{:#?}", r["findings"]);
    let g = growth[0];
    assert_eq!(
        (g["level"].as_str(), g["device"].as_i64()),
        (Some("confirmed"), Some(0)),
        "{g:#}"
    );
    let rate = g["growth_bytes_per_step"].as_f64().unwrap();
    assert!((rate / (4 * MIB) as f64 - 1.0).abs() < 0.1, "{g:#}");
    let msg = g["message"].as_str().unwrap();
    assert!(
        msg.starts_with("device 0: CUDA memory grows +4.00 MiB/step"),
        "{msg}"
    );
    // A rate per second only when the steps span a second of the trace: a run of a few
    // hundred milliseconds gets none, in the JSON and in the text alike.
    match g["growth_bytes_per_s"].as_f64() {
        Some(per_s) => assert!(per_s > 0.0 && msg.contains("/s) over "), "{g:#}"),
        None => assert!(!msg.contains("/s)"), "{g:#}"),
    }
    let e = &g["evidence"];
    assert_eq!(e["events"], "segments", "{e:#}");
    assert!(e["trend"]["window"].as_u64().unwrap() >= 8, "{e:#}");
    assert!(e["at_detection"]["step"].as_u64().is_some(), "{e:#}");
    // The cache grew at both lines, a segment of 4 MiB at a time.
    let lines: std::collections::BTreeSet<(String, u64)> = e["python_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["count"].as_u64().unwrap() > 0, "{l:#}");
            assert_eq!(l["bytes"], l["count"].as_u64().unwrap() * 4 * MIB, "{l:#}");
            let file = l["file"].as_str().unwrap();
            (
                file.rsplit('/').next().unwrap().to_string(),
                l["line"].as_u64().unwrap(),
            )
        })
        .collect();
    let output_line = script_line("cache_growth.py", "# OUTPUT HERE");
    let activations_line = script_line("cache_growth.py", "# ACTIVATIONS HERE");
    assert_eq!(
        lines,
        [
            ("cache_growth.py".to_string(), output_line),
            ("cache_growth.py".to_string(), activations_line)
        ]
        .into(),
        "{e:#}"
    );
    let hint = g["hint"].as_str().unwrap();
    for words in [
        "caching-allocator segments",
        "`oomtrace run` traces each tensor by default",
        "`--torch=swap`",
        "_record_memory_history()",
    ] {
        assert!(hint.contains(words), "{words}: {hint}");
    }
    // Live, while the job ran: the rate (per step: 8 steps of a short run say nothing per
    // second), the lines, and how to see the tensors.
    let live: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("oomtrace: [") && l.contains(" device growth] pid "))
        .collect();
    assert!(!live.is_empty(), "{stderr}");
    assert!(
        live[0].starts_with("oomtrace: [likely device growth] pid ")
            && live[0].contains(": CUDA memory grows +4.00 MiB/step over ")
            && live[0].contains("; cache grew at: cache_growth.py:")
            && live[0].contains("`oomtrace run` traces each tensor by default"),
        "{}",
        live[0]
    );
    // The text report: the finding, then the lines.
    let text = report_text(&dir.join("t.oomt"));
    assert!(
        text.contains(&format!("device growth] pid {}: {msg}\n", g["pid"])),
        "{text}"
    );
    let grew = text
        .lines()
        .find(|l| l.trim_start().starts_with("cache grew at: "))
        .unwrap_or_else(|| panic!("no 'cache grew at' line: {text}"));
    for line in [output_line, activations_line] {
        assert!(
            grew.contains(&format!("cache_growth.py:{line} (")) && grew.contains(" segments)"),
            "{grew}"
        );
    }
}

/// The same loop without the leak: the cache reaches its steady state after the first step,
/// and the device's growth is neither reported nor printed.
#[test]
fn a_clean_loop_on_a_caching_allocator_reports_no_device_growth() {
    let (out, r, _) = run_python(
        "cache_growth.py",
        &[],
        &["40", "--clean"],
        &[("FAKE_TORCH_CACHING", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        findings(&r, "device_growth").is_empty(),
        "{:#?}",
        r["findings"]
    );
    assert!(findings(&r, "leak").is_empty(), "{:#?}", r["findings"]);
    assert!(!stderr.contains("device growth]"), "{stderr}");
}

/// `specialised_call.py`: one line calls `cudaMalloc` through ctypes 60 times and keeps every
/// pointer. CPython specialises the call after a few runs, so the native stack under that line
/// changes inside the interpreter part-way through: the report must still have one call site
/// with all 60 allocations, and one leak, named by that line, with no finding resolved by the
/// split (it once read 53 + 7 allocations, the small site `likely`, then `resolved`).
#[test]
fn a_line_whose_call_the_interpreter_specialises_stays_one_site() {
    let (out, r, dir) = run_python("specialised_call.py", &[], &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    // The split is real here: the shim sent other stacks for the line once the interpreter
    // had specialised the call (CPython 3.11+; the test tier's interpreter is 3.11).
    let trace: oomtrace_collector::model::trace::Trace =
        oomtrace_collector::model::trace::Trace::load(&dir.join("t.oomt")).unwrap();
    assert!(
        trace.processes.iter().any(|p| p.merged_stacks > 0),
        "no stack differed inside the interpreter: the test no longer shows a specialised call"
    );
    let line = script_line("specialised_call.py", "# ALLOC HERE");
    let at_line = |f: &&Value| {
        python_frames(f)
            .first()
            .is_some_and(|fr| *fr == frame("step", "specialised_call.py", line))
    };
    let live: Vec<&Value> = findings(&r, "live_at_exit")
        .into_iter()
        .filter(at_line)
        .collect();
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(
        (live[0]["count"].as_u64(), live[0]["bytes"].as_u64()),
        (Some(60), Some(60 * MIB))
    );
    let leaks = findings(&r, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert!(at_line(&leaks[0]), "{:#?}", leaks[0]);
    assert_eq!(
        leaks[0]["culprit"]["line"].as_u64(),
        Some(line),
        "{:#?}",
        leaks[0]["culprit"]
    );
    assert!(!stderr.contains("[resolved]"), "{stderr}");
}

/// `--torch` (the tracker) on a torch without PyTorch's native caching allocator (the
/// stand-in): nothing is attached, one line says why and what is traced instead, the
/// allocator is not swapped behind the user's back, and the program runs on.
#[test]
fn torch_tracker_mode_says_why_it_cannot_attach() {
    let (out, r, dir) = run_python("train_leak.py", &["--torch"], &["12", "--clean"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = setup_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(STAND_IN_NOT_TRACED)
            && lines[0].contains("tracing CUDA allocations (segments, not tensors)")
            && lines[0].ends_with("; a step is marked after every optimizer step"),
        "{stderr}"
    );
    assert_eq!(processes(&r)[0]["steps"], 12);
    let apis = allocation_apis(&dir);
    assert!(
        !apis.is_empty() && !apis.contains("oomtrace_malloc"),
        "{apis:?}"
    );
}

/// The reader of a PyTorch release's allocator headers (`python/oomtrace/_abi.py`), which gates
/// the tracker on a release oomtrace was not checked against: real releases' headers are
/// recognised with their layout, and copies changed where it matters (a field before `size_`,
/// an action renumbered, another namespace, ...) are refused with the reason
/// (tests/scenarios/python/test_abi.py).
#[test]
fn the_header_reader_recognises_releases_and_refuses_changed_layouts() {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script("test_abi.py"))
        .env("PYTHONPATH", repo().join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("OOMTRACE_TORCH")
        .stdin(std::process::Stdio::null());
    let out = output_within(cmd, TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok test_every_release_is_recognised"),
        "{stdout}"
    );
    assert!(stdout.contains("tests passed"), "{stdout}");
}

/// Device 0 of a process in a report, and its `torch_memory` reading: allocated, max allocated
/// and reserved bytes (the step hook's last reading of PyTorch's counters).
pub(crate) fn torch_memory_of(p: &Value) -> (&Value, Vec<u64>) {
    let device = p["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .unwrap_or_else(|| panic!("no device 0: {p:#}"));
    let m = &device["torch_memory"];
    let read = ["allocated_bytes", "max_allocated_bytes", "reserved_bytes"]
        .iter()
        .map(|k| {
            m[k].as_u64()
                .unwrap_or_else(|| panic!("no {k}: {device:#}"))
        })
        .collect();
    (device, read)
}
