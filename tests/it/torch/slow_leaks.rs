//! Leaks that slow down, and caches that are no leak (issue 35 items 1 and 6), on real PyTorch
//! under `oomtrace run`: a memo cache of CUDA tensors keyed by sequence length
//! (`tests/scenarios/torch/memo_cache.py`), unbounded over a widening range of lengths (new
//! tables at thinning, irregular intervals, none freed: a leak, in its own words), unbounded
//! over a fixed range (fills, then holds: no leak at the end), and bounded by an LRU (evicts:
//! never a leak). Live lines settle: each line's level changes only on new evidence, and the
//! report agrees with the last live line.

use super::*;

/// Long enough for the widening range to keep bringing new lengths ever more rarely, and for
/// the fixed range's cache to be full and quiet for longer than it took to fill.
const CACHE_STEPS: &str = "120";

fn memo_cache(variant: &str) -> TorchRun {
    let r = run_torch(
        "memo_cache.py",
        Mode::Run,
        &[
            ("CACHE", variant),
            ("STEPS", CACHE_STEPS),
            ("SIMCUDA_MEMORY", "4GiB"),
        ],
    );
    assert_ran(&r, 0);
    r
}

/// The live lines that name the cache's line.
fn live_lines_at<'a>(stderr: &'a str, line: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("oomtrace: [") && l.contains(line))
        .collect()
}

#[test]
fn a_shape_keyed_cache_that_keeps_growing_is_one_leak_in_its_words() {
    let r = memo_cache("widening");
    let name = "memo_cache.py";
    let line = torch_line_of(name, "# CACHE HERE");
    let leaks = findings(&r.report, "leak");
    assert_eq!(leaks.len(), 1, "{}", r.text);
    let leak = leaks[0];
    assert!(has_frame(leak, name, line), "{leak:#}");
    let message = leak["message"].as_str().unwrap();
    assert!(
        message.starts_with("a cache keyed by input shape: ")
            && message.contains("one per distinct size, never evicted"),
        "{message}"
    );
    // Every table the program made after warm-up is still held, one per length.
    let kept = &leak["evidence"]["kept"];
    assert_eq!(kept["one_per_distinct_size"], true, "{kept:#}");
    assert!(kept["allocations"].as_u64().unwrap() >= 20, "{kept:#}");
    assert!(
        leak["hint"].as_str().unwrap().contains("lru_cache"),
        "{leak:#}"
    );
    // Nothing calls it fragmentation's or a bounded cache's; the device's growth is the
    // leak's (never "not tensors held"), said once.
    let device_growth = findings(&r.report, "device_growth");
    for d in &device_growth {
        assert!(
            !d["hint"].as_str().unwrap().contains("not tensors held"),
            "{d:#}"
        );
    }
    // Live lines settle: the line's leak is said and never downgraded, and the device's
    // growth does not flip between confirmed and bounded.
    let at_line = live_lines_at(&r.stderr, &format!("({name}:{line})"));
    assert!(!at_line.is_empty(), "{}", r.stderr);
    assert!(at_line.iter().all(|l| l.contains("leak]")), "{at_line:#?}");
    let flips = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("oomtrace: [downgraded"))
        .count();
    assert_eq!(flips, 0, "{}", r.stderr);
}

#[test]
fn a_shape_keyed_cache_over_a_fixed_range_fills_and_is_no_leak_at_the_end() {
    let r = memo_cache("fixed");
    let name = "memo_cache.py";
    let line = torch_line_of(name, "# CACHE HERE");
    assert!(findings(&r.report, "leak").is_empty(), "{}", r.text);
    // If it was said while filling, the last live line says it stopped: the report agrees.
    let at_line = live_lines_at(&r.stderr, &format!("({name}:{line})"));
    if let Some(last) = at_line.last() {
        assert!(last.starts_with("oomtrace: [resolved]"), "{at_line:#?}");
    }
}

#[test]
fn a_bounded_shape_cache_is_never_a_leak() {
    let r = memo_cache("bounded");
    assert!(growth_findings(&r.report).is_empty(), "{}", r.text);
    assert!(
        !r.stderr.contains("leak]") && !r.stderr.contains("device growth]"),
        "{}",
        r.stderr
    );
}
