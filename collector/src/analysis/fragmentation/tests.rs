use super::{FragSource, RATIO};
use crate::analysis::{Analysis, Detector, Evidence, Finding, Kind, Level, Severity};
use crate::model::{Process, OUT_OF_MEMORY};
use oomtrace_proto::wire::{Frame, Hello};
use oomtrace_proto::{Api, Event, EventKind, StackId};

/// A process and its analysis.
struct Proc {
    p: Process,
    a: Analysis,
}

impl Proc {
    fn new() -> Proc {
        Proc {
            p: Process::new(1, Hello::default()),
            a: Analysis::default(),
        }
    }
    fn apply_event(&mut self, e: &Event) {
        self.p.apply_event(e, &mut self.a);
    }
    fn apply(&mut self, f: &Frame<'_>) {
        self.p.apply(f, &mut self.a);
    }
}

const MIB: u64 = 1 << 20;

fn ev(kind: EventKind, api: Api, ptr: u64, size: u64, ts: u64) -> Event {
    let mut e = Event::new(kind, api);
    e.ptr = ptr;
    e.size = size;
    e.device = 0;
    e.ts_ns = ts;
    e
}

fn mark(p: &mut Proc, ts: u64) {
    p.apply(&Frame::Marker {
        seq: 0,
        ts_ns: ts,
        tid: 0,
        stack: StackId(0),
        label: "step".into(),
    });
}

fn frag(p: &Proc) -> Vec<Finding> {
    p.a.fragmentation.findings(&p.a.context(&p.p))
}

/// 20 steps: a 4 MiB cudaMalloc every step that is never freed (a segment of PyTorch's
/// allocator when `segment`, else an extension's own buffer), while tensors (`alloc` /
/// `free` APIs) come and go at a flat 8 MiB.
fn creeping(segment: bool, alloc: Api, free: Api) -> Vec<Finding> {
    let mut p = Proc::new();
    let mut ts = 1;
    for step in 0..20u64 {
        ts += 10;
        let base = 0x1000_0000 + step * 0x100_0000;
        p.apply_event(&ev(EventKind::Alloc, Api::cudaMalloc, base, 4 * MIB, ts));
        if segment {
            let seg = ev(
                EventKind::Segment,
                Api::oomtrace_torch_segment,
                base,
                4 * MIB,
                ts,
            );
            p.apply_event(&seg);
        }
        ts += 10;
        p.apply_event(&ev(EventKind::Alloc, alloc, 0x9000_0000, 8 * MIB, ts));
        ts += 10;
        p.apply_event(&ev(EventKind::Free, free, 0x9000_0000, 0, ts));
        mark(&mut p, ts + 5);
    }
    frag(&p)
}

#[test]
fn reserved_creeping_while_tensors_stay_flat_is_fragmentation() {
    let f = creeping(true, Api::oomtrace_torch_alloc, Api::oomtrace_torch_free);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].message.contains("for 8.00 MiB of tensors at peak"),
        "{}",
        f[0].message
    );
    assert!(f[0].growth_bytes_per_step.unwrap() >= 3.9 * MIB as f64);
}

/// 24 steps of a working set that grows: each step one tensor `step` x 4 MiB, freed by the
/// step's end, in a new segment of its size (the cache's free blocks are all smaller).
/// With `reserve_follows`, the cache gives back the old segment each step (the reserve
/// tracks the tensors: no gap).
fn growing_working_set(reserve_follows: bool) -> Vec<Finding> {
    growing_then_flat(reserve_follows, 0).0
}

/// [`growing_working_set`], then `flat` steps whose tensor is the last one's size (it fits
/// the cached segment: the reserve and the gap hold). Also the live alerts.
fn growing_then_flat(
    reserve_follows: bool,
    flat: u64,
) -> (Vec<Finding>, Vec<crate::analysis::Alert>) {
    let mut p = Proc::new();
    let mut ts = 1;
    let mut prev_seg = None;
    for step in 1..=24u64 {
        let size = step * 4 * MIB;
        let base = 0x1_0000_0000 + step * 0x1000_0000;
        ts += 10;
        if let (true, Some((b, sz))) = (reserve_follows, prev_seg) {
            let free = ev(
                EventKind::SegmentFree,
                Api::oomtrace_torch_segment,
                b,
                sz,
                ts,
            );
            p.apply_event(&free);
            p.apply_event(&ev(EventKind::Free, Api::cudaFree, b, 0, ts));
        }
        p.apply_event(&ev(EventKind::Alloc, Api::cudaMalloc, base, size, ts));
        let seg = ev(
            EventKind::Segment,
            Api::oomtrace_torch_segment,
            base,
            size,
            ts,
        );
        p.apply_event(&seg);
        prev_seg = Some((base, size));
        ts += 10;
        p.apply_event(&ev(
            EventKind::Alloc,
            Api::oomtrace_torch_alloc,
            base,
            size,
            ts,
        ));
        ts += 10;
        p.apply_event(&ev(EventKind::Free, Api::oomtrace_torch_free, base, 0, ts));
        mark(&mut p, ts + 5);
    }
    let (base, size) = prev_seg.unwrap();
    for _ in 0..flat {
        ts += 20;
        p.apply_event(&ev(
            EventKind::Alloc,
            Api::oomtrace_torch_alloc,
            base,
            size,
            ts,
        ));
        ts += 10;
        p.apply_event(&ev(EventKind::Free, Api::oomtrace_torch_free, base, 0, ts));
        mark(&mut p, ts + 5);
    }
    (frag(&p), p.a.alerts.list.clone())
}

