//! An out-of-memory under `torch.cuda.set_per_process_memory_fraction` (issue 35.3), on real
//! PyTorch under `oomtrace run`: PyTorch's allocator refuses the tensor itself, before the
//! driver is asked, so no CUDA call fails; its out-of-memory observer is what says it. One OOM
//! finding at the line that asked, with the cap named (bytes and fraction), said live once, and
//! `whatif` replays the run under that cap.

use super::whatif::{device0, whatif};
use super::*;

/// Every string in `v` (messages, hints, names): none holds a run of spaces (a string literal
/// broken without its line continuation did, in the middle of a hint).
fn assert_no_runs_of_spaces(v: &Value) {
    match v {
        Value::String(s) => assert!(!s.contains("  "), "a run of spaces in {s:?}"),
        Value::Array(a) => a.iter().for_each(assert_no_runs_of_spaces),
        Value::Object(o) => o.values().for_each(assert_no_runs_of_spaces),
        _ => {}
    }
}

#[test]
fn an_oom_under_a_memory_fraction_cap_is_one_oom_with_the_cap_named() {
    let name = "oom_capped.py";
    let r = run_torch(name, Mode::Run, &[("SIMCUDA_MEMORY", "1GiB")]);
    // PyTorch's own exception, uncaught: Python's exit code.
    assert_ran(&r, 1);
    assert!(r.stderr.contains("torch.OutOfMemoryError"), "{}", r.stderr);
    let gib = 1024 * MIB;
    let cap = gib / 4;
    let ooms = findings(&r.report, "oom");
    let errors: Vec<&&Value> = ooms.iter().filter(|f| f["level"] == "error").collect();
    assert_eq!(errors.len(), 1, "{:#?}\n{}", r.report["findings"], r.text);
    let oom = errors[0];
    assert!(
        has_frame(oom, name, torch_line_of(name, "# OOM HERE")),
        "{:?}\n{}",
        python_frames(oom),
        r.text
    );
    let o = &oom["oom"];
    assert_eq!(o["requested_bytes"].as_u64(), Some(16 * MIB), "{o:#}");
    assert_eq!(o["memory_cap_bytes"].as_u64(), Some(cap), "{o:#}");
    assert_eq!(o["memory_fraction"].as_f64(), Some(0.25), "{o:#}");
    // The driver had most of the device free: the cap refused it, and the words say so.
    assert!(o["free_bytes"].as_u64().unwrap() > gib / 2, "{o:#}");
    let message = oom["message"].as_str().unwrap();
    assert!(
        message.contains("memory cap of 256.00 MiB")
            && message.contains("set_per_process_memory_fraction(0.25)"),
        "{message}"
    );
    let hint = oom["hint"].as_str().unwrap();
    assert!(hint.contains("the cap refused it, not the GPU"), "{hint}");
    assert_no_runs_of_spaces(&r.report["findings"]);
    // Not fragmentation: the driver was never asked (it had the room).
    assert!(
        findings(&r.report, "fragmentation").is_empty(),
        "{}",
        r.text
    );
    // The peak is the device's largest total: the buffers kept until the OOM, the last word
    // of the run (no free came after it).
    let device = &processes(&r.report)[0]["devices"][0];
    assert_eq!(
        device["anatomy"]["at_peak"]["device_bytes"], device["peak_bytes"],
        "{device:#}"
    );
    // Said live once, as an OOM of a tensor at the line; the report's text too.
    assert_eq!(r.stderr.matches("[oom error]").count(), 1, "{}", r.stderr);
    let live = r
        .stderr
        .lines()
        .find(|l| l.contains("[oom error]"))
        .unwrap();
    assert!(live.contains("memory cap of 256.00 MiB"), "{live}");
    assert!(r.text.contains("Out of memory (1)"), "{}", r.text);
    assert!(
        !r.text.contains("Nothing was still allocated"),
        "{}",
        r.text
    );
    // whatif replays the run under the cap the program set: the OOM would still happen with
    // the recorded setting, and the reserve never passes the cap.
    let w = whatif(&r.trace, None);
    let d = device0(&w);
    assert_eq!(d["program_cap_bytes"].as_u64(), Some(cap), "{d:#}");
    let recorded: Vec<&Value> = d["ooms"].as_array().unwrap().iter().collect();
    assert_eq!(recorded.len(), 1, "{d:#}");
    assert_eq!(recorded[0]["would_still_happen"], true, "{d:#}");
    assert!(d["peak_reserved_bytes"].as_u64().unwrap() <= cap, "{d:#}");
    // A cap twice as large would have fit it (the device has the room).
    let w = whatif(&r.trace, Some("per_process_memory_fraction:0.5"));
    let d = device0(&w);
    assert_eq!(d["ooms"][0]["would_still_happen"], false, "{d:#}");
}
