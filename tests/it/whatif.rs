//! `oomtrace whatif` through the real CLI: bad input gives one line and exit 2; a real
//! PyTorch program traced under its own `PYTORCH_CUDA_ALLOC_CONF` is replayed with that
//! setting (recorded in its Hello) and reproduces the reserve PyTorch really held. The checks
//! against PyTorch's own peaks under other settings are `torch::whatif`.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use oomtrace_proto::trace_file as tf;
use oomtrace_proto::wire::{encode, GoodbyeReason, Hello};
use oomtrace_proto::{Api, Event, EventKind, StackId};
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

/// A crafted one-process trace of PyTorch's events on device 0, in order: (kind, api, ptr,
/// size, stream), an `AllocFailed` with CUDA's out-of-memory result.
fn crafted_trace(path: &Path, events: &[(EventKind, Api, u64, u64, u64)]) {
    let mut f = std::io::BufWriter::new(File::create(path).expect("create the trace"));
    tf::write_header(&mut f, 1, "crafted").unwrap();
    tf::write_conn_open(&mut f, 1, 1, 1).unwrap();
    let mut frames = Vec::new();
    encode::hello(
        &mut frames,
        &Hello {
            pid: 4747,
            argv: vec!["crafted".into()],
            ..Default::default()
        },
    );
    encode::stack_def(&mut frames, StackId(1), &[0x40_0000, 0x40_1000]);
    let at = encode::begin_events(&mut frames);
    for (seq, &(kind, api, ptr, size, stream)) in (1u64..).zip(events) {
        let mut e = Event::new(kind, api);
        e.seq = seq;
        e.ts_ns = seq * 1_000_000_000;
        e.device = 0;
        e.tid = 1;
        e.stack = StackId(1);
        (e.ptr, e.size, e.aux) = (ptr, size, stream);
        if kind == EventKind::AllocFailed {
            e.result = 2;
        }
        encode::push_event(&mut frames, &e);
    }
    encode::end_events(&mut frames, at);
    encode::goodbye(&mut frames, GoodbyeReason::Exit, events.len() as u64);
    tf::write_chunk(&mut f, 1, &frames, true).unwrap();
    tf::write_conn_close(&mut f, 1, 2, tf::CloseReason::Clean, "").unwrap();
    tf::write_end(&mut f, 3, 1).unwrap();
    f.flush().unwrap();
}

/// Sizes near 2^64 (a file can hold any): the prediction never saturates into a peak of
/// 2^64 - 1 bytes; it refuses what no device could hold, as out of memory, and says in one
/// line (and in JSON) that it met the 64-bit bound. No setting panics on them.
#[test]
fn sizes_past_64_bits_are_said_not_saturated() {
    use {Api::oomtrace_torch_alloc as ALLOC, EventKind::*};
    let dir = scratch("whatif-64-bits");
    let trace = dir.join("huge.oomt");
    let half = 1u64 << 63;
    crafted_trace(
        &trace,
        &[
            // PyTorch's segments, as the trace says: more than 64 bits count.
            (
                Segment,
                Api::oomtrace_torch_segment,
                0x7000_0000_0000,
                half,
                0,
            ),
            (
                Segment,
                Api::oomtrace_torch_segment,
                0x7100_0000_0000,
                half,
                0,
            ),
            // Granted, on two streams: u64::MAX bytes, then twice half of 2^64.
            (Alloc, ALLOC, 0x7000_0000_0000, u64::MAX, 7),
            (Alloc, ALLOC, 0x7100_0000_0000, half, 7),
            (Alloc, ALLOC, 0x7200_0000_0000, half, 8),
            // Refused in the run too.
            (AllocFailed, ALLOC, 0, u64::MAX - 511, 7),
        ],
    );
    let trace = trace.to_str().unwrap();
    for conf in ["", "expandable_segments:True", "roundup_power2_divisions:4"] {
        let out = whatif(&[trace, "--json", "--alloc-conf", conf]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{conf:?}: {stderr}");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let p = &doc["processes"][0];
        let d = &p["devices"][0];
        let peak = d["peak_reserved_bytes"].as_u64().unwrap();
        // One half of 2^64 held (in whole pages, expandable); the rest refused.
        assert!((half..u64::MAX).contains(&peak), "{conf:?}: {d}");
        assert_eq!(d["peak_allocated_bytes"], half, "{conf:?}: {d}");
        assert_eq!(d["new_oom_count"], 2, "{conf:?}: {d}");
        assert_eq!(d["ooms"][0]["would_still_happen"], true, "{conf:?}: {d}");
        let past = &d["past_64_bits"];
        assert_eq!(past["count"], 3, "{conf:?}: {d}");
        assert_eq!(past["request_bytes"], u64::MAX, "{conf:?}: {d}");
        assert_eq!(past["granted"], true, "{conf:?}: {d}");
        // The recorded reserve: said to stop at 2^64 - 1, not a silent peak.
        let warnings = p["warnings"].to_string();
        assert!(warnings.contains("2^64"), "{conf:?}: {warnings}");
    }
    // In words: one line for the prediction, one warning for the recorded segments.
    let out = whatif(&[trace]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let said: Vec<&str> = text.lines().filter(|l| l.contains("2^64")).collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(
        said[0].contains("3 requests") && said[0].contains(&u64::MAX.to_string()),
        "{text}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("2^64"), "{stderr}");
}
