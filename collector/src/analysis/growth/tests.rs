use crate::analysis::evidence::Fate;
use crate::analysis::sim::Sim;
use crate::analysis::{Confidence, Detector, Kind, Level};
use crate::model::SiteId;

const MIB: u64 = 1 << 20;

/// The live sizes that keep freed sizes at 0 count as the map that removed them did: the
/// same sizes counted (at most `MAX_SIZES` live), the same unique ones, past purges.
#[test]
fn live_sizes_count_as_a_map_of_live_sizes() {
    use super::{LiveSizes, MAX_SIZES};
    use rustc_hash::FxHashMap;
    let mut sizes = LiveSizes::default();
    let mut reference: FxHashMap<u64, u32> = FxHashMap::default();
    let mut live: Vec<u64> = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for step in 0..400_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Phases of few sizes and of many more than MAX_SIZES, freeing and not.
        let spread = if (step / 50_000) % 2 == 0 {
            16
        } else {
            3 * MAX_SIZES as u64
        };
        if !x.is_multiple_of(3) || live.is_empty() {
            let size = 1 + (x >> 8) % spread;
            sizes.add(size);
            if reference.len() < MAX_SIZES || reference.contains_key(&size) {
                *reference.entry(size).or_default() += 1;
            }
            live.push(size);
        } else {
            let size = live.swap_remove((x >> 8) as usize % live.len());
            sizes.remove(size);
            if let Some(c) = reference.get_mut(&size) {
                *c -= 1;
                if *c == 0 {
                    reference.remove(&size);
                }
            }
        }
        if step % 997 == 0 {
            let kept: FxHashMap<u64, u32> = sizes
                .counts
                .iter()
                .filter(|(_, &c)| c > 0)
                .map(|(&k, &c)| (k, c))
                .collect();
            assert_eq!(kept, reference, "step {step}");
            assert_eq!(sizes.live, reference.len());
            assert!(sizes.counts.len() <= 2 * MAX_SIZES);
            let unique = reference.values().filter(|&&c| c == 1).count();
            assert_eq!(sizes.unique(), unique);
        }
    }
}

/// What these tests ask of the simulated process.
trait GrowthQueries {
    fn leak_finding(&self, stack: u32) -> crate::analysis::Finding;
    fn leak_level(&self, stack: u32) -> Option<(Kind, Level)>;
    fn leak_finding_opt(&self, stack: u32) -> Option<crate::analysis::Finding>;
}

impl GrowthQueries for Sim {
    fn leak_finding(&self, stack: u32) -> crate::analysis::Finding {
        let ctx = self.a.context(&self.p);
        self.a
            .growth
            .findings(&ctx)
            .into_iter()
            .find(|f| f.site == SiteId(stack))
            .expect("a finding at that site")
    }
    fn leak_finding_opt(&self, stack: u32) -> Option<crate::analysis::Finding> {
        let ctx = self.a.context(&self.p);
        self.a
            .growth
            .findings(&ctx)
            .into_iter()
            .find(|f| f.site == SiteId(stack))
    }
    fn leak_level(&self, stack: u32) -> Option<(Kind, Level)> {
        let ctx = self.a.context(&self.p);
        self.a
            .growth
            .findings(&ctx)
            .into_iter()
            .find(|f| f.site == SiteId(stack))
            .map(|f| (f.kind, f.level))
    }
}

/// One transient per step at site 1, so every step looks alike.
fn transient(sim: &mut Sim) {
    let t = sim.alloc(1, 8 * MIB);
    sim.free(t);
}

#[test]
fn a_long_leak_stays_confirmed_with_bounded_generations() {
    let mut sim = Sim::new(1000);
    for _ in 0..300 {
        transient(&mut sim);
        sim.alloc(2, MIB);
        sim.mark();
    }
    assert_eq!(
        sim.leak_level(2),
        Some((Kind::Leak, Level::Confidence(Confidence::Confirmed)))
    );
    let s = &sim.a.growth.sites[&(SiteId(2), 0)];
    assert!(
        s.births.buckets() <= crate::analysis::births::MAX_GENERATIONS,
        "{}",
        s.births.buckets()
    );
    assert!(s.series.len() <= crate::analysis::trend::SERIES);
    assert_eq!(sim.leak_level(1), None);
}

