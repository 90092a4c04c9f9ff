use crate::analysis::leaks::Leaks;
use crate::analysis::sim::Sim;
use crate::analysis::{Cause, Confidence, Evidence, Finding, Kind, Level, Severity};
use crate::model::SiteId;

const MIB: u64 = 1 << 20;
/// Stack 1: a transient allocation every step, so every step looks alike.
const TRANSIENT: u32 = 1;
/// Stack 2: the buffer.
const BUFFER: u32 = 2;

fn step(sim: &mut Sim) {
    let t = sim.alloc(TRANSIENT, 8 * MIB);
    sim.free(t);
}

/// Every finding of the process (what the report reads), at `site`.
fn at(sim: &Sim, site: u32) -> Vec<Finding> {
    sim.a
        .findings(&sim.p)
        .into_iter()
        .filter(|f| f.site == SiteId(site))
        .collect()
}

/// A buffer re-allocated `grow(step)` bytes large each step, the old one freed after the
/// copy (or before, with `free_first`).
fn realloc_loop(steps: u32, free_first: bool, size: impl Fn(u32) -> u64) -> Sim {
    let mut sim = Sim::new(1_000_000);
    let mut buf: Option<u64> = None;
    for i in 0..steps {
        step(&mut sim);
        if free_first {
            if let Some(old) = buf.take() {
                sim.free(old);
            }
        }
        let new = sim.alloc(BUFFER, size(i));
        if let Some(old) = buf.replace(new) {
            sim.free(old);
        }
        sim.mark();
    }
    sim
}

fn evidence(f: &Finding) -> &crate::analysis::evidence::LeakEvidence {
    match &f.evidence {
        Some(Evidence::Leak(e)) => e,
        other => panic!("no leak evidence: {other:?}"),
    }
}

#[test]
fn a_buffer_reallocated_larger_each_step_is_a_leak_with_its_rate() {
    {
        let sim = realloc_loop(40, false, |i| MIB * u64::from(i + 1));
        // The per-allocation view sees nothing: no allocation survives.
        assert!(!sim.a.growth.reported(SiteId(BUFFER), 0));
        let found = at(&sim, BUFFER);
        assert_eq!(found.len(), 1, "{found:#?}");
        let f = &found[0];
        assert_eq!(
            (f.kind, f.level),
            (Kind::Leak, Level::Confidence(Confidence::Confirmed)),
            "{f:#?}"
        );
        assert_eq!(f.growth_bytes_per_step, Some(MIB as f64));
        assert!(f.hint.contains("freed and replaced"), "{}", f.hint);
        let e = evidence(f);
        let r = e.replaced.expect("replaced evidence");
        assert!(r.frees_in_window >= 7, "{r:?}");
        assert_eq!(r.largest_allocation_bytes, 40 * MIB);
        let detected = e.detected_step.unwrap();
        // Warm-up ends at step 3 (markers from step 0); MIN_SAMPLES later, at the latest
        // within the corpus budget.
        assert!((10..=13).contains(&detected), "{detected}");
        assert_eq!(e.onset_step, 0);
        assert!(e.surviving_epochs < 3);
        assert!(f
            .message
            .starts_with("one buffer's bytes grow +1.00 MiB/step"));
    }
}

/// The same sizes, but each step frees what it held before it allocates the next (a
/// step's input, larger each step, freed with the step): the working set grows, nothing
/// leaks. A buffer replaced only once its larger successor exists (a KV cache grown by
/// `torch.cat`) holds its old bytes between steps: that stays a leak (above).
#[test]
fn a_growing_working_set_is_not_a_leak() {
    let sim = realloc_loop(40, true, |i| MIB * u64::from(i + 1));
    let found = at(&sim, BUFFER);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(
        (f.kind, f.level, f.cause),
        (
            Kind::Growth,
            Level::Severity(Severity::Warning),
            Cause::WorkingSetGrowing
        ),
        "{f:#?}"
    );
    assert_eq!(f.growth_bytes_per_step, Some(MIB as f64));
    assert!(f.message.contains("the working set grows"), "{}", f.message);
    assert!(!sim.a.site_growth.is_leak(SiteId(BUFFER), 0));
    // Live, it never said "leak" either.
    assert!(
        sim.a
            .alerts
            .list
            .iter()
            .all(|a| a.finding.kind != Kind::Leak),
        "{:?}",
        sim.a.alerts.list
    );
}

