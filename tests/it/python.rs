//! Python programs through the real shim, collector and CLI: Python frames with the GIL held
//! and released, `oomtrace run --torch` on a stand-in `torch` (tests/scenarios/python/
//! site-packages/torch, PyTorch's names and call paths on the simulated CUDA), `import oomtrace` without
//! `oomtrace run`, and the pluggable-allocator ABI itself.

use std::path::{Path, PathBuf};
use std::process::Output;

use oomtrace_tests::*;
use serde_json::Value;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/python")
        .join(name)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The 1-based line of `script` that contains `marker`.
fn line_of(name: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(script(name)).unwrap();
    let i = text
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in {name}"));
    i as u64 + 1
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
    let released = line_of("gil.py", "# RELEASED");
    let held = line_of("gil.py", "# HELD");
    let caller = line_of("gil.py", "# CALLER");
    // GIL released (CDLL), two calls through a method: one site, Python stack in order.
    let py = python_frames(by_bytes(2 * MIB));
    assert_eq!(
        py,
        vec![
            frame("alloc_released", "gil.py", released),
            frame(
                "Model.layer",
                "gil.py",
                line_of("gil.py", "alloc_released(1 << 20)")
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
            line_of("train_leak.py", "# ALLOC HERE")
        ),
        "{py:#?}"
    );
    assert_eq!(
        py[1],
        frame(
            "<module>",
            "train_leak.py",
            line_of("train_leak.py", "output = forward(step)")
        ),
        "{py:#?}"
    );
}

#[test]
fn torch_mode_traces_tensors_and_names_the_leaking_python_line() {
    let (out, r, _) = run_python("train_leak.py", &["--torch"], &["40"], &[]);
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
    let (out, r) = run_python_in(&project, &program, &["--torch"], &["40"], &[]);
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
    let (out, r, _) = run_python("train_leak.py", &["--torch"], &["40", "--clean"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(findings(&r, "leak").is_empty(), "{:#?}", r["findings"]);
    assert_eq!(processes(&r)[0]["steps"], 40);
}

#[test]
fn torch_mode_keeps_the_users_own_sitecustomize() {
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
        .args(["run", "--torch", "-o", "t.oomt", "--", "python3"])
        .arg(&prog)
        .env("PYTHONPATH", pythonpath);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "True True\n");
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
            line_of("pluggable.py", "# KEPT")
        )
    );
    let p = &processes(&r)[0];
    assert_eq!(p["unmatched_frees"].as_u64().unwrap_or(0), 0, "{p:#?}");
}
