use super::*;

/// The tree the recency list replaced, as it was: every signature must match it.
#[test]
fn a_threads_signatures_are_the_ordered_maps() {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Reference {
        idx: u64,
        last: FxHashMap<SiteId, u64>,
        by_last: BTreeMap<u64, SiteId>,
    }
    impl Reference {
        fn observe(&mut self, site: SiteId) -> Option<u64> {
            self.idx += 1;
            let i = self.idx;
            let Some(&prev) = self.last.get(&site) else {
                if self.last.len() < MAX_SITES_PER_THREAD {
                    self.last.insert(site, i);
                    self.by_last.insert(i, site);
                }
                return None;
            };
            let (mut sum, mut n) = (0u64, 0u64);
            for (_, s) in self.by_last.range(prev + 1..).rev().take(SIGNATURE_SITES) {
                sum = sum.wrapping_add(mix(u64::from(s.0)));
                n += 1;
            }
            self.by_last.remove(&prev);
            self.by_last.insert(i, site);
            self.last.insert(site, i);
            Some(if n == 0 {
                0
            } else {
                sum.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
            })
        }
    }
    let (mut t, mut r) = (Thread::new(1), Reference::default());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for step in 0..300_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Loops of a few sites, inner loops, and now and then one of thousands (past
        // the per-thread limit).
        let site = match x % 10 {
            0 => SiteId((x >> 8) as u32 % 6000),
            1..=3 => SiteId(1 + (step % 7) as u32),
            _ => SiteId(100 + (x >> 16) as u32 % 60),
        };
        assert_eq!(
            t.observe(site).1.map(|(sig, _)| sig),
            r.observe(site),
            "step {step}"
        );
    }
}

/// One iteration: a layer loop of 12 allocations at one site, then 5 distinct sites.
fn iteration(clock: &mut EpochClock, ts: &mut u64) -> u32 {
    let mut boundaries = 0;
    for _ in 0..12 {
        *ts += 10;
        boundaries += u32::from(clock.on_alloc(SiteId(1), 1, *ts, 0));
    }
    for s in 2..7 {
        *ts += 10;
        boundaries += u32::from(clock.on_alloc(SiteId(s), 1, *ts, 0));
    }
    boundaries
}

/// Timestamps from the wire can be anything: gaps near 2^64 make the time window's length
/// saturate instead of overflowing (found by the wire_decoder fuzz target).
#[test]
fn time_windows_survive_timestamps_near_the_largest() {
    // A median gap of 2^60 ns makes a window of 2^63 ns; at 2^63 ns in, its double
    // overflowed.
    let mut c = EpochClock {
        window_len: Some(1 << 63),
        window_low: 0,
        window_high: 1 << 20,
        ..EpochClock::default()
    };
    assert!(
        !c.window_closes(1 << 63, 1 << 20),
        "not at a trough, not twice as long"
    );
    assert!(c.window_closes(u64::MAX, 1 << 20));
}

#[test]
fn locks_on_the_iteration_not_the_layer_loop() {
    let mut c = EpochClock::default();
    let mut ts = 1;
    let mut per_iter = Vec::new();
    for _ in 0..30 {
        per_iter.push(iteration(&mut c, &mut ts));
    }
    assert_eq!(c.source, EpochSource::Auto);
    assert_eq!(c.period_allocs(), Some(17.0));
    assert_ne!(c.anchor(), Some(SiteId(1)));
    assert!(matches!(c.anchor_kind(), Some(AnchorKind::Structural(_))));
    assert!(per_iter[10..].iter().all(|&b| b == 1), "{per_iter:?}");
    assert!((c.confidence() - STRUCTURAL_CONFIDENCE).abs() < 1e-9);
}

#[test]
fn markers_take_over() {
    let mut c = EpochClock::default();
    let mut ts = 1;
    for _ in 0..10 {
        iteration(&mut c, &mut ts);
    }
    let before = c.epoch;
    assert!(c.on_marker(ts));
    for _ in 0..5 {
        assert_eq!(iteration(&mut c, &mut ts), 0);
    }
    assert_eq!((c.source, c.epoch), (EpochSource::Markers, before + 1));
    assert_eq!(c.confidence(), 1.0);
}

/// xorshift64, for streams with no structure.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn aperiodic_streams_fall_back_to_time_windows_at_troughs() {
    let mut c = EpochClock::default();
    let mut x: u64 = 88172645463325252;
    let mut live_at_boundaries = Vec::new();
    // 20,000 allocations 100 µs apart (2 s); live bytes a sawtooth of period 37.
    for i in 0..20_000u64 {
        let site = SiteId((xorshift(&mut x) % 500) as u32 + 1);
        let live = (i % 37) * 1000 + 5000;
        if c.on_alloc(site, 1, 1 + i * 100_000, live) {
            live_at_boundaries.push(live);
        }
    }
    assert_eq!(c.source, EpochSource::Windows);
    assert_eq!(c.epoch, 1, "two 1 s windows, the second still open");
    assert_eq!(c.anchor(), None);
    // Closed at a trough: within 1/8 of the window's range above its lowest point.
    assert!(
        live_at_boundaries.iter().all(|&l| l <= 5000 + 36_000 / 8),
        "{live_at_boundaries:?}"
    );
    assert!((c.confidence() - TIME_CONFIDENCE).abs() < 1e-9);
}