/// A growing input freed with its step (BUFFER) and the step's output (stack 3), held
/// until the next step's larger one exists: the output grows with the working set.
#[test]
fn a_tensor_that_grows_with_the_working_set_is_not_a_leak() {
    const OUTPUT: u32 = 3;
    let mut sim = Sim::new(1_000_000);
    let mut output: Option<u64> = None;
    for i in 0..40u64 {
        step(&mut sim);
        let input = sim.alloc(BUFFER, MIB * (i + 1));
        let new = sim.alloc(OUTPUT, 2 * MIB * (i + 1));
        sim.mark();
        sim.free(input);
        if let Some(old) = output.replace(new) {
            sim.free(old);
        }
    }
    for site in [BUFFER, OUTPUT] {
        let found = at(&sim, site);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(
            (found[0].kind, found[0].cause),
            (Kind::Growth, Cause::WorkingSetGrowing),
            "{:#?}",
            found[0]
        );
    }
    assert!(at(&sim, OUTPUT)[0]
        .message
        .contains("grows with the working set"));
    assert!(
        sim.a
            .alerts
            .list
            .iter()
            .all(|a| a.finding.kind != Kind::Leak),
        "{:?}",
        sim.a.alerts.list
    );
}

#[test]
fn a_buffer_that_grows_a_few_steps_then_stays_is_silent() {
    let sim = realloc_loop(60, false, |i| MIB * u64::from(i.min(8) + 1));
    assert!(at(&sim, BUFFER).is_empty());
    assert!(sim.a.alerts.list.is_empty(), "{:?}", sim.a.alerts.list);
    // Oscillating between 1 and 8 MiB: a sequence length that cycles.
    let sim = realloc_loop(80, false, |i| MIB * u64::from(i % 8 + 1));
    assert!(at(&sim, BUFFER).is_empty());
    assert!(sim.a.alerts.list.is_empty());
}

#[test]
fn growth_that_stops_later_is_resolved() {
    let sim = realloc_loop(60, false, |i| MIB * u64::from(i.min(25) + 1));
    let found = at(&sim, BUFFER);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].kind, found[0].level), (Kind::Growth, Level::INFO));
}

#[test]
fn a_site_the_leak_detector_reports_is_reported_once() {
    // Each step: three transients at the site freed, one kept (a `total_loss += loss`).
    let mut sim = Sim::new(1_000_000);
    for _ in 0..40 {
        step(&mut sim);
        let mut t = Vec::new();
        for _ in 0..3 {
            t.push(sim.alloc(BUFFER, 4 * MIB));
        }
        for p in t {
            sim.free(p);
        }
        sim.alloc(BUFFER, 4 * MIB);
        sim.mark();
    }
    assert!(sim.a.growth.reported(SiteId(BUFFER), 0));
    let found = at(&sim, BUFFER);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(evidence(&found[0]).replaced.is_none());
}

#[test]
fn state_stays_bounded_over_a_long_run() {
    let sim = realloc_loop(300, false, |i| MIB * u64::from(i + 1));
    let s = &sim.a.site_growth.sites[&(SiteId(BUFFER), 0)];
    assert!(s.series.len() <= crate::analysis::trend::SERIES);
    assert!(s.history.len() <= super::HISTORY);
    assert!(s.high.gaps_kept() <= 8);
    assert!(sim.a.site_growth.is_leak(SiteId(BUFFER), 0));
}

