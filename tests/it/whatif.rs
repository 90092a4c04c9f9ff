//! `oomtrace whatif` through the real CLI: bad input gives one line and exit 2; a real
//! PyTorch program traced under its own `PYTORCH_CUDA_ALLOC_CONF` is replayed with that
//! setting (recorded in its Hello) and reproduces the reserve PyTorch really held. The checks
//! against PyTorch's own peaks under other settings are `torch::whatif`.

use std::path::Path;

use oomtrace_tests::*;
use serde_json::Value;

fn whatif(args: &[&str]) -> std::process::Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("whatif").args(args);
    output_within(cmd, crate::torch::TORCH_TIMEOUT)
}

/// Exactly one line on stderr naming `needle`, exit 2, no panic (the CLI's rule), and nothing
/// on stdout.
fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    crate::cli::assert_one_line_error(out, needle);
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = scratch("whatif-bad");
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    assert_one_line_error(&whatif(&[garbage.to_str().unwrap()]), "garbage.oomt");
    let missing = dir.join("missing.oomt");
    assert_one_line_error(&whatif(&[missing.to_str().unwrap()]), "missing.oomt");
    // A C program's trace: CUDA allocations, no PyTorch tensors to replay.
    let traced = run_traced("runtime_basic", &[], &[]);
    let trace = traced.trace.to_str().unwrap();
    assert_one_line_error(&whatif(&[trace]), "no tensor events");
    assert_one_line_error(&whatif(&[trace, "--json"]), "no tensor events");
    // Settings are checked before the trace is read, each refusal naming its key.
    for (conf, needle) in [
        ("expandable_segment:True", "expandable_segment"),
        ("max_split_size_mb:5", "max_split_size_mb"),
        ("expandable_segments:yes", "expandable_segments"),
        (
            "roundup_power2_divisions:[256:3]",
            "roundup_power2_divisions",
        ),
        ("backend:cudaMallocAsync", "cudaMallocAsync"),
    ] {
        assert_one_line_error(&whatif(&[trace, "--alloc-conf", conf]), needle);
    }
}

/// `oomtrace run` of a torch scenario with `PYTORCH_CUDA_ALLOC_CONF` set, in `dir`.
fn torch_traced(script: &str, conf: &str, dir: &Path) -> std::path::PathBuf {
    use crate::torch::{python, pytorch_exit_abort, torch_env, without_aslr};
    let trace = dir.join("trace.oomt");
    for attempt in 0..2 {
        let mut cmd = base_command(oomtrace_bin());
        cmd.arg("run")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(python())
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("scenarios/torch")
                    .join(script),
            )
            .current_dir(dir)
            .env("STEPS", "8")
            .env("PYTORCH_CUDA_ALLOC_CONF", conf)
            .env_remove("PYTORCH_ALLOC_CONF");
        torch_env(&mut cmd, dir);
        without_aslr(&mut cmd);
        let out = output_within(cmd, crate::torch::TORCH_TIMEOUT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if attempt == 0 && pytorch_exit_abort(&out.status, &stderr) {
            continue;
        }
        assert!(out.status.success(), "{script} failed:\n{stderr}");
        return trace;
    }
    unreachable!()
}

#[test]
fn the_programs_own_setting_is_replayed_and_reproduces_its_reserve() {
    let dir = scratch("whatif-recorded");
    let trace = torch_traced("clean.py", "expandable_segments:True", &dir);
    let trace = trace.to_str().unwrap();
    let out = whatif(&[trace, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["alloc_conf"], "expandable_segments:True");
    let p = &doc["processes"][0];
    assert_eq!(p["alloc_conf_source"], "recorded");
    let d = &p["devices"][0];
    let (predicted, recorded) = (
        d["peak_reserved_bytes"].as_u64().unwrap(),
        d["recorded_peak_reserved_bytes"].as_u64().unwrap(),
    );
    assert!(recorded > 0, "{d}");
    // The same setting over the same requests: the reserve PyTorch held, to the byte.
    assert_eq!(predicted, recorded, "{d}");
    assert!(d["peak_allocated_bytes"].as_u64().unwrap() > 0, "{d}");
    assert_eq!(d["ooms"], serde_json::json!([]));
    // The text says it in PyTorch's words.
    let out = whatif(&[trace]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{text}"
    );
    assert!(text.contains("torch.cuda.max_memory_reserved()"), "{text}");
    // Asked about the defaults instead, the source is said to be given.
    let out = whatif(&[trace, "--json", "--alloc-conf", ""]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["processes"][0]["alloc_conf_source"], "given");
}