/// A cache that grew while the program warmed up, then held for 30 steps: the finding says
/// the gap grew until its widest step and has held since, never that it grows; said live once.
#[test]
fn a_gap_that_stops_growing_says_so() {
    let (f, alerts) = growing_then_flat(false, 30);
    assert_eq!(f.len(), 1, "{f:?}");
    let Some(Evidence::Fragmentation(e)) = &f[0].evidence else {
        panic!("{f:?}")
    };
    assert!(e.settled_step.is_some(), "{e:?}");
    assert!(
        f[0].message.contains("and has held since") && !f[0].message.contains("the gap grows"),
        "{}",
        f[0].message
    );
    let said = alerts
        .iter()
        .filter(|a| a.finding.kind == Kind::Fragmentation)
        .count();
    assert_eq!(said, 1);
}

#[test]
fn a_gap_growing_while_tensors_grow_too_is_fragmentation() {
    let f = growing_working_set(false);
    assert_eq!(f.len(), 1, "{f:?}");
    let Some(Evidence::Fragmentation(e)) = &f[0].evidence else {
        panic!("{f:?}")
    };
    assert_eq!(e.source, Some(FragSource::Tensors));
    // The gap is the sum of the old segments: it grows faster than the tensors.
    assert!(
        e.gap_slope_bytes_per_step.unwrap() > 4.0 * MIB as f64,
        "{e:?}"
    );
    assert!(e.reserved_to_allocated.unwrap() > RATIO, "{e:?}");
    let pat = e.pattern.as_ref().unwrap();
    assert!(pat.sizes_growing, "{pat:?}");
    assert!(pat.segments_taken_with_room >= 20, "{pat:?}");
    assert_eq!(e.grew_at.len(), 1, "one site took the segments");
    assert!(e.remedies[0].alloc_conf.starts_with("expandable_segments"));
    assert!(e.onset_s.is_some() && e.detected_s.is_some(), "{e:?}");
    assert!(f[0].hint.starts_with("Not a leak"), "{}", f[0].hint);
}

#[test]
fn a_reserve_that_follows_its_tensors_is_not_fragmentation() {
    let f = growing_working_set(true);
    assert!(f.is_empty(), "{f:?}");
}

/// Without tensors traced, the step hook's readings of PyTorch's counters.
#[test]
fn step_readings_show_the_gap_without_tensors() {
    let run = |reserved_per_step: u64| {
        let mut p = Proc::new();
        let mut ts = 1;
        for step in 1..=20u64 {
            ts += 10;
            mark(&mut p, ts);
            p.a.fragmentation
                .on_reading(0, MIB, step * 4 * MIB, step * reserved_per_step * MIB);
        }
        frag(&p)
    };
    let f = run(40);
    assert_eq!(f.len(), 1, "{f:?}");
    let Some(Evidence::Fragmentation(e)) = &f[0].evidence else {
        panic!("{f:?}")
    };
    assert_eq!(e.source, Some(FragSource::StepReadings));
    assert!(
        f[0].message.contains("max_memory_allocated()"),
        "{}",
        f[0].message
    );
    // A reserve that keeps 1.25x of the peak: a cache's slack, not fragmentation.
    assert!(run(5).is_empty());
}

/// Memory outside the tensor allocator (an extension's own cudaMalloc) is not reserve,
/// with the tracker (which reports the allocator's segments) or the swapped allocator
/// (which has none to report).
#[test]
fn memory_outside_the_allocator_is_not_reserve() {
    let tracker = creeping(false, Api::oomtrace_torch_alloc, Api::oomtrace_torch_free);
    assert!(tracker.is_empty(), "{tracker:?}");
    let swap = creeping(false, Api::oomtrace_malloc, Api::oomtrace_free);
    assert!(swap.is_empty(), "{swap:?}");
}

#[test]
fn a_failure_with_enough_free_memory_is_fragmentation() {
    let mut p = Proc::new();
    let mut fail = ev(EventKind::AllocFailed, Api::cudaMalloc, 0, 64 * MIB, 10);
    fail.result = OUT_OF_MEMORY;
    fail.tid = 3;
    p.apply_event(&fail);
    let mut info = ev(
        EventKind::MemInfo,
        Api::cuMemGetInfo_v2,
        100 * MIB,
        1024 * MIB,
        11,
    );
    info.tid = 3;
    p.apply_event(&info);
    let f = frag(&p);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].level, Level::Severity(Severity::Error));
    assert!(f[0].message.contains("free"), "{}", f[0].message);
    // Without a retry it stays an OOM error too.
    let oom = p.a.oom.findings(&p.a.context(&p.p));
    assert_eq!(oom[0].level, Level::Severity(Severity::Error));
    assert!(oom[0].hint.contains("not in one piece"));
}

#[test]
fn a_failure_without_enough_free_memory_is_not_fragmentation() {
    let mut p = Proc::new();
    let mut fail = ev(EventKind::AllocFailed, Api::cudaMalloc, 0, 64 * MIB, 10);
    fail.result = OUT_OF_MEMORY;
    p.apply_event(&fail);
    p.apply_event(&ev(
        EventKind::MemInfo,
        Api::cuMemGetInfo_v2,
        10 * MIB,
        1024 * MIB,
        11,
    ));
    assert!(frag(&p).is_empty());
}