#[test]
fn a_changed_phase_drops_the_anchor() {
    let mut c = EpochClock::default();
    let mut ts = 1;
    for _ in 0..10 {
        iteration(&mut c, &mut ts);
    }
    let anchor = c.anchor().unwrap();
    // The anchor now allocates every 3 iterations' worth of events.
    for _ in 0..4 {
        for _ in 0..50 {
            ts += 1;
            c.on_alloc(SiteId(99), 1, ts, 0);
        }
        ts += 1;
        c.on_alloc(anchor, 1, ts, 0);
    }
    assert_ne!(c.anchor(), Some(anchor));
}

/// 3 to 7 temporaries at one site, then one output: the output's gap varies from 4 to 8
/// allocations (CV > 0.1), but the set of sites between two outputs is always the same.
#[test]
fn an_irregular_iteration_locks_on_its_structure() {
    let mut c = EpochClock::default();
    let mut x: u64 = 7;
    let mut ts = 1;
    let mut per_iter = Vec::new();
    for _ in 0..40 {
        let mut b = 0;
        for _ in 0..3 + xorshift(&mut x) % 5 {
            ts += 10;
            b += u32::from(c.on_alloc(SiteId(1), 1, ts, 0));
        }
        ts += 10;
        b += u32::from(c.on_alloc(SiteId(2), 1, ts, 0));
        per_iter.push(b);
    }
    assert_eq!((c.source, c.anchor()), (EpochSource::Auto, Some(SiteId(2))));
    assert!(per_iter[6..].iter().all(|&b| b == 1), "{per_iter:?}");
    assert!(c.stable_since <= 7, "{}", c.stable_since);
}

/// One allocation per step: paced steps (2 ms apart) are steps; a tight loop of the same
/// allocations (2 µs apart: an initialization) is not.
#[test]
fn one_allocation_per_step_is_a_step_only_at_a_step_pace() {
    for (gap, steps) in [(2_000_000u64, true), (2_000, false)] {
        let mut c = EpochClock::default();
        let mut ts = 1;
        let mut x: u64 = 3;
        for i in 0..80 {
            // ±5 % jitter, and one stall of the thread (a loaded machine) at step 40.
            ts += gap - gap / 20 + xorshift(&mut x) % (gap / 10);
            if i == 40 {
                ts += 10 * gap;
            }
            c.on_alloc(SiteId(1), 1, ts, 0);
        }
        if steps {
            assert_eq!(c.anchor_kind(), Some(AnchorKind::Paced));
            assert_eq!(c.stable_since, 1, "locked once, never dropped");
            assert!(c.epoch >= 70, "{}", c.epoch);
            assert!(c.confidence() > 0.5, "{}", c.confidence());
        } else {
            assert_eq!((c.source, c.epoch), (EpochSource::None, 0));
        }
    }
}

/// Eight threads with their own loops, interleaved at random: each thread's iteration is
/// followed on its own thread, so one of them anchors; the shared temporary site is never
/// one (on each thread it is period 1, microseconds apart).
#[test]
fn threads_with_their_own_loops_anchor_on_one_of_them() {
    let mut c = EpochClock::default();
    let mut x: u64 = 11;
    let mut next = [0u32; 8];
    let mut ts = 1;
    for _ in 0..8 * 4 * 60 {
        let t = (xorshift(&mut x) % 8) as usize;
        ts += 1000;
        // Thread t: 3 temporaries then its output; thread 3's output leaks.
        let site = if next[t] < 3 { SiteId(1) } else { SiteId(2) };
        next[t] = (next[t] + 1) % 4;
        c.on_alloc(site, t as u32, ts, 0);
    }
    assert_eq!((c.source, c.anchor()), (EpochSource::Auto, Some(SiteId(2))));
    assert!(c.epoch >= 40, "{}", c.epoch);
}

/// A forward pass of 8 layers with two sites each: each layer site sees the other one
/// between most of its allocations, as an iteration's anchor would, but allocates while
/// activations pile up; the iteration starts at the trough.
#[test]
fn a_layer_loop_of_two_sites_is_not_the_iteration() {
    let mut c = EpochClock::default();
    let mut ts = 1;
    for _ in 0..30 {
        let mut live = 100;
        for site in [
            14, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 12,
        ] {
            ts += 10;
            c.on_alloc(SiteId(site), 1, ts, live);
            live += 4;
        }
    }
    assert_eq!(c.anchor(), Some(SiteId(14)));
    assert_eq!(c.period_allocs(), Some(18.0));
}

/// An output kept every third step (at the trough, like the step's first allocation):
/// the step's own sites still anchor, not the every-third-step one.
#[test]
fn a_site_in_every_third_step_does_not_make_steps_three_times_longer() {
    let mut c = EpochClock::default();
    let mut ts = 1;
    for step in 0..40 {
        let mut sites = vec![(14, 100), (20, 104), (20, 108), (20, 112), (12, 150)];
        if step % 3 == 0 {
            sites.push((30, 100));
        }
        for (site, live) in sites {
            ts += 10;
            c.on_alloc(SiteId(site), 1, ts, live);
        }
    }
    assert_eq!(c.anchor(), Some(SiteId(14)));
    assert!(c.period_allocs().unwrap() < 6.0, "{:?}", c.period_allocs());
}

