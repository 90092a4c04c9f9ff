//! PyTorch's own statistics with each step marker: whatever traces the tensors (`--segments`:
//! nothing does), the step hook reads `torch.cuda.memory_allocated()`,
//! `max_memory_allocated()` and `memory_reserved()` after each optimizer step, and the report's
//! device says the last reading, equal to what the program itself read at its last step.

use super::*;

/// The "stats A M R" line a scenario printed.
fn printed_stats(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("stats "))
        .unwrap_or_else(|| panic!("no stats line: {stdout}"))
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect()
}

fn check_readings(mode: Mode) {
    let r = run_torch("step_memory.py", mode, &[]);
    assert_ran(&r, 0);
    assert_done(&r);
    assert!(
        !r.stderr.contains("memory statistics"),
        "the readings stopped: {}",
        r.stderr
    );
    let printed = printed_stats(&r.stdout);
    let p = &processes(&r.report)[0];
    assert_eq!(p["steps"], STEPS, "{p:#}");
    let (device, read) = crate::python::torch_memory_of(p);
    let m = &device["torch_memory"];
    assert_eq!(read, printed, "{device:#}\n{}", r.stdout);
    assert_eq!(m["step"], STEPS, "{m}");
    // The batch grows every step: the cache holds more than the tensors at the last step.
    assert!(
        printed[2] > printed[0] && printed[1] >= printed[0],
        "{printed:?}"
    );
}

/// `--segments`: no tensor is traced, yet allocated against reserved is known.
#[test]
fn segments_mode_knows_pytorchs_allocated_and_reserved() {
    check_readings(Mode::Segments);
}

/// The default (tensors traced): the same readings come with the markers.
#[test]
fn tensor_mode_sends_the_same_readings() {
    check_readings(Mode::Run);
}
