//! PyTorch users where they already are: the Python API in a plain `python` process (no
//! `oomtrace run`, nothing preloaded), the pytest plugin under real pytest, and a notebook in a
//! real Jupyter kernel (nbclient + ipykernel from PyPI, in the tier's venv), each on the
//! simulated GPU. Every release of the tier.

use super::*;

/// A Python command with the package on its path, the library and binary of this build, in
/// `dir`, on the simulated GPU (as `base_command` sets it) unless the test removes it.
fn python_with_package(dir: &Path) -> Command {
    let mut cmd = base_command(python());
    cmd.current_dir(dir)
        .env("PYTHONPATH", repo().join("python"))
        .env("OOMTRACE_LIB", shim())
        .env("OOMTRACE_COLLECTOR", oomtrace_bin())
        .env("SIMCUDA_MEMORY", "16GiB")
        .env_remove("OOMTRACE_OUTPUT")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    torch_env(&mut cmd, dir);
    without_aslr(&mut cmd);
    cmd
}

fn last_json(stdout: &str, what: &str) -> Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{') || l.starts_with('['))
        .unwrap_or_else(|| panic!("{what}: no JSON line:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: {e}: {line}"))
}

#[test]
fn a_traced_block_gives_its_own_findings_back_and_leaves_nothing_behind() {
    let dir = scratch("torch-python-api");
    let stdout = whatif::run_to_end("api_blocks.py", || {
        let mut cmd = python_with_package(&dir);
        cmd.arg(script("api_blocks.py"));
        cmd
    });
    let v = last_json(&stdout, "api_blocks.py");
    // The clean block has no finding; the leaky one its leak at the line, and only it.
    assert_eq!(v["clean"], serde_json::json!([]), "{v:#}");
    let line = torch_script_line("api_blocks.py", "LEAK HERE");
    assert_eq!(
        v["leaky"],
        serde_json::json!([["leak", format!("api_blocks.py:{line}")]]),
        "{v:#}"
    );
    assert!(v["text_has_leak"].as_bool().unwrap(), "{v:#}");
    // 30 kept tensors of 1 MiB: the block's own peak is at least that; the clean block's is
    // its step's temporaries, far less.
    let (leaky, clean) = (
        v["leaky_own_peak"].as_u64().unwrap(),
        v["clean_own_peak"].as_u64().unwrap(),
    );
    assert!(leaky >= 30 << 20, "{v:#}");
    assert!(clean < leaky - (20 << 20), "{v:#}");
    assert!(
        v["html"].as_u64().unwrap() > 10_000,
        "the view inline: {v:#}"
    );
    // The trace was in a directory of its own, gone at exit; nothing written where it ran.
    let trace = PathBuf::from(v["trace"].as_str().unwrap());
    let own_dir = trace.parent().unwrap();
    assert!(!own_dir.exists(), "{} left behind", own_dir.display());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".oomt"))
        .collect();
    assert!(
        left.is_empty(),
        "traces written in the working directory: {left:?}"
    );

    // Under `oomtrace run`, the blocks are read from the run's trace (OOMTRACE_TRACE).
    let run_dir = scratch("torch-python-api-run");
    let trace = run_dir.join("run.oomt");
    let stdout = whatif::run_to_end("api_blocks.py under oomtrace run", || {
        let plain = python_with_package(&run_dir);
        let mut run = base_command(oomtrace_bin());
        run.current_dir(&run_dir)
            .args(["run", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(plain.get_program())
            .arg(script("api_blocks.py"));
        for (k, v) in plain.get_envs() {
            match v {
                Some(v) => run.env(k, v),
                None => run.env_remove(k),
            };
        }
        without_aslr(&mut run);
        run
    });
    let v = last_json(&stdout, "api_blocks.py under run");
    assert_eq!(v["clean"], serde_json::json!([]), "{v:#}");
    // Its leak at the line (the CUDA calls seen too, the device's growth beside it says the
    // leak accounts for it, as in a run's report).
    let leaks: Vec<&Value> = v["leaky"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f[0] == "leak")
        .collect();
    assert_eq!(
        leaks,
        [&serde_json::json!([
            "leak",
            format!("api_blocks.py:{line}")
        ])],
        "{v:#}"
    );
    assert_eq!(v["trace"].as_str(), Some(trace.to_str().unwrap()), "{v:#}");
    assert!(trace.is_file(), "the run's trace stays");
}

#[test]
fn the_pytest_plugin_fails_the_test_that_leaks_or_passes_its_limit() {
    let dir = scratch("torch-pytest");
    let junit = dir.join("junit.xml");
    let mut cmd = python_with_package(&dir);
    // No simulated driver on the library path: `--oomtrace-simulate` brings it.
    cmd.env_remove("LD_LIBRARY_PATH")
        .env_remove("SIMCUDA_MEMORY")
        .args([
            "-m",
            "pytest",
            "-p",
            "oomtrace.pytest_plugin",
            "--oomtrace-simulate",
            "16GiB",
        ])
        .arg("-p")
        .arg("no:cacheprovider")
        .arg(format!("--junitxml={}", junit.display()))
        .arg(script("pytest_gpu/test_gpu.py"));
    let out = output_within(cmd, TORCH_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Two tests fail on purpose: pytest's exit code 1.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    let failed = |name: &str| {
        let at = xml
            .find(&format!("name=\"{name}\""))
            .unwrap_or_else(|| panic!("{name} not run:\n{xml}"));
        let end = xml[at..].find("</testcase>").map_or(xml.len(), |e| at + e);
        let end = xml[at..].find("/>").map_or(end, |e| (at + e).min(end));
        xml[at..end].contains("<failure")
    };
    assert!(!failed("test_clean"), "{stdout}");
    assert!(failed("test_leaks"), "{stdout}");
    assert!(failed("test_too_big"), "{stdout}");
    assert!(!failed("test_fixture"), "{stdout}");
    let leak_line = torch_line_of("pytest_gpu/test_gpu.py", "LEAK HERE");
    assert!(
        stdout.contains(&format!("[confirmed leak] test_gpu.py:{leak_line}")),
        "the failure names the leak's line:\n{stdout}"
    );
    assert!(
        stdout.contains("GPU peak 64.00 MiB is over the limit of 8.00 MiB"),
        "{stdout}"
    );

    // No GPU and no --oomtrace-simulate: the traced tests are skipped, saying how to run them.
    let mut cmd = python_with_package(&dir);
    cmd.env_remove("LD_LIBRARY_PATH")
        .env_remove("SIMCUDA_MEMORY")
        .args([
            "-m",
            "pytest",
            "-p",
            "oomtrace.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-rs",
        ])
        .arg(script("pytest_gpu/test_gpu.py"));
    let out = output_within(cmd, TORCH_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("4 skipped"), "{stdout}");
    assert!(stdout.contains("--oomtrace-simulate 16GiB"), "{stdout}");
}

#[test]
fn a_notebook_traces_a_cell_in_a_real_jupyter_kernel() {
    let dir = scratch("torch-notebook");
    let notebook = repo().join("docs/notebooks/oomtrace.ipynb");
    let stdout = whatif::run_to_end("the notebook", || {
        let mut cmd = python_with_package(&dir);
        cmd.arg(script("run_notebook.py")).arg(&notebook);
        cmd
    });
    let cells = last_json(&stdout, "run_notebook.py");
    let cells = cells.as_array().expect("cells");
    // Cell 2 is the traced loop; cell 3 prints the findings, named as IPython names cells.
    assert!(
        cells[2]["text"]
            .as_str()
            .unwrap()
            .contains("[confirmed leak] Cell In[2], line 7"),
        "{cells:#?}"
    );
    assert!(
        cells[3]["text"].as_str().unwrap().contains("Findings (1)"),
        "{cells:#?}"
    );
    assert_eq!(cells[4]["rich"]["html_has_view"], true, "{cells:#?}");
}