fn leak_evidence(f: &crate::analysis::Finding) -> &super::LeakEvidence {
    match &f.evidence {
        Some(crate::analysis::Evidence::Leak(e)) => e,
        other => panic!("no leak evidence: {other:?}"),
    }
}

/// `steps` steps that each keep 1 MiB at site 2 (beside a transient), then all of it freed at
/// once, after the last step.
fn keep_then_free(sim: &mut Sim, steps: u32) {
    let mut kept = Vec::new();
    for _ in 0..steps {
        transient(sim);
        kept.push(sim.alloc(2, MIB));
        sim.mark();
    }
    for p in kept {
        sim.free(p);
    }
}

/// A leaked list freed as the process exits, after its last step: the finding keeps the
/// evidence it was detected on and says the memory was kept through the last step and only
/// freed at exit, never "0 B held in 0 allocations", nor "all of it was freed" beside its
/// level: it stays a confirmed leak (no step gave the memory back).
#[test]
fn a_leak_freed_at_exit_keeps_its_evidence_and_says_so() {
    let mut sim = Sim::new(1000);
    keep_then_free(&mut sim, 30);
    sim.exit();
    let f = sim.leak_finding(2);
    assert_eq!(
        (f.kind, f.level),
        (Kind::Leak, Level::Confidence(Confidence::Confirmed)),
        "{f:?}"
    );
    assert_eq!((f.bytes, f.count), (0, 0));
    let e = leak_evidence(&f);
    let d = e.at_detection.expect("detection evidence");
    assert_eq!(d.level, "likely");
    assert!(
        d.bytes >= 6 * MIB && d.count >= 6 && d.surviving_epochs >= 3,
        "{d:?}"
    );
    assert_eq!(d.bytes, d.count * MIB);
    assert_eq!(d.slope_bytes_per_step.round(), MIB as f64);
    assert_eq!((e.peak_bytes, e.peak_step), (30 * MIB, 29));
    assert_eq!(e.at_end.state, "freed");
    assert_eq!(e.at_end.fate, Fate::FreedAtExit);
    assert_eq!(e.at_end.freed_after_last_step_bytes, 30 * MIB);
    assert!(e.at_end.process_ended);
    assert_eq!(e.steps_to_oom, None);
    assert_eq!(
        f.message,
        format!(
            "{} when detected at step {} ({} into the run): {} held in {} allocations \
             surviving from {} different steps; kept through the last step (30.00 MiB at \
             step 29) and only freed at exit",
            crate::units::fmt_rate(d.slope_bytes_per_step, d.slope_bytes_per_s),
            d.step,
            crate::units::fmt_duration(d.time_s),
            crate::units::fmt_bytes(d.bytes),
            d.count,
            d.surviving_epochs
        )
    );
    assert!(!f.message.contains(" 0 B"), "{}", f.message);
    assert!(!f.message.contains("all of it was freed"), "{}", f.message);
    assert!(!f.hint.contains("never"), "{}", f.hint);
}

