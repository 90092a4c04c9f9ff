//! `oomtrace run --simulate SIZE -- CMD`: a CUDA program with its own runtime and no driver
//! anywhere on its library path runs on the simulated GPU that the `oomtrace` binary carries,
//! of the size given: the shim sees its allocations, it runs out of memory exactly where a
//! device of that size would, its exit code is its own, and the summary and the JSON report
//! say the GPU was simulated. A bad SIZE is one line and exit 2, before anything runs.
//! (From real PyTorch: `torch::simulate`.)

use std::path::Path;
use std::process::Command;

use oomtrace_tests::*;
use serde_json::Value;

/// `oomtrace run --simulate SIZE` with `flags`, in `dir`: the program finds only a CUDA
/// runtime (`libcudart.so.12`, copied alone into `dir/runtime`) on its library path, as a
/// program built with a runtime of its own would on a machine without a GPU; the cache (where
/// the simulated driver is installed) is in `dir`.
fn simulated_run(dir: &Path, size: &str, flags: &[&str], program: &[&Path]) -> Command {
    let runtime = dir.join("runtime");
    if !runtime.is_dir() {
        std::fs::create_dir_all(&runtime).expect("runtime dir");
        std::fs::copy(
            Path::new(SIM_LIB).join("libcudart.so.12"),
            runtime.join("libcudart.so.12"),
        )
        .expect("copy the runtime");
    }
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir)
        .env("LD_LIBRARY_PATH", &runtime)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env_remove("SIMCUDA_MEMORY")
        .env_remove("CUDA_MODULE_LOADING")
        .args(["run", "--simulate", size])
        .args(flags)
        .arg("--")
        .args(program);
    cmd
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_cuda_program_runs_on_the_simulated_gpu_of_the_size_given() {
    let dir = scratch("simulate-c");
    let oom = scenario("oom");
    // No driver where the program looks: the one it gets is `--simulate`'s.
    assert!(!dir.join("runtime/libcuda.so.1").exists());

    // 1 GiB: holding 600 MiB, the program's 768 MiB request fails, as on a 1 GiB GPU; it
    // expected that and exits with 0.
    let json = dir.join("small.json");
    let out = output_within(
        simulated_run(
            &dir,
            "1GiB",
            &["-o", "small.oomt", "--json", "small.json"],
            &[&oom],
        ),
        TIMEOUT,
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("out of memory as expected"),
        "{stderr}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
            .expect("valid JSON");
    assert_eq!(
        report["trace"]["simulated"],
        serde_json::json!({"device_memory": "1GiB", "device_memory_bytes": 1u64 << 30}),
        "{:#}",
        report["trace"]
    );
    // The shim saw every allocation: 600 MiB held, 768 MiB refused, then 100 MiB that fits.
    let procs = processes(&report);
    assert_eq!(procs.len(), 1, "{:#}", report["processes"]);
    let dev = device(procs[0], 0);
    assert_eq!(dev["capacity_bytes"].as_u64(), Some(1 << 30), "{dev:#}");
    assert_eq!(dev["allocations"].as_u64(), Some(2), "{dev:#}");
    assert_eq!(dev["failed_allocations"].as_u64(), Some(1), "{dev:#}");
    assert_eq!(dev["peak_bytes"].as_u64(), Some(700 * MIB), "{dev:#}");
    let ooms = findings(&report, "oom");
    assert_eq!(ooms.len(), 1, "{:#}", report["findings"]);
    let o = &ooms[0]["oom"];
    assert_eq!(o["requested_bytes"].as_u64(), Some(768 * MIB), "{o:#}");
    assert_eq!(o["total_bytes"].as_u64(), Some(1 << 30), "{o:#}");
    assert_eq!(o["free_bytes"].as_u64(), Some(424 * MIB), "{o:#}");
    assert!(
        functions(ooms[0]).iter().any(|f| f == "too_big"),
        "{:#}",
        ooms[0]
    );
    // What the summary says of a simulated GPU.
    for said in [
        "running on a simulated 1GiB GPU",
        "kernels did not run",
        "values computed on the device are meaningless",
        "control flow that depends on them differs",
        "allocation sizes and lifetimes are those of a real GPU for programs whose shapes do \
         not depend on data",
    ] {
        assert!(
            stderr.replace("\n  ", " ").contains(said),
            "{said:?} not said:\n{stderr}"
        );
    }

    // 2 GiB: the same request fits, so the program's check fails and its exit code (1) is
    // `run`'s; the 768 MiB it never freed are held at exit.
    let out = output_within(
        simulated_run(
            &dir,
            "2GiB",
            &["-o", "large.oomt", "--json", "large.json"],
            &[&oom],
        ),
        TIMEOUT,
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("large.json")).expect("the JSON report"),
    )
    .expect("valid JSON");
    assert!(
        findings(&report, "oom").is_empty(),
        "{:#}",
        report["findings"]
    );
    let dev = device(processes(&report)[0], 0);
    assert_eq!(dev["capacity_bytes"].as_u64(), Some(2 << 30), "{dev:#}");
    assert_eq!(
        dev["live_at_exit_bytes"].as_u64(),
        Some(768 * MIB),
        "{dev:#}"
    );
    assert_eq!(
        report["trace"]["simulated"]["device_memory_bytes"].as_u64(),
        Some(2 << 30)
    );

    // The trace itself says it was simulated: a later report of it knows (each process
    // recorded its simulated device).
    let later = report_json(&dir.join("large.oomt"));
    assert_eq!(
        later["trace"]["simulated"],
        serde_json::json!({"device_memory": "2.00 GiB", "device_memory_bytes": 2u64 << 30}),
        "{:#}",
        later["trace"]
    );
}