/// Train then eval: the training anchor goes silent, the eval loop's anchor takes over.
#[test]
fn a_phase_change_relocks_on_the_new_loop() {
    let mut c = EpochClock::default();
    let mut ts = 1;
    for _ in 0..20 {
        iteration(&mut c, &mut ts);
    }
    let train = c.anchor().unwrap();
    let since = c.stable_since;
    let mut per_iter = Vec::new();
    for _ in 0..30 {
        let mut b = 0;
        for s in [20, 21, 21, 22] {
            ts += 10;
            b += u32::from(c.on_alloc(SiteId(s), 1, ts, 0));
        }
        per_iter.push(b);
    }
    assert_eq!(c.source, EpochSource::Auto);
    assert_ne!(c.anchor(), Some(train));
    assert!(c.stable_since > since);
    assert!(per_iter[12..].iter().all(|&b| b == 1), "{per_iter:?}");
}

/// The same stream gives the same boundaries (the live collector and a replay agree).
#[test]
fn boundaries_are_a_function_of_the_stream() {
    let run = || {
        let mut c = EpochClock::default();
        let mut x: u64 = 5;
        (0..5000u64)
            .filter(|&i| {
                let site = SiteId((xorshift(&mut x) % 7) as u32 + 1);
                c.on_alloc(site, (i % 3) as u32, 1 + i * 300_000, i % 11)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

/// A loop whose iterations alternate between two branches (`if i % 2: ...`): the sanity rule
/// (a cycle anchor) makes one step per iteration, not one per two; the loop's head anchors it.
#[test]
fn a_loop_whose_iterations_alternate_is_one_step_per_iteration() {
    let mut clock = EpochClock::default();
    let mut ts = 0u64;
    let mut boundaries = 0u32;
    let iterations = 120u32;
    for i in 0..iterations {
        let branch: &[u32] = if i % 2 == 1 { &[6, 7] } else { &[8] };
        for &s in [1u32, 2, 3, 4, 5].iter().chain(branch) {
            ts += 1_000;
            boundaries += u32::from(clock.on_alloc(SiteId(s), 1, ts, 0));
        }
    }
    let after_warmup = iterations - clock.stable_since;
    assert!(
        boundaries >= iterations - 12 && after_warmup >= iterations - 12,
        "{boundaries} boundaries for {iterations} iterations (stable since {})",
        clock.stable_since
    );
    assert!(
        matches!(clock.anchor_kind(), Some(AnchorKind::Cycle { len: 2, .. })),
        "{:?}",
        clock.anchor_kind()
    );
}

/// A site of an inner loop of two layers alternates between the layer's few sites and the
/// rest of the iteration: its cycle is unbalanced, so it is no anchor and a step stays one
/// iteration (not two), with the loop's head as the structural anchor.
#[test]
fn a_two_layer_inner_loop_does_not_halve_the_steps() {
    let mut clock = EpochClock::default();
    let mut ts = 0u64;
    let mut boundaries = 0u32;
    let iterations = 120u32;
    for _ in 0..iterations {
        for &s in &[1u32, 10, 11, 10, 11, 12, 13, 14] {
            ts += 1_000;
            boundaries += u32::from(clock.on_alloc(SiteId(s), 1, ts, 0));
        }
    }
    assert!(
        boundaries <= iterations && boundaries >= iterations - 12,
        "{boundaries} boundaries for {iterations} iterations"
    );
    assert!(
        matches!(clock.anchor_kind(), Some(AnchorKind::Structural(_))),
        "{:?}",
        clock.anchor_kind()
    );
}

/// The pace test's shortcut (fewer than half the gaps at the minimum pace: no sort) says what
/// the median says, for gaps around the minimum and far from it.
#[test]
fn the_pace_shortcut_agrees_with_the_median() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let around = PACED_MIN_NS as u64;
    for _ in 0..20_000 {
        let mut c = Candidate {
            n: RING as u64,
            ..Default::default()
        };
        for g in &mut c.time_gaps {
            *g = match xorshift(&mut x) % 4 {
                0 => around,
                1 => around - 1,
                2 => xorshift(&mut x) % (3 * around),
                _ => xorshift(&mut x) % 5_000,
            };
        }
        for g in &mut c.local_gaps {
            *g = xorshift(&mut x) % 3;
        }
        let (m, g, n) = c.pace();
        let per_step = c.local_gaps.iter().sum::<u64>() as f64 / RING as f64;
        let off = g[..n]
            .iter()
            .filter(|&&v| (v - m).abs() > PACED_TOLERANCE * m)
            .count();
        let by_median = m >= PACED_MIN_NS && off <= PACED_OUTLIERS && per_step <= PACED_MAX_ALLOCS;
        assert_eq!(c.paced(), by_median, "{:?}", c.time_gaps);
    }
}