/// 30 steps that each keep 1 MiB, all freed at once, then 3 more steps: a step boundary found
/// nothing left while the program still ran (a backlog that drained). The final report says
/// so at `info`, never `confirmed leak` beside "all of it was freed" (issue 41).
#[test]
fn a_leak_all_freed_while_steps_go_on_is_growth_not_a_leak() {
    let mut sim = Sim::new(1000);
    keep_then_free(&mut sim, 30);
    for _ in 0..3 {
        transient(&mut sim);
        sim.mark();
    }
    sim.exit();
    let f = sim.leak_finding(2);
    assert_eq!((f.kind, f.level), (Kind::Growth, Level::INFO), "{f:?}");
    assert_eq!(f.cause, crate::analysis::Cause::Drained);
    assert_eq!(
        f.message,
        "grew (+1.00 MiB/step) to 30.00 MiB by step 29, then all of it was freed (none left \
         at step 30)"
    );
    let e = leak_evidence(&f);
    assert_eq!(e.at_end.fate, Fate::Drained);
    let history: Vec<(&str, u32)> = e.history.iter().map(|h| (h.level, h.step)).collect();
    assert_eq!(
        history[history.len() - 2..],
        [("confirmed", 10), ("resolved", 30)]
    );
    assert!(!sim.a.growth.is_leak(SiteId(2), 0));
    // Said live when it happened: a resolution.
    assert!(
        sim.a
            .alerts
            .list
            .iter()
            .any(|a| a.change == crate::analysis::Change::Resolved && a.finding.site == SiteId(2)),
        "{:?}",
        sim.a.alerts.list
    );
}

/// A drained site that grows again past its old peak is judged again, from scratch: it can be
/// a leak once more.
#[test]
fn a_drained_site_that_grows_past_its_peak_is_a_leak_again() {
    let mut sim = Sim::new(1000);
    keep_then_free(&mut sim, 20);
    transient(&mut sim);
    sim.mark();
    assert_eq!(sim.leak_level(2), Some((Kind::Growth, Level::INFO)));
    for _ in 0..40 {
        transient(&mut sim);
        sim.alloc(2, MIB);
        sim.mark();
    }
    assert_eq!(
        sim.leak_level(2),
        Some((Kind::Leak, Level::Confidence(Confidence::Confirmed)))
    );
    let f = sim.leak_finding(2);
    assert!(
        f.message
            .ends_with("; by the end 40.00 MiB still held in 40 allocations"),
        "{}",
        f.message
    );
}

/// Freed after the last step in a process that still runs (a trace that ends while it runs):
/// kept through every step boundary, so still a leak, and said without "all of it was freed".
#[test]
fn a_leak_freed_after_the_last_step_of_a_running_process_stays_a_leak() {
    let mut sim = Sim::new(1000);
    keep_then_free(&mut sim, 30);
    let f = sim.leak_finding(2);
    assert_eq!(
        (f.kind, f.level),
        (Kind::Leak, Level::Confidence(Confidence::Confirmed))
    );
    assert_eq!(leak_evidence(&f).at_end.fate, Fate::FreedAfterLastStep);
    assert!(
        f.message.ends_with(
            "; kept through the last step (30.00 MiB at step 29) and only freed after it"
        ),
        "{}",
        f.message
    );
}

/// A leak still held at the end says how much, beside what it was detected on.
#[test]
fn a_leak_still_held_at_the_end_says_how_much() {
    let mut sim = Sim::new(1000);
    for _ in 0..30 {
        transient(&mut sim);
        sim.alloc(2, MIB);
        sim.mark();
    }
    let f = sim.leak_finding(2);
    let e = leak_evidence(&f);
    assert_eq!(e.at_end.state, "held");
    assert!(!e.at_end.process_ended);
    assert_eq!(e.at_end.freed_after_last_step_bytes, 0);
    assert!(
        f.message
            .ends_with("; by the end 30.00 MiB still held in 30 allocations"),
        "{}",
        f.message
    );
    assert!(f.message.contains("when detected at step"), "{}", f.message);
}

/// A rate per second over the trace's own time, only once the steps span a second.
#[test]
fn a_rate_per_second_needs_a_second_of_steps() {
    // 4 events of 25 ms per step: 100 ms per step.
    let mut sim = Sim::new(25_000_000);
    let mut rates = Vec::new();
    for _ in 0..30 {
        transient(&mut sim);
        sim.alloc(2, MIB);
        sim.mark();
        rates.push(sim.leak_finding_opt(2).and_then(|f| f.growth_bytes_per_s));
    }
    // Detected within the first second: no rate yet.
    let first = rates.iter().position(|r| r.is_some()).expect("a rate");
    assert!(first >= 9, "{rates:?}");
    let per_s = rates.last().unwrap().unwrap();
    assert!((per_s / (10.0 * MIB as f64) - 1.0).abs() < 0.01, "{per_s}");
}

