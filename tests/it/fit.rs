//! `oomtrace fit` through the real CLI: bad input gives one line and exit 2 (not a trace, a
//! trace without tensors, a nonsense size or batch, a module the trace has no call of). Its
//! predictions against real PyTorch are `torch::fit`.

use oomtrace_tests::*;

fn fit(args: &[&str]) -> std::process::Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("fit").args(args);
    output_within(cmd, crate::torch::TORCH_TIMEOUT)
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = scratch("fit-bad");
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    let one_line = |out: &std::process::Output, needle: &str| {
        crate::cli::assert_one_line_error(out, needle);
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    one_line(&fit(&[garbage.to_str().unwrap()]), "garbage.oomt");
    one_line(
        &fit(&[dir.join("missing.oomt").to_str().unwrap()]),
        "missing.oomt",
    );
    // A C program's trace: CUDA allocations, no PyTorch tensors.
    let traced = run_traced("runtime_basic", &[], &[]);
    let trace = traced.trace.to_str().unwrap();
    one_line(&fit(&[trace]), "no tensor events");
    one_line(&fit(&[trace, "--json"]), "no tensor events");
    // Sizes and batches are checked before the trace is read.
    for (args, needle) in [
        (&["--memory", "lots"][..], "lots"),
        (&["--memory", "0"], "out of range"),
        (&["--memory", "2TiB"], "out of range"),
        (&["--memory", "18446744073709551615GiB"], "out of range"),
        (&["--batch", "0"], "--batch"),
        (&["--batch", "-3"], "-3"),
        (&["--batch", "x"], "--batch"),
    ] {
        let mut all = vec![trace];
        all.extend_from_slice(args);
        let out = fit(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
}