/// Under simulation a forecast is in steps, never seconds (kernels take no time there), in
/// `run`'s summary and in a later report, which opens by saying the run was simulated.
#[test]
fn a_simulated_run_forecasts_in_steps_and_stays_marked() {
    let dir = scratch("simulate-steps");
    let program = scenario("leak_then_eval");
    let out = output_within(
        simulated_run(
            &dir,
            "1GiB",
            &["-o", "l.oomt"],
            &[&program, Path::new("2"), Path::new("0")],
        ),
        TIMEOUT,
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let text = report_text(&dir.join("l.oomt"));
    assert!(
        text.contains("(ran on a simulated 1.00 GiB GPU: no kernel ran"),
        "{text}"
    );
    // A diff of it says so too, for each side (the same trace twice here).
    let trace = dir.join("l.oomt");
    let diff = |json: bool| {
        let mut c = base_command(oomtrace_bin());
        c.arg("diff");
        if json {
            c.arg("--json");
        }
        c.arg(&trace).arg(&trace);
        output_within(c, TIMEOUT).stdout
    };
    let text_diff = String::from_utf8_lossy(&diff(false)).into_owned();
    for side in ["BEFORE", "AFTER"] {
        assert!(
            text_diff.contains(&format!("({side} ran on a simulated 1.00 GiB GPU")),
            "{text_diff}"
        );
    }
    let v: Value = serde_json::from_slice(&diff(true)).expect("diff --json");
    assert_eq!(
        v["after_work"]["simulated"]["device_memory_bytes"].as_u64(),
        Some(1 << 30),
        "{v:#}"
    );
    for (what, said) in [
        ("run's summary", stderr.as_str()),
        ("the report", text.as_str()),
    ] {
        let forecasts: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("the device is full in"))
            .collect();
        assert!(!forecasts.is_empty(), "no forecast in {what}:\n{said}");
        for l in forecasts {
            assert!(
                l.trim_end().ends_with(" steps") || l.trim_end().ends_with(" step"),
                "{what}: a forecast in seconds: {l}"
            );
        }
    }
}

#[test]
fn a_bad_size_is_one_line_and_exit_2_before_anything_runs() {
    let dir = scratch("simulate-bad");
    let marker = dir.join("ran");
    for (size, says) in [
        ("banana", "\"banana\" is not a size"),
        (
            "16",
            "16 is out of range: a device's memory is 1MiB to 1TiB",
        ),
        ("2TiB", "2TiB is out of range"),
        ("1.5GiB", "not a size"),
    ] {
        let out = output_within(
            simulated_run(
                &dir,
                size,
                &[],
                &[Path::new("/usr/bin/touch"), marker.as_path()],
            ),
            TIMEOUT,
        );
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{size}: {stderr}");
        assert!(stderr.contains(says), "{size}: {stderr}");
        assert_eq!(
            stderr.lines().filter(|l| !l.trim().is_empty()).count(),
            1,
            "{size}: one line:\n{stderr}"
        );
        assert!(!marker.exists(), "{size}: the program ran");
        assert!(
            !dir.join("cache").exists(),
            "{size}: something was installed"
        );
    }
}
