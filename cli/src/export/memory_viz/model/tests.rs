//! Unit tests of the memory_viz snapshot model (`model.rs`).

use super::*;

const S: Site = Site::NONE;

/// The actions of device 0 as the snapshot writes them (whole-segment blocks of segments
/// that held tensors left out).
fn actions(m: &Model) -> Vec<(&'static str, u64, u64)> {
    actions_on(m, 0)
}

fn actions_on(m: &Model, d: i16) -> Vec<(&'static str, u64, u64)> {
    m.entries(d)
        .map(|e| (e.action.name(), e.addr, e.size))
        .collect()
}

type Layout = Vec<(u64, u64, bool, Vec<(u64, u64, &'static str)>)>;

fn layout(m: &Model) -> Layout {
    let mut out = Vec::new();
    m.each_segment(|s| {
        let blocks = s.blocks.iter().map(|b| (b.addr, b.size, b.state)).collect();
        out.push((s.addr, s.size, s.expandable, blocks));
    });
    out
}

#[test]
fn tensor_blocks_replace_the_whole_segment_block() {
    let mut m = Model::default();
    m.driver_alloc(0, 0x1000, 1, Seg::new(SegKind::Driver, 0x4000, 0, S, S));
    m.tensor_alloc(0, 0x1000, 0x1000, 0, 2, S);
    m.tensor_alloc(0, 0x2800, 0x800, 0, 3, S);
    assert_eq!(
        layout(&m),
        vec![(
            0x1000,
            0x4000,
            false,
            vec![
                (0x1000, 0x1000, "active_allocated"),
                (0x2000, 0x800, "inactive"),
                (0x2800, 0x800, "active_allocated"),
                (0x3000, 0x2000, "inactive"),
            ]
        )]
    );
    // Freeing the segment frees what is still inside it first.
    m.release_segment(0, 0x1000, 4);
    assert!(layout(&m).is_empty());
    assert_eq!(
        actions(&m),
        vec![
            ("segment_alloc", 0x1000, 0x4000),
            ("alloc", 0x1000, 0x1000),
            ("alloc", 0x2800, 0x800),
            ("free_requested", 0x2800, 0x800),
            ("free_completed", 0x2800, 0x800),
            ("free_requested", 0x1000, 0x1000),
            ("free_completed", 0x1000, 0x1000),
            ("segment_free", 0x1000, 0x4000),
        ]
    );
}

#[test]
fn a_tensor_outside_every_segment_gets_its_own() {
    let mut m = Model::default();
    m.tensor_alloc(0, 0x10_0000, 0x200, 7, 1, S);
    assert_eq!(
        layout(&m),
        vec![(
            0x10_0000,
            0x200,
            false,
            vec![(0x10_0000, 0x200, "active_allocated")]
        )]
    );
    // A block at the same address again: the first one's free was lost.
    m.tensor_alloc(0, 0x10_0000, 0x100, 7, 2, S);
    m.free_block(0, 0x10_0000, 3);
    assert_eq!(
        actions(&m),
        vec![
            ("segment_alloc", 0x10_0000, 0x200),
            ("alloc", 0x10_0000, 0x200),
            ("free_requested", 0x10_0000, 0x200),
            ("free_completed", 0x10_0000, 0x200),
            ("segment_free", 0x10_0000, 0x200),
            ("segment_alloc", 0x10_0000, 0x100),
            ("alloc", 0x10_0000, 0x100),
            ("free_requested", 0x10_0000, 0x100),
            ("free_completed", 0x10_0000, 0x100),
            ("segment_free", 0x10_0000, 0x100),
        ]
    );
}

#[test]
fn adjacent_mappings_form_one_expandable_segment() {
    let mut m = Model::default();
    m.driver_alloc(0, 0x20_0000, 1, Seg::new(SegKind::Mapping, 0x1000, 0, S, S));
    m.driver_alloc(0, 0x20_1000, 2, Seg::new(SegKind::Mapping, 0x1000, 0, S, S));
    m.driver_alloc(0, 0x20_2000, 3, Seg::new(SegKind::Mapping, 0x1000, 0, S, S));
    // A tensor spanning the first two pages; the third keeps its whole-mapping block.
    m.tensor_alloc(0, 0x20_0800, 0x1000, 0, 4, S);
    assert_eq!(
        layout(&m),
        vec![(
            0x20_0000,
            0x3000,
            true,
            vec![
                (0x20_0000, 0x800, "inactive"),
                (0x20_0800, 0x1000, "active_allocated"),
                (0x20_1800, 0x800, "inactive"),
                (0x20_2000, 0x1000, "active_allocated"),
            ]
        )]
    );
    let a = actions(&m);
    assert_eq!(a.iter().filter(|x| x.0 == "segment_map").count(), 3);
    assert_eq!(a.iter().filter(|x| x.0 == "alloc").count(), 2, "{a:?}");
}

#[test]
fn the_ring_keeps_the_most_recent_entries() {
    let mut m = Model::new(4);
    m.driver_alloc(0, 0x1000, 1, Seg::new(SegKind::Driver, 0x4000, 0, S, S));
    m.driver_alloc(0, 0x9000, 2, Seg::new(SegKind::Driver, 0x1000, 0, S, S));
    m.release_segment(0, 0x9000, 3);
    // A tensor in the first segment after its whole-segment block's entry left the ring.
    m.tensor_alloc(0, 0x1000, 0x800, 0, 4, S);
    assert_eq!(
        actions(&m),
        vec![
            ("free_requested", 0x9000, 0x1000),
            ("free_completed", 0x9000, 0x1000),
            ("segment_free", 0x9000, 0x1000),
            ("alloc", 0x1000, 0x800),
        ]
    );
    assert_eq!(m.dropped(0), 4);
    assert_eq!(m.devs[&0].trace.len(), 4);
    // The final state does not depend on the ring.
    assert_eq!(
        layout(&m),
        vec![(
            0x1000,
            0x4000,
            false,
            vec![
                (0x1000, 0x800, "active_allocated"),
                (0x1800, 0x3800, "inactive"),
            ]
        )]
    );
    // While its entry is still in the ring, a whole-segment block is hidden there.
    let mut m = Model::new(8);
    m.driver_alloc(0, 0x1000, 1, Seg::new(SegKind::Driver, 0x4000, 0, S, S));
    m.tensor_alloc(0, 0x1000, 0x800, 0, 2, S);
    assert_eq!(
        actions(&m),
        vec![("segment_alloc", 0x1000, 0x4000), ("alloc", 0x1000, 0x800)]
    );
    assert_eq!(m.dropped(0), 0);
}

// The model fed events, as a replay feeds it: what it shows and what it leaves out.

/// The process state the model asks about, set by each test.
#[derive(Default)]
struct Cx {
    last_free: HashMap<i16, u64>,
    handles: HashMap<u64, (i16, Site)>,
}

impl Context for Cx {
    fn last_free(&self, device: i16) -> Option<u64> {
        self.last_free.get(&device).copied()
    }

    fn handle(&self, handle: u64) -> Option<(i16, Site)> {
        self.handles.get(&handle).copied()
    }
}

/// An event of `kind` by `api` on `device`: `ptr`, `size`, at time `ts` (ns).
fn ev(kind: EventKind, api: Api, device: i16, ptr: u64, size: u64, ts: u64) -> Event {
    let mut e = Event::new(kind, api);
    e.device = device;
    e.ptr = ptr;
    e.size = size;
    e.ts_ns = ts;
    e
}

/// Feeds `e` (without a call site) to `m`.
fn step(m: &mut Model, cx: &Cx, e: Event) {
    m.on_event(cx, &e, S);
}

fn site(n: u32) -> Site {
    Site::from_number(n)
}

#[test]
fn a_driver_allocation_is_a_segment_and_one_block() {
    let cx = Cx::default();
    let mut m = Model::new(0);
    let mut alloc = ev(EventKind::Alloc, Api::cudaMalloc, 0, 0x1000, 0x2000, 10);
    alloc.aux = 0x77; // the stream
    m.on_event(&cx, &alloc, site(3));
    assert_eq!(
        layout(&m),
        vec![(
            0x1000,
            0x2000,
            false,
            vec![(0x1000, 0x2000, "active_allocated")]
        )]
    );
    // The free comes from another site, without a device: found by its address.
    let free = ev(EventKind::Free, Api::cudaFree, -1, 0x1000, 0, 20);
    m.on_event(&cx, &free, site(4));
    assert_eq!(
        actions(&m),
        vec![
            ("segment_alloc", 0x1000, 0x2000),
            ("alloc", 0x1000, 0x2000),
            ("free_requested", 0x1000, 0x2000),
            ("free_completed", 0x1000, 0x2000),
            ("segment_free", 0x1000, 0x2000),
        ]
    );
    // Every entry carries the allocation's stream and frames, and its event's time.
    let e: Vec<&Entry> = m.entries(0).collect();
    assert!(e.iter().all(|e| e.stream == 0x77 && e.site == site(3)));
    assert_eq!(
        e.iter().map(|e| e.ts_ns).collect::<Vec<_>>(),
        [10, 10, 20, 20, 20]
    );
    assert!(layout(&m).is_empty());
    assert_eq!(m.device_count(), 1);
}

#[test]
fn what_is_not_device_memory_is_left_out() {
    let cx = Cx::default();
    let mut m = Model::new(0);
    let events = [
        // Pinned host memory, on device -1 or on a GPU.
        ev(EventKind::Alloc, Api::cudaMallocHost, -1, 0x1000, 0x100, 1),
        ev(EventKind::Alloc, Api::cudaMallocHost, 0, 0x2000, 0x100, 2),
        // Nothing allocated: 0 bytes, or a null pointer.
        ev(EventKind::Alloc, Api::cudaMalloc, 0, 0x3000, 0, 3),
        ev(EventKind::Alloc, Api::cudaMalloc, 0, 0, 0x100, 4),
        // Frees of addresses the model never saw.
        ev(EventKind::Free, Api::cudaFree, 0, 0x4000, 0x100, 5),
        ev(EventKind::Free, Api::oomtrace_free, 0, 0x5000, 0, 6),
        // A failure that is not out-of-memory.
        ev(EventKind::AllocFailed, Api::cudaMalloc, 0, 0, 0x100, 7),
        // An unmap of nothing, a reading nobody waits for.
        ev(EventKind::Unmap, Api::cuMemUnmap, 0, 0x6000, 0x100, 8),
        ev(EventKind::MemInfo, Api::cuMemGetInfo_v2, 0, 5, 10, 9),
    ];
    let mut events = events.to_vec();
    events[6].result = 1;
    for e in &events {
        m.on_event(&cx, e, site(1));
    }
    assert_eq!(m.device_count(), 0);
    assert!(layout(&m).is_empty());
    assert_eq!(m.dropped_entries(), 0);
}

#[test]
fn an_address_allocated_again_frees_its_previous_segment() {
    let cx = Cx::default();
    let mut m = Model::new(0);
    step(
        &mut m,
        &cx,
        ev(EventKind::Alloc, Api::cudaMalloc, 0, 0x1000, 0x400, 1),
    );
    // The free of the first allocation was lost; the address is handed out again.
    step(
        &mut m,
        &cx,
        ev(EventKind::Alloc, Api::cudaMalloc, 0, 0x1000, 0x800, 2),
    );
    assert_eq!(
        actions(&m),
        vec![
            ("segment_alloc", 0x1000, 0x400),
            ("alloc", 0x1000, 0x400),
            ("free_requested", 0x1000, 0x400),
            ("free_completed", 0x1000, 0x400),
            ("segment_free", 0x1000, 0x400),
            ("segment_alloc", 0x1000, 0x800),
            ("alloc", 0x1000, 0x800),
        ]
    );
    assert_eq!(
        layout(&m),
        vec![(
            0x1000,
            0x800,
            false,
            vec![(0x1000, 0x800, "active_allocated")]
        )]
    );
}

#[test]
fn tensors_in_a_driver_segment_are_its_blocks() {
    // The swapped allocator's tensors, and the trace tracker's on PyTorch's own.
    tensors_in_a_driver_segment(Api::oomtrace_malloc, Api::oomtrace_free);
    tensors_in_a_driver_segment(Api::oomtrace_torch_alloc, Api::oomtrace_torch_free);
}

fn tensors_in_a_driver_segment(alloc: Api, free: Api) {
    let cx = Cx::default();
    let mut m = Model::new(0);
    let (seg, t) = (0x10_0000, 0x4000);
    step(
        &mut m,
        &cx,
        ev(EventKind::Alloc, Api::cudaMalloc, 0, seg, 0x1_0000, 1),
    );
    step(&mut m, &cx, ev(EventKind::Alloc, alloc, 0, seg, t, 2));
    step(&mut m, &cx, ev(EventKind::Free, free, 0, seg, 0, 3));
    // The segment stays, cached and empty: one inactive block.
    assert_eq!(
        layout(&m),
        vec![(seg, 0x1_0000, false, vec![(seg, 0x1_0000, "inactive")])]
    );
    // A second free of the tensor frees nothing; the segment's own free does.
    step(&mut m, &cx, ev(EventKind::Free, free, 0, seg, 0, 4));
    step(
        &mut m,
        &cx,
        ev(EventKind::Free, Api::cudaFree, 0, seg, 0, 5),
    );
    assert_eq!(
        actions(&m),
        vec![
            ("segment_alloc", seg, 0x1_0000),
            ("alloc", seg, t),
            ("free_requested", seg, t),
            ("free_completed", seg, t),
            ("segment_free", seg, 0x1_0000),
        ]
    );
    assert!(layout(&m).is_empty());
}

#[test]
fn an_oom_takes_the_driver_reading_that_follows_it() {
    let mut cx = Cx::default();
    cx.last_free.insert(0, 500);
    let mut m = Model::new(0);
    let mut oom = ev(EventKind::AllocFailed, Api::cudaMalloc, 0, 0, 1000, 1);
    oom.result = OUT_OF_MEMORY;
    oom.tid = 7;
    m.on_event(&cx, &oom, site(2));
    // Another thread's reading is not this failure's.
    let mut other = ev(EventKind::MemInfo, Api::cuMemGetInfo_v2, 0, 111, 4000, 2);
    other.tid = 8;
    m.on_event(&cx, &other, S);
    let free = |m: &Model| m.entries(0).map(|e| e.device_free).collect::<Vec<_>>();
    assert_eq!(free(&m), [500], "until a reading follows, the last one");
    let mut reading = ev(EventKind::MemInfo, Api::cuMemGetInfo_v2, 0, 123, 4000, 3);
    reading.tid = 7;
    m.on_event(&cx, &reading, S);
    assert_eq!(free(&m), [123]);
    // Only the first reading after the failure counts.
    reading.ptr = 999;
    m.on_event(&cx, &reading, S);
    assert_eq!(free(&m), [123]);
    let e = m.entries(0).next().unwrap();
    assert_eq!(
        (e.action, e.addr, e.size, e.site),
        (Action::Oom, 0, 1000, site(2))
    );
    assert!(layout(&m).is_empty());
}

#[test]
fn a_vmm_mapping_is_a_segment_on_its_handles_device() {
    let mut cx = Cx::default();
    let handle = 0xabc;
    cx.handles.insert(handle, (1, site(5)));
    let mut m = Model::new(0);
    let (va, size) = (0x20_0000, 0x20_0000);
    let mut map = ev(EventKind::Map, Api::cuMemMap, -1, va, size, 1);
    map.aux = handle;
    m.on_event(&cx, &map, site(9));
    // A mapping of a handle the trace never saw, on no device: left out.
    let mut stray = ev(EventKind::Map, Api::cuMemMap, -1, 0x80_0000, size, 2);
    stray.aux = 0xdef;
    m.on_event(&cx, &stray, site(9));
    assert_eq!(m.device_count(), 2, "device 0 listed, empty");
    assert!(actions_on(&m, 0).is_empty());
    assert_eq!(
        layout(&m),
        vec![(va, size, true, vec![(va, size, "active_allocated")])]
    );
    let sites: Vec<Site> = m.entries(1).map(|e| e.site).collect();
    assert_eq!(
        sites,
        [site(9), site(5)],
        "segment: the map call; block: the handle's"
    );
    step(
        &mut m,
        &cx,
        ev(EventKind::Unmap, Api::cuMemUnmap, -1, va, size, 3),
    );
    assert_eq!(
        actions_on(&m, 1),
        vec![
            ("segment_map", va, size),
            ("alloc", va, size),
            ("free_requested", va, size),
            ("free_completed", va, size),
            ("segment_unmap", va, size),
        ]
    );
    assert!(layout(&m).is_empty());
}
