use super::{DeviceGrowthEvidence, Events};
use crate::analysis::sim::cache_growth;
use crate::analysis::sim::Sim;
use crate::analysis::{Change, Confidence, Detector, Evidence, Finding, Kind, Level};

const MIB: u64 = 1 << 20;
/// Stack 1: a transient allocation every step (native frames only).
const TRANSIENT: u32 = 1;
/// Stack 2: weights, warm-up buffers, eval (native frames only).
const OTHER: u32 = 2;

/// What these tests ask of the simulated process.
trait DeviceGrowthQueries {
    /// One step's activations: allocated and freed.
    fn transient(&mut self);
    fn device_growth(&self) -> Vec<Finding>;
    fn device_growth_alerts(&self) -> Vec<(Change, Level)>;
}

impl DeviceGrowthQueries for Sim {
    fn transient(&mut self) {
        let t = self.alloc(TRANSIENT, 8 * MIB);
        self.free(t);
    }
    fn device_growth(&self) -> Vec<Finding> {
        self.a.device_growth.findings(&self.a.context(&self.p))
    }
    fn device_growth_alerts(&self) -> Vec<(Change, Level)> {
        self.a
            .alerts
            .list
            .iter()
            .filter(|a| a.finding.kind == Kind::DeviceGrowth)
            .map(|a| (a.change, a.finding.level))
            .collect()
    }
}

fn evidence(f: &Finding) -> &DeviceGrowthEvidence {
    match &f.evidence {
        Some(Evidence::DeviceGrowth(e)) => e,
        other => panic!("no device growth evidence: {other:?}"),
    }
}

#[test]
fn fires_on_linear_growth_with_its_rate_when_no_site_grows_on_its_own() {
    let sim = cache_growth(40);
    // No call site is a leak: each reserved one segment.
    assert!(sim.a.growth.findings(&sim.a.context(&sim.p)).is_empty());
    let found = sim.device_growth();
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(
        (f.kind, f.level),
        (Kind::DeviceGrowth, Level::Confidence(Confidence::Confirmed))
    );
    assert_eq!(f.growth_bytes_per_step, Some(4.0 * MIB as f64));
    // A step is 4 ms of synthetic time: 40 steps are 160 ms, too short to say anything
    // per second (a "1000 MiB/s" from it would be noise scaled up).
    assert_eq!(f.growth_bytes_per_s, None);
    let e = evidence(f);
    let w = e.window.unwrap();
    assert_eq!(e.trend.unwrap().window, 32);
    assert_eq!(f.steps, Some(32));
    assert_eq!(w.to_bytes - w.from_bytes, 31 * 4 * MIB);
    assert_eq!(
        f.message,
        format!(
            "device 0: CUDA memory grows {} over 32 steps: {} → {}",
            crate::units::fmt_rate(4.0 * MIB as f64, f.growth_bytes_per_s),
            crate::units::fmt_bytes(w.from_bytes),
            crate::units::fmt_bytes(w.to_bytes)
        )
    );
    assert_eq!(e.events, Events::Allocations);
    assert!(e.leaks_on_device.is_none());
    assert_eq!(f.hint, super::NATIVE_HINT);
    let d = e.at_detection.unwrap();
    assert_eq!(
        (d.level, d.slope_bytes_per_step),
        ("likely", 4.0 * MIB as f64)
    );
    // Printed live: likely first, then confirmed.
    let alerts = sim.device_growth_alerts();
    assert_eq!(
        alerts,
        vec![
            (Change::New, Level::Confidence(Confidence::Likely)),
            (Change::Upgraded, Level::Confidence(Confidence::Confirmed))
        ]
    );
    // What made it grow: the segments of the window after warm-up, by site.
    let grew: u64 = e.grew_at.iter().map(|g| g.bytes).sum();
    assert_eq!(
        grew,
        e.grew_at.iter().map(|g| g.count).sum::<u64>() * 4 * MIB
    );
    assert!(e.grew_at.len() >= 30, "{}", e.grew_at.len());
}

#[test]
fn a_leak_at_one_site_explains_the_device_growth() {
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    for _ in 0..40 {
        sim.transient();
        sim.alloc(3, 2 * MIB);
        sim.mark();
    }
    let f = &sim.device_growth()[0];
    let e = evidence(f);
    let leaks = e.leaks_on_device.unwrap();
    assert_eq!(leaks.leaks, 1);
    assert!(
        leaks.explained && (leaks.share - 1.0).abs() < 0.01,
        "{leaks:?}"
    );
    assert!(
        f.message
            .ends_with("; the 1 leak finding on this device accounts for it"),
        "{}",
        f.message
    );
    assert_eq!(f.hint, super::EXPLAINED_HINT);
    assert_eq!(f.growth_bytes_per_step, Some(2.0 * MIB as f64));
}

/// Nothing about a clean loop may be reported or printed.
fn assert_silent(sim: &Sim) {
    assert!(sim.device_growth().is_empty(), "{:#?}", sim.device_growth());
    assert!(sim.device_growth_alerts().is_empty());
}

#[test]
fn a_device_long_flat_is_judged_again_from_its_first_rise() {
    // The epoch fast path skips a flat, unreported device: the first step that grows
    // must end it, and the finding must date from the growth.
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    for _ in 0..60 {
        sim.transient();
        sim.mark();
    }
    assert!(sim.device_growth().is_empty());
    for _ in 0..30 {
        sim.transient();
        sim.alloc(OTHER, 4 * MIB);
        sim.mark();
    }
    let found = sim.device_growth();
    assert_eq!(found.len(), 1, "{found:#?}");
    let e = evidence(&found[0]);
    assert_eq!(found[0].growth_bytes_per_step, Some(4.0 * MIB as f64));
    let detected = e.detected_step.unwrap();
    assert!((60..70).contains(&detected), "detected at {detected}");
}

