//! `oomtrace run --simulate 1GiB -- python script.py`, as a user without a GPU types it: the
//! venv's python with nothing of CUDA set (no driver on the library path, no
//! `CUDA_MODULE_LOADING`, address-space randomisation as the machine has it): the real
//! PyTorch wheel runs on the simulated GPU that `oomtrace` carries, the leak is named at its
//! Python line and the OOM at its line, on a device of exactly the size given, and `run` exits
//! with the program's own code. One Python process (the tier's time matters).

use super::*;

/// The user's command line, in `dir`: only what any Python program gets here (no bytecode in
/// the repository, PyTorch's cache in `dir`) and the cache where the simulated driver goes.
fn user_command(dir: &Path) -> Command {
    let mut cmd = Command::new(oomtrace_bin());
    cmd.current_dir(dir)
        .args(["run", "--simulate", "1GiB", "--json", "report.json"])
        .args(["-o", "trace.oomt", "--"])
        .arg(python())
        .arg(script("simulated.py"))
        .env("STEPS", STEPS.to_string())
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TORCHINDUCTOR_CACHE_DIR", dir.join("torchinductor"))
        .env("OOMTRACE_LIB", shim())
        .stdin(std::process::Stdio::null());
    for k in [
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "CUDA_MODULE_LOADING",
        "PYTORCH_CUDA_ALLOC_CONF",
        "SIMCUDA_MEMORY",
        "OOMTRACE_SOCKET",
        "OOMTRACE_OUTPUT",
        "OOMTRACE_DISABLE",
        "OOMTRACE_TORCH",
        "OWN_ALLOCATOR",
    ] {
        cmd.env_remove(k);
    }
    cmd
}

#[test]
fn simulate_runs_real_pytorch_from_a_plain_venv() {
    let file = script("simulated.py");
    let leak_line = line_of(&file, "# LEAK");
    let oom_line = line_of(&file, "# OOM HERE");
    let r = (0..2)
        .find_map(|attempt| {
            let dir = scratch("torch-simulate");
            let out = output_within(user_command(&dir), TORCH_TIMEOUT);
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if attempt == 0 && pytorch_exit_abort(&out.status, &stderr) {
                eprintln!("simulated.py: PyTorch aborted at exit (pytorch#38228); once more");
                return None;
            }
            let report = serde_json::from_str(
                &std::fs::read_to_string(dir.join("report.json"))
                    .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}")),
            )
            .expect("valid JSON");
            Some(TorchRun {
                status: out.status,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                text: report_text(&dir.join("trace.oomt")),
                trace: dir.join("trace.oomt"),
                stderr,
                report,
                _dir: dir,
            })
        })
        .expect("a run");
    // Python's own exit code for the uncaught OutOfMemoryError, after the whole loop.
    assert_ran(&r, 1);
    assert_done(&r);
    assert!(r.stderr.contains("torch.OutOfMemoryError"), "{}", r.stderr);
    assert_eq!(
        r.report["trace"]["simulated"],
        serde_json::json!({"device_memory": "1GiB", "device_memory_bytes": 1u64 << 30}),
        "{:#}",
        r.report["trace"]
    );
    assert!(r.stderr.contains("kernels did not run"), "{}", r.stderr);
    // The leak, at its line, as on a GPU (tensor level, 4 MiB a step).
    check_activation_leak(&r, Mode::Run, "simulated.py", leak_line);
    // The OOM at its line, on a device of the size given.
    let oom = findings(&r.report, "oom")
        .into_iter()
        .find(|f| f["level"] == "error")
        .unwrap_or_else(|| panic!("no OOM error: {:#?}\n{}", r.report["findings"], r.text));
    assert!(
        has_frame(oom, "simulated.py", oom_line),
        "OOM not at simulated.py:{oom_line}: {:?}\n{}",
        python_frames(oom),
        r.text
    );
    assert!(
        r.stderr.contains("[oom error]")
            && r.stderr.contains(&format!("(simulated.py:{oom_line})")),
        "{}",
        r.stderr
    );
    let o = &oom["oom"];
    assert_eq!(o["total_bytes"].as_u64(), Some(1 << 30), "{o:#}");
    assert_eq!(o["requested_bytes"].as_u64(), Some(4 << 30), "{o:#}");
}
