//! The real-PyTorch tier, fragmentation (issue 23): a training loop whose every step works on a
//! longer sequence (`growing_shapes.py`) frees all its tensors each step, yet PyTorch's caching
//! allocator reserves a new segment per step. The report says fragmentation (with the ratio,
//! the gap, the lines, the remedies), calls the input's line a growing working set, and says
//! "leak" nowhere. See `torch.rs` for the tier.

use super::*;

fn findings(report: &Value) -> &Vec<Value> {
    report["findings"].as_array().expect("findings")
}

/// The fragmentation finding of device 0 and its evidence.
fn fragmentation(r: &TorchRun) -> (&Value, &Value) {
    let f = findings(&r.report)
        .iter()
        .find(|f| f["kind"] == "fragmentation" && f["device"] == 0)
        .unwrap_or_else(|| panic!("no fragmentation finding:\n{}", r.text));
    (f, &f["evidence"])
}

#[test]
fn a_growing_working_set_is_fragmentation_and_no_leak_with_tensors() {
    let r = run_torch("growing_shapes.py", Mode::Run, &[]);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
    let (f, e) = fragmentation(&r);
    assert_eq!(f["level"], "warning", "{f:#}");
    assert_eq!(e["source"], "tensors", "{e:#}");
    // PyTorch itself reports about 4x reserved against allocated on this script.
    let ratio = e["reserved_to_allocated"].as_f64().unwrap();
    assert!(ratio > 1.5, "{e:#}");
    let widest = &e["widest"];
    let gap = widest["gap_bytes"].as_u64().unwrap();
    assert!(gap > 256 << 20, "{e:#}");
    assert!(
        e["gap_slope_bytes_per_step"].as_f64().unwrap() > (2u64 << 20) as f64,
        "{e:#}"
    );
    let pattern = &e["pattern"];
    assert_eq!(pattern["sizes_growing"], true, "{pattern:#}");
    assert!(
        pattern["segments_taken_with_room"].as_u64().unwrap() > 0,
        "{pattern:#}"
    );
    // Where the cache grew, in Python lines.
    let lines = e["python_lines"].as_array().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l["file"].as_str().unwrap().ends_with("growing_shapes.py")),
        "{e:#}"
    );
    assert_eq!(
        e["remedies"][0]["alloc_conf"], "expandable_segments:True",
        "{e:#}"
    );
    assert!(
        f["message"].as_str().unwrap().contains("held by no tensor"),
        "{f:#}"
    );
    // The view marks it on the time axis from these.
    assert!(e["onset_s"].as_f64().is_some() && e["detected_s"].as_f64().is_some());

    // Nothing is a leak: every tensor was freed each step.
    let leaks: Vec<&Value> = findings(&r.report)
        .iter()
        .filter(|f| f["kind"] == "leak")
        .collect();
    assert!(leaks.is_empty(), "false leaks: {leaks:#?}\n{}", r.text);
    // The input's line is a growing working set, with its rate.
    let input = torch_line_of("growing_shapes.py", "the input grows");
    let ws = findings(&r.report)
        .iter()
        .find(|f| f["kind"] == "growth" && has_frame(f, "growing_shapes.py", input))
        .unwrap_or_else(|| panic!("no working-set growth at line {input}:\n{}", r.text));
    assert_eq!(ws["level"], "warning", "{ws:#}");
    let rate = ws["growth_bytes_per_step"].as_f64().unwrap();
    assert!((rate - 2.5 * (1 << 20) as f64).abs() < 1024.0, "{ws:#}");
    assert!(ws["message"]
        .as_str()
        .unwrap()
        .contains("working set grows"));
    // The text says it in those words, fragmentation first.
    let frag_at = r.text.find("[fragmentation warning]").expect(&r.text);
    let ws_at = r.text.find("[working set growth warning]").expect(&r.text);
    assert!(frag_at < ws_at, "{}", r.text);
    assert!(!r.text.contains(" leak]"), "{}", r.text);
    assert!(
        r.text.contains("try PYTORCH_CUDA_ALLOC_CONF="),
        "{}",
        r.text
    );
}