#[test]
fn a_cache_that_fills_then_stops_is_resolved_not_a_leak() {
    let mut sim = Sim::new(1000);
    for i in 0..80 {
        transient(&mut sim);
        if i < 20 {
            sim.alloc(3, 2 * MIB);
        }
        sim.mark();
    }
    // It did look like a leak while filling; at the end it is reported as growth.
    assert_eq!(sim.leak_level(3), Some((Kind::Growth, Level::INFO)));
    // The site's own lines (the device's growth, which the leak explained while it grew, is
    // said bounded once the leak is resolved).
    let kinds: Vec<_> = sim
        .a
        .alerts
        .list
        .iter()
        .filter(|a| a.finding.site == SiteId(3))
        .map(|a| a.change)
        .collect();
    assert_eq!(
        kinds.last(),
        Some(&crate::analysis::Change::Resolved),
        "{kinds:?}"
    );
}

/// A cache keyed by shape that is never evicted and keeps growing is a leak, in its own words
/// (it was capped at suspected, and never reported, for its distinct sizes).
#[test]
fn a_shape_keyed_cache_never_evicted_is_a_leak_in_its_words() {
    let mut sim = Sim::new(1000);
    for i in 0..60u64 {
        transient(&mut sim);
        // A new sequence length each step: every live size is distinct.
        sim.alloc(4, MIB + i * 4096);
        sim.mark();
    }
    let f = sim.leak_finding(4);
    assert_eq!(f.kind, Kind::Leak, "{}", f.message);
    assert!(
        f.message.starts_with("a cache keyed by input shape: 5"),
        "{}",
        f.message
    );
    assert_eq!(f.cause, crate::analysis::Cause::ShapeKeyedCache);
    let kept = leak_evidence(&f).kept.expect("kept evidence");
    assert!(kept.one_per_distinct_size);
}

/// A bounded shape cache (an LRU that evicts) holds distinct sizes too, but frees them: never a
/// leak, however its bytes drift with the lengths.
#[test]
fn a_shape_keyed_cache_that_evicts_is_no_leak() {
    let mut sim = Sim::new(1000);
    let mut lru = std::collections::VecDeque::new();
    for i in 0..80u64 {
        transient(&mut sim);
        lru.push_back(sim.alloc(4, MIB + i * 4096));
        if lru.len() > 8 {
            let oldest = lru.pop_front().unwrap();
            sim.free(oldest);
        }
        sim.mark();
    }
    assert_eq!(sim.leak_level(4), None);
}

/// Tensors that keep arriving at thinning, irregular intervals (a memo cache over a widening
/// range of lengths), none freed: a leak on what the line holds, however the slope flattens;
/// the same cache over a fixed range fills, stops, and is resolved once it has been quiet for
/// longer than its arrivals allow.
#[test]
fn kept_tensors_arriving_ever_more_rarely_are_a_leak_until_they_stop() {
    // Arrival steps: gaps of 1, 2, 3, ... (thinning): 3, 4, 6, 9, 13, 18, 24, 31, 39, ...
    let thinning = |until: u32| {
        let mut v = Vec::new();
        let (mut at, mut gap) = (3u32, 1u32);
        while at < until {
            v.push(at);
            at += gap;
            gap += 1;
        }
        v
    };
    let mut sim = Sim::new(1000);
    let arrivals = thinning(100);
    for step in 0..100u32 {
        transient(&mut sim);
        if arrivals.contains(&step) {
            sim.alloc(4, 4 * MIB + u64::from(step) * 16384);
        }
        sim.mark();
    }
    let f = sim.leak_finding(4);
    assert_eq!(f.kind, Kind::Leak, "{}", f.message);
    assert!(matches!(
        f.level,
        Level::Confidence(Confidence::Likely | Confidence::Confirmed)
    ));
    // The same, then nothing for 60 steps: stopped, relative to how it grew.
    let mut sim = Sim::new(1000);
    let arrivals = thinning(60);
    for step in 0..140u32 {
        transient(&mut sim);
        if arrivals.contains(&step) {
            sim.alloc(4, 4 * MIB + u64::from(step) * 16384);
        }
        sim.mark();
    }
    assert_eq!(sim.leak_level(4), Some((Kind::Growth, Level::INFO)));
}