/// A buffer re-allocated 1 MiB larger for 40 steps, then freed; `after` more steps follow,
/// then the process exits.
fn grow_then_free(after: u32) -> Sim {
    let mut sim = Sim::new(1_000_000);
    let mut buf: Option<u64> = None;
    for i in 0..40u64 {
        step(&mut sim);
        let new = sim.alloc(BUFFER, MIB * (i + 1));
        if let Some(old) = buf.replace(new) {
            sim.free(old);
        }
        sim.mark();
    }
    if let Some(last) = buf {
        sim.free(last);
    }
    for _ in 0..after {
        step(&mut sim);
        sim.mark();
    }
    sim.exit();
    sim
}

/// The one finding at the buffer's site.
fn the_buffers_finding(sim: &Sim) -> Finding {
    let mut found = at(sim, BUFFER);
    assert_eq!(found.len(), 1, "{found:#?}");
    found.remove(0)
}

/// Freed only at exit, after the last step: still a leak, said without "all of it was freed".
#[test]
fn a_buffer_freed_at_exit_stays_a_leak_in_words_that_agree() {
    let f = &the_buffers_finding(&grow_then_free(0));
    assert_eq!(
        (f.kind, f.level),
        (Kind::Leak, Level::Confidence(Confidence::Confirmed))
    );
    assert!(
        f.message.ends_with(
            "; kept through the last step (40.00 MiB at step 39) and only freed at exit"
        ),
        "{}",
        f.message
    );
}

/// Freed (reset) while the steps go on: the buffer drained; growth at `info`, not a leak.
#[test]
fn a_buffer_freed_while_steps_go_on_is_growth_not_a_leak() {
    let sim = grow_then_free(3);
    let f = &the_buffers_finding(&sim);
    assert_eq!((f.kind, f.level), (Kind::Growth, Level::INFO), "{f:#?}");
    assert_eq!(f.cause, Cause::Drained);
    assert_eq!(
        f.message,
        "one buffer grew (+1.00 MiB/step) to 40.00 MiB by step 39, then all of it was freed \
         (none left at step 40)"
    );
    assert!(!sim.a.site_growth.is_leak(SiteId(BUFFER), 0));
}

/// An LRU of 8 tables over a widening range of lengths (`functools.lru_cache(maxsize=8)`):
/// it allocates and frees in the same steps and its bytes drift up with the lengths, but what
/// it evicts is as often larger as smaller than what it makes: no buffer is replaced by a
/// larger one, and no finding (its bytes grew, held in as many tables as ever).
#[test]
fn a_cache_that_evicts_over_growing_lengths_is_not_one_buffer_growing() {
    let mut sim = Sim::new(1_000_000);
    let mut lru: std::collections::VecDeque<(u64, u64)> = std::collections::VecDeque::new();
    let mut seed = 7u64;
    for i in 0..120u64 {
        step(&mut sim);
        // xorshift: a length from a range that widens by one every other step.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let length = seed % (4 + i / 2);
        if let Some(at) = lru.iter().position(|&(l, _)| l == length) {
            let hit = lru.remove(at).unwrap();
            lru.push_back(hit);
        } else {
            let ptr = sim.alloc(BUFFER, 4 * MIB + length * 64 * 1024);
            lru.push_back((length, ptr));
            if lru.len() > 8 {
                let (_, oldest) = lru.pop_front().unwrap();
                sim.free(oldest);
            }
        }
        sim.mark();
    }
    let leaks: Vec<Finding> = at(&sim, BUFFER)
        .into_iter()
        .filter(|f| f.kind == Kind::Leak)
        .collect();
    assert!(
        leaks.is_empty(),
        "{:?}",
        leaks.iter().map(|f| &f.message).collect::<Vec<_>>()
    );
    let said: Vec<(Kind, String)> = sim
        .a
        .alerts
        .list
        .iter()
        .map(|a| {
            (
                a.finding.kind,
                format!("{:?} {}", a.change, a.finding.message),
            )
        })
        .collect();
    assert!(
        said.iter().all(|(k, _)| *k == Kind::DeviceGrowth),
        "{said:#?}"
    );
    assert!(said.len() <= 3, "{said:#?}");
}