#[test]
fn silent_on_a_warm_up_that_grows_then_plateaus() {
    let mut sim = Sim::new(1_000_000);
    for i in 0..80 {
        sim.transient();
        if i < 4 {
            // Lazily created optimizer state, autotuning workspaces.
            sim.alloc(OTHER, 64 * MIB);
        }
        sim.mark();
    }
    assert_silent(&sim);
}

#[test]
fn silent_on_a_periodic_eval_that_rises_and_comes_back() {
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    let mut eval = Vec::new();
    for i in 0..100 {
        sim.transient();
        for p in eval.drain(..) {
            sim.free(p);
        }
        if i % 10 == 9 {
            // Held across one step boundary, then freed.
            for _ in 0..4 {
                eval.push(sim.alloc(OTHER, 64 * MIB));
            }
        }
        sim.mark();
    }
    assert_silent(&sim);
    // Under a caching allocator the first eval's segments stay reserved and later evals
    // reuse them: one step up, then flat.
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    for i in 0..100 {
        sim.transient();
        if i == 9 {
            sim.alloc(OTHER, 256 * MIB);
        }
        sim.mark();
    }
    assert_silent(&sim);
}

/// A caching allocator under dynamic shapes: each step needs three blocks of the step's
/// size, taken from the smallest free segment that fits, a new segment (rounded to 2 MiB)
/// when none does; blocks go back to the cache at the step's end, segments are kept. The
/// cycle's larger shapes come after the warm-up: the cache still grows at steps 5 and 7.
#[test]
fn silent_on_cycling_shapes_once_the_cache_reaches_its_steady_state() {
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    let mut free: Vec<u64> = Vec::new(); // segment sizes
    let sizes = [3, 2, 5, 4, 1, 6, 2, 8].map(|m| m * MIB + 4096);
    let mut grew_at_steps = Vec::new();
    for i in 0..120usize {
        sim.transient();
        let want = sizes[i % sizes.len()];
        let mut taken = Vec::new();
        for _ in 0..3 {
            free.sort_unstable();
            match free.iter().position(|&s| s >= want) {
                Some(j) => taken.push(free.remove(j)),
                None => {
                    let seg = want.div_ceil(2 * MIB) * 2 * MIB;
                    sim.alloc(OTHER, seg);
                    taken.push(seg);
                    grew_at_steps.push(i);
                }
            }
        }
        free.extend(taken);
        sim.mark();
    }
    grew_at_steps.dedup();
    assert_eq!(grew_at_steps, [0, 2, 5, 7]);
    assert_silent(&sim);
}

#[test]
fn growth_that_stops_is_resolved_and_said_so() {
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    for i in 0..80 {
        sim.transient();
        if i < 30 {
            sim.alloc(3 + i % 5, 2 * MIB);
        }
        sim.mark();
    }
    let f = &sim.device_growth()[0];
    assert_eq!(f.level, Level::INFO, "{f:#?}");
    assert!(f.message.contains(", then stopped for "), "{}", f.message);
    let alerts = sim.device_growth_alerts();
    assert_eq!(alerts.first().map(|a| a.0), Some(Change::New), "{alerts:?}");
    assert!(
        matches!(
            alerts.last().map(|a| a.0),
            Some(Change::Resolved | Change::Downgraded)
        ),
        "{alerts:?}"
    );
}

/// A leak at one site over the device's 64 MiB of weights, its 40 buffers then freed; `after`
/// more steps follow, then the process exits.
fn leak_then_free(after: u32) -> Sim {
    let mut sim = Sim::new(1_000_000);
    sim.alloc(OTHER, 64 * MIB);
    let mut kept = Vec::new();
    for _ in 0..40 {
        sim.transient();
        kept.push(sim.alloc(3, 2 * MIB));
        sim.mark();
    }
    for p in kept {
        sim.free(p);
    }
    for _ in 0..after {
        sim.transient();
        sim.mark();
    }
    sim.exit();
    sim
}

/// Kept through the last step and freed at exit: the growth stands (as its leak does), but
/// nothing is left to fill the device: no "at this rate the device is full in ...".
#[test]
fn growth_freed_at_exit_stands_without_a_forecast() {
    let sim = leak_then_free(0);
    let f = &sim.device_growth()[0];
    assert_eq!(f.level, Level::Confidence(Confidence::Confirmed), "{f:#?}");
    let e = evidence(f);
    assert_eq!((e.steps_to_oom, e.time_to_oom_s), (None, None), "{e:#?}");
    assert!(
        f.message.starts_with("device 0: CUDA memory grows"),
        "{}",
        f.message
    );
}

/// Back to the weights at a step boundary while the steps go on: the growth drained; the
/// report says so at `info` with where it fell back to, and the hint says it is no leak.
#[test]
fn growth_given_back_while_steps_go_on_is_resolved_as_drained() {
    let sim = leak_then_free(3);
    let f = &sim.device_growth()[0];
    assert_eq!(f.level, Level::INFO, "{f:#?}");
    assert_eq!(f.cause, crate::analysis::Cause::Drained);
    assert_eq!(f.hint, super::DRAINED_HINT);
    assert!(
        f.message
            .ends_with(", then fell back to 64.00 MiB at step 40; 64.00 MiB live now"),
        "{}",
        f.message
    );
    let e = evidence(f);
    assert_eq!(
        e.history.last().map(|h| (h.level, h.step)),
        Some(("resolved", 40))
    );
    assert!(e.steps_to_oom.is_none());
    assert!(matches!(
        sim.device_growth_alerts().last(),
        Some((Change::Resolved, _))
    ));
}