#[test]
fn one_off_steps_and_warm_up_are_never_leaks() {
    let mut sim = Sim::new(1000);
    let mut big = None;
    for i in 0..60 {
        transient(&mut sim);
        if i == 1 {
            for _ in 0..16 {
                sim.alloc(5, 8 * MIB); // lazy optimizer state
            }
        }
        if i < 4 {
            sim.alloc(6, 4 * MIB); // warm-up workspaces
        }
        if i == 30 {
            big = Some(sim.alloc(7, 512 * MIB));
        }
        if i == 31 {
            sim.free(big.take().unwrap());
        }
        sim.mark();
    }
    for site in 5..=7 {
        assert_eq!(sim.leak_level(site), None, "site {site}");
    }
    assert!(sim.a.alerts.list.is_empty());
}

/// `steps` steps that keep `size` bytes at site 2 every step (beside a transient); with
/// `free_every`, the oldest kept allocation is freed every that many steps.
fn small_leak(steps: u32, size: u64, free_every: Option<u32>) -> Sim {
    let mut sim = Sim::new(1_000_000);
    let mut kept = std::collections::VecDeque::new();
    for step in 1..=steps {
        transient(&mut sim);
        kept.push_back(sim.alloc(2, size));
        if free_every.is_some_and(|n| step % n == 0) {
            let oldest = kept.pop_front().unwrap();
            sim.free(oldest);
        }
        sim.mark();
    }
    sim
}

/// `losses.append(loss)`: one 512-byte allocation survives every step, none is freed. Far
/// under the trend's 1 MiB floor, it is a leak all the same, `likely` (never `confirmed` on
/// this rule), and its words say how small: allocations a step, bytes a step, and what it
/// reaches after 10^6 steps.
#[test]
fn a_small_leak_that_keeps_every_step_is_found_and_says_it_is_small() {
    let sim = small_leak(40, 512, None);
    let f = sim.leak_finding(2);
    assert_eq!(
        (f.kind, f.level),
        (Kind::Leak, Level::Confidence(Confidence::Likely)),
        "{}",
        f.message
    );
    assert_eq!(f.growth_bytes_per_step, Some(512.0));
    let small = leak_evidence(&f).small.expect("evidence.small");
    assert_eq!(small.allocations_per_step, 1.0);
    assert_eq!(small.bytes_per_step, 512.0);
    assert_eq!(small.after_million_steps_bytes, 512e6);
    assert!(
        f.message.starts_with(
            "small but steady: 1 allocation a step kept, none freed (+512 B/step); 488.28 MiB \
             after 10^6 steps; when detected at step "
        ),
        "{}",
        f.message
    );
    // Not before the steady steps are there: 16 after warm-up, each kept past the lag.
    let early = small_leak(super::STEADY_STEPS as u32, 512, None);
    assert_eq!(early.leak_level(2), None);
    // The site's other findings' rules are untouched: a leak above the floor is not "small".
    let big = small_leak(40, MIB, None);
    assert!(leak_evidence(&big.leak_finding(2)).small.is_none());
}

/// Small allocations kept for a while and then freed one by one (a bounded history, a pool
/// trimmed now and then), or kept only every other step, are not the steady rule's: nothing.
#[test]
fn small_survivors_freed_now_and_then_or_not_every_step_are_no_leak() {
    let trimmed = small_leak(60, 512, Some(5));
    assert_eq!(trimmed.leak_level(2), None);
    let mut sparse = Sim::new(1_000_000);
    for step in 0..60 {
        transient(&mut sparse);
        if step % 2 == 0 {
            sparse.alloc(2, 512);
        }
        sparse.mark();
    }
    assert_eq!(sparse.leak_level(2), None);
}
