//! The model's unit tests: accounting, call-site identity, peaks and steps.

use oomtrace_proto::python::PyFrame;
use oomtrace_proto::wire::{Frame, ModuleDef};
use oomtrace_proto::{Event, EventKind, StackId};

use super::*;

fn ev(kind: EventKind, api: Api, ptr: u64, size: u64) -> Event {
    let mut e = Event::new(kind, api);
    e.ptr = ptr;
    e.size = size;
    e.device = 0;
    e
}

fn proc() -> Process {
    Process::new(1, Hello::default())
}

#[test]
fn a_rank_learnt_after_the_hello_replaces_the_launchers() {
    let vars = |l: &[(&str, &str)]| -> Vec<(String, String)> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut p = Process::new(
        1,
        Hello {
            launch: vars(&[("RANK", "0"), ("WORLD_SIZE", "4")]),
            ..Hello::default()
        },
    );
    assert_eq!(p.launch.rank, Some(0));
    p.apply(
        &Frame::Launch(vars(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("NOT_A_LAUNCHER", "x"),
        ])),
        &mut (),
    );
    assert_eq!(
        (p.launch.rank, p.launch.local_rank, p.launch.world_size),
        (Some(3), Some(1), Some(4))
    );
    // Only names the shim records are kept: a stream cannot grow the list.
    assert_eq!(p.hello.launch.len(), 3);
}

/// The tracker's tensors share addresses with the segment that holds them and are not
/// counted twice; the reserve is the allocator's own segments, not other CUDA memory.
#[test]
fn tracker_tensors_live_inside_segments_without_double_counting() {
    let mut p = proc();
    let (tensor_site, _) = two_sites(&mut p);
    let seg = 0x7000_0000;
    p.apply_event(
        &ev(EventKind::Alloc, Api::cudaMalloc, seg, 20 << 20),
        &mut (),
    );
    p.apply_event(
        &ev(
            EventKind::Segment,
            Api::oomtrace_torch_segment,
            seg,
            20 << 20,
        ),
        &mut (),
    );
    // An extension's own cudaMalloc: device memory, not the allocator's reserve.
    p.apply_event(
        &ev(EventKind::Alloc, Api::cudaMalloc, 0x9000_0000, 8 << 20),
        &mut (),
    );
    let tensor = |p: &mut Process, kind, ptr, size| {
        let api = if kind == EventKind::Alloc {
            Api::oomtrace_torch_alloc
        } else {
            Api::oomtrace_torch_free
        };
        let mut e = ev(kind, api, ptr, size);
        e.stack = StackId(1);
        p.apply_event(&e, &mut ());
    };
    tensor(&mut p, EventKind::Alloc, seg, 4 << 20);
    tensor(&mut p, EventKind::Alloc, seg + (4 << 20), 2 << 20);
    let d = &p.devices[&0];
    assert_eq!((d.live_bytes, d.live_count), (28 << 20, 2));
    assert_eq!((d.tensor_bytes, d.tensor_count), (6 << 20, 2));
    assert_eq!(d.torch_reserved_bytes, Some(20 << 20));
    assert_eq!(p.live[&seg].size, 20 << 20, "the segment is still live");
    tensor(&mut p, EventKind::Free, seg, 0);
    assert_eq!(p.devices[&0].tensor_bytes, 2 << 20);
    assert_eq!(p.devices[&0].tensor_peak_bytes, 6 << 20);
    assert_eq!(p.devices[&0].live_bytes, 28 << 20);
    assert_eq!(p.unmatched_frees, 0);
    // The tensors' own tally, apart from the CUDA allocations': two made, one freed, who
    // held their peak, and the segment counted as the allocator's (reserve) at its site.
    let d = &p.devices[&0];
    let t = &d.tensor_tally;
    assert_eq!((t.allocations, t.frees, t.bytes_allocated), (2, 1, 6 << 20));
    assert_eq!((d.allocations, d.torch_segments), (2, 1));
    assert_eq!(p.tensor_peak_sites(0), vec![(tensor_site, 6 << 20, 2)]);
    assert_eq!(t.size_buckets.iter().map(|b| b.0).sum::<u64>(), 2);
    assert_eq!(p.site_stats[&(SiteId(0), 0)].reserve_allocations, 1);
    assert!(p.tensors_traced(0) && !p.tensors_traced(1));
    // Who holds memory: the tensors, not the site of the allocator's segments.
    assert_eq!(p.top_holders(0, 5), vec![(tensor_site, 2 << 20, 1)]);
    assert_eq!(p.top_sites(0, 5)[0], (SiteId(0), 28 << 20, 2));
    p.apply_event(
        &ev(
            EventKind::SegmentFree,
            Api::oomtrace_torch_segment,
            seg,
            20 << 20,
        ),
        &mut (),
    );
    p.apply_event(&ev(EventKind::Free, Api::cudaFree, seg, 0), &mut ());
    assert_eq!(p.devices[&0].torch_reserved_bytes, Some(0));
    assert_eq!(p.devices[&0].torch_segments, 0);
    assert_eq!(p.devices[&0].live_bytes, 8 << 20);
}

/// PyTorch's own readings: each is told after the marker it follows, with the steps counted
/// so far; the process keeps the last of each device; a device no process has is left out.
#[test]
fn torch_readings_follow_their_markers_and_the_last_of_each_device_is_kept() {
    #[derive(Default)]
    struct Heard(Vec<(u64, TorchMemory)>);
    impl Observer for Heard {
        fn step(&mut self, p: &Process, _ts: u64) {
            assert_eq!(
                self.0.len() as u64,
                2 * (p.markers - 1),
                "a reading came late"
            );
        }
        fn torch_memory(&mut self, p: &Process, m: &TorchMemory) {
            assert_eq!(
                p.torch_memory.get(&m.device),
                Some(m),
                "not kept before told"
            );
            self.0.push((p.markers, *m));
        }
    }
    let reading = |ts_ns, device, reserved| {
        Frame::TorchMemory(oomtrace_proto::wire::TorchMemory {
            ts_ns,
            device,
            allocated: reserved / 4,
            max_allocated: reserved / 2,
            reserved,
        })
    };
    let marker = |ts_ns| Frame::Marker {
        seq: 1,
        ts_ns,
        tid: 1,
        stack: StackId(0),
        label: String::new(),
    };
    let mut p = proc();
    let mut heard = Heard::default();
    for step in 1..=3u64 {
        p.apply(&marker(step * 100), &mut heard);
        p.apply(&reading(step * 100 + 1, 0, step << 20), &mut heard);
        p.apply(&reading(step * 100 + 2, 1, step << 30), &mut heard);
    }
    p.apply(&reading(400, oomtrace_proto::MAX_DEVICES, 1), &mut heard);
    p.apply(&reading(400, -1, 1), &mut heard);
    assert_eq!(heard.0.len(), 6);
    assert_eq!(p.implausible_torch_memory, 2);
    assert_eq!(p.torch_memory.len(), 2);
    let last = p.torch_memory[&1];
    assert_eq!(
        (
            last.step,
            last.ts_ns,
            last.reserved,
            last.max_allocated,
            last.allocated
        ),
        (3, 302, 3 << 30, 3 << 29, 3 << 28)
    );
    assert_eq!(p.torch_memory[&0].reserved, 3 << 20);
    assert!(heard.0.iter().all(|(steps, m)| *steps == m.step));
    // Readings are not events: they change no device's accounting.
    assert!(p.devices.is_empty());
}

/// An observer that writes down what it hears of frees and reserve: (what, size, reserve).
#[derive(Default)]
struct HeardFrees(Vec<(&'static str, u64, bool)>);

impl Observer for HeardFrees {
    fn free(&mut self, _p: &Process, f: &Free) {
        self.0.push(("free", f.size, f.reserve));
    }
    fn reserve(&mut self, _p: &Process, f: &Free) {
        self.0.push(("reserve", f.size, f.reserve));
    }
}

/// What an observer hears about a segment: born as a `cudaMalloc`, told once as reserve
/// when the allocator names it (a second `Segment` at the address changes nothing), and
/// its free says it was reserve. An extension's own `cudaMalloc` is never reserve.
#[test]
fn a_segment_is_told_once_as_reserve_and_freed_as_reserve() {
    let mut p = proc();
    let mut heard = HeardFrees::default();
    let seg = 0x7000_0000;
    let segment = ev(
        EventKind::Segment,
        Api::oomtrace_torch_segment,
        seg,
        20 << 20,
    );
    p.apply_event(
        &ev(EventKind::Alloc, Api::cudaMalloc, seg, 20 << 20),
        &mut heard,
    );
    p.apply_event(&segment, &mut heard);
    p.apply_event(&segment, &mut heard);
    p.apply_event(
        &ev(EventKind::Alloc, Api::cudaMalloc, 0x9000_0000, 8 << 20),
        &mut heard,
    );
    p.apply_event(
        &ev(EventKind::Free, Api::cudaFree, 0x9000_0000, 0),
        &mut heard,
    );
    p.apply_event(&ev(EventKind::Free, Api::cudaFree, seg, 0), &mut heard);
    assert_eq!(
        heard.0,
        [
            ("reserve", 20 << 20, true),
            ("free", 8 << 20, false),
            ("free", 20 << 20, true)
        ]
    );
}

/// `expandable_segments:True`: the segment is physical memory mapped into reserved address
/// space (`cuMemCreate` + `cuMemMap`), and PyTorch names the mapped range. Every handle
/// mapped in the range is told once as reserve, counted as reserve at its site, and freed as
/// reserve when unmapped and released; one mapped outside the range is not.
#[test]
fn the_handles_mapped_into_an_expandable_segment_are_reserve() {
    let mut p = proc();
    let mut heard = HeardFrees::default();
    let va = 0x7000_0000u64;
    let page = 2u64 << 20;
    // Two pages in the segment, a third handle mapped elsewhere (not PyTorch's).
    for (handle, at) in [(1u64, va), (2, va + page), (3, 0x9000_0000)] {
        p.apply_event(
            &ev(EventKind::PhysCreate, Api::cuMemCreate, handle, page),
            &mut heard,
        );
        let mut map = ev(EventKind::Map, Api::cuMemMap, at, page);
        map.aux = handle;
        p.apply_event(&map, &mut heard);
    }
    let segment = ev(
        EventKind::Segment,
        Api::oomtrace_torch_segment,
        va,
        2 * page,
    );
    p.apply_event(&segment, &mut heard);
    p.apply_event(&segment, &mut heard);
    assert_eq!(p.site_stats[&(SiteId(0), 0)].reserve_allocations, 2);
    assert_eq!(heard.0, [("reserve", page, true), ("reserve", page, true)]);
    heard.0.clear();
    for (handle, at) in [(1u64, va), (2, va + page), (3, 0x9000_0000)] {
        p.apply_event(&ev(EventKind::Unmap, Api::cuMemUnmap, at, page), &mut heard);
        p.apply_event(
            &ev(EventKind::PhysRelease, Api::cuMemRelease, handle, 0),
            &mut heard,
        );
    }
    assert_eq!(
        heard.0,
        [
            ("free", page, true),
            ("free", page, true),
            ("free", page, false)
        ]
    );
    assert_eq!(p.devices[&0].live_bytes, 0);
}

#[test]
fn stack_ids_resolve_as_a_map_would_whatever_the_ids() {
    let mut sites = StackSites::default();
    let mut reference: FxHashMap<u32, SiteId> = FxHashMap::default();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for step in 0..20_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Mostly the shim's 1, 2, 3, ...; now and then an id defined again, one far past
        // the others (later reached by the dense ones), or anything at all.
        let id = match x % 16 {
            0 => (x >> 8) as u32 % (step + 1),
            1 => step + 3000 + (x >> 8) as u32 % 5000,
            2 => (x >> 32) as u32,
            _ => step,
        };
        let site = SiteId((x >> 40) as u32 % 500);
        sites.insert(id, site);
        reference.insert(id, site);
        let probe = (x >> 20) as u32 % (step + 9000);
        assert_eq!(
            sites.get(probe),
            reference.get(&probe).copied(),
            "step {step}"
        );
        assert_eq!(sites.get(id), Some(site));
    }
    for (&id, &site) in &reference {
        assert_eq!(sites.get(id), Some(site));
    }
    assert!(
        sites.dense.len() <= 2 * 20_000 + 1025,
        "{}",
        sites.dense.len()
    );
}

#[test]
fn alloc_free_peak_and_sites() {
    let mut p = proc();
    p.define_stack(StackId(1), &[0x1000, 0x2000]);
    p.define_stack(StackId(2), &[0x1000, 0x2000]); // same frames, other thread
    let mut a = ev(EventKind::Alloc, Api::cudaMalloc, 0xa, 100);
    a.stack = StackId(1);
    p.apply_event(&a, &mut ());
    let mut b = ev(EventKind::Alloc, Api::cudaMalloc, 0xb, 50);
    b.stack = StackId(2);
    p.apply_event(&b, &mut ());
    p.apply_event(&ev(EventKind::Free, Api::cudaFree, 0xa, 0), &mut ());
    let d = &p.devices[&0];
    assert_eq!((d.live_bytes, d.peak_bytes, d.live_count), (50, 150, 1));
    assert_eq!(p.sites.len(), 2, "one site for both stack ids");
    assert_eq!(p.top_sites(0, 5), vec![(SiteId(1), 50, 1)]);
    p.apply_event(&ev(EventKind::Free, Api::cudaFree, 0xdead, 0), &mut ());
    assert_eq!(p.unmatched_frees, 1);
}

#[test]
fn vmm_handle_lives_while_referenced_or_mapped() {
    let mut p = proc();
    p.apply_event(
        &ev(EventKind::PhysCreate, Api::cuMemCreate, 7, 2 << 20),
        &mut (),
    );
    let mut map = ev(EventKind::Map, Api::cuMemMap, 0x1000_0000, 2 << 20);
    map.aux = 7;
    p.apply_event(&map, &mut ());
    // NCCL/PyTorch pattern: release while mapped keeps the memory.
    p.apply_event(
        &ev(EventKind::PhysRelease, Api::cuMemRelease, 7, 0),
        &mut (),
    );
    assert_eq!(p.devices[&0].live_bytes, 2 << 20);
    // Retain + release is a no-op.
    let mut ret = ev(
        EventKind::PhysRetain,
        Api::cuMemRetainAllocationHandle,
        7,
        0,
    );
    ret.aux = 0x1000_0000;
    p.apply_event(&ret, &mut ());
    p.apply_event(
        &ev(EventKind::PhysRelease, Api::cuMemRelease, 7, 0),
        &mut (),
    );
    assert_eq!(p.devices[&0].live_bytes, 2 << 20);
    p.apply_event(
        &ev(EventKind::Unmap, Api::cuMemUnmap, 0x1000_0000, 2 << 20),
        &mut (),
    );
    assert_eq!(p.devices[&0].live_bytes, 0);
    assert!(p.handles.is_empty());
    // The driver reuses the handle value: a new create is a new allocation.
    p.apply_event(
        &ev(EventKind::PhysCreate, Api::cuMemCreate, 7, 4 << 20),
        &mut (),
    );
    assert_eq!(p.devices[&0].live_bytes, 4 << 20);
}

/// Memory follows live allocations and sites, never the number of events.
#[test]
fn state_stays_bounded_over_a_million_events() {
    let mut p = proc();
    for s in 1..=4u32 {
        p.define_stack(StackId(s), &[0x1000 * u64::from(s), 0x2000]);
    }
    for i in 0..500_000u64 {
        let ptr = 0x7000_0000 + (i % 64) * 4096; // the driver reuses addresses
        let mut a = ev(EventKind::Alloc, Api::cudaMalloc, ptr, 4096);
        a.stack = StackId((i % 4) as u32 + 1);
        p.apply_event(&a, &mut ());
        p.apply_event(&ev(EventKind::Free, Api::cudaFree, ptr, 0), &mut ());
    }
    assert_eq!(p.events, 1_000_000);
    assert!(p.live.is_empty());
    assert_eq!(p.sites.len(), 5);
    assert!(p.site_stats.len() <= 5);
    assert!(
        p.live.capacity() < 1024,
        "live table never held more than a few entries"
    );
    assert_eq!(p.devices[&0].live_bytes, 0);
    assert_eq!(p.devices[&0].peak_bytes, 4096);
}

fn module(id: u32, start: u64, path: &str) -> ModuleDef {
    ModuleDef {
        id,
        start,
        end: start + 0x10_0000,
        bias: start,
        build_id: Vec::new(),
        path: path.into(),
        file: None,
    }
}

/// CPython 3.11 reaches the same native function from the same Python line through other
/// interpreter functions once it has specialised the call: still one site, from the first
/// allocation on; a frame of any other module still tells sites apart.
#[test]
fn stacks_that_differ_only_inside_the_interpreter_are_one_site() {
    let mut p = proc();
    p.define_module(module(1, 0x10_0000, "/usr/lib/libpython3.11.so.1.0"));
    p.define_module(module(
        2,
        0x20_0000,
        "/venv/lib/_ctypes.cpython-311-x86_64-linux-gnu.so",
    ));
    p.define_module(module(3, 0x30_0000, "/opt/py/bin/python3.13t"));
    let py = PyFrame {
        code: 7,
        offset: 40,
        group_end: true,
    }
    .encode();
    // Generic call path, then the specialised one (other eval-loop return address).
    p.define_stack(
        StackId(1),
        &[0x20_0100, 0x10_0200, 0x10_0300, 0x10_0400, py],
    );
    p.define_stack(StackId(2), &[0x20_0100, 0x10_0500, py]);
    // The statically linked interpreter is the interpreter too.
    p.define_stack(StackId(3), &[0x20_0100, 0x30_0500, py]);
    assert_eq!(p.stack_site(StackId(1)), p.stack_site(StackId(2)));
    assert_eq!(p.stack_site(StackId(1)), p.stack_site(StackId(3)));
    assert_eq!(p.merged_stacks, 2);
    // The first stack is kept whole: the symbolizer places Python frames by its eval loop.
    assert_eq!(p.sites[p.stack_site(StackId(1)).0 as usize].len(), 5);
    // Another extension frame, or another Python line, is another site.
    p.define_stack(StackId(4), &[0x20_0180, 0x10_0500, py]);
    let other_line = PyFrame {
        code: 7,
        offset: 60,
        group_end: true,
    }
    .encode();
    p.define_stack(StackId(5), &[0x20_0100, 0x10_0500, other_line]);
    let sites: std::collections::BTreeSet<SiteId> =
        (1..=5).map(|i| p.stack_site(StackId(i))).collect();
    assert_eq!(sites.len(), 3, "{sites:?}");
}

/// A specialised call ends at another instruction of the same line (`PRECALL` instead of
/// `CALL`): the Python frame counts by its line, once its code object is known.
#[test]
fn python_frames_count_by_their_line_not_their_instruction() {
    let mut p = proc();
    p.apply(
        &Frame::CodeDef(CodeDef {
            id: 7,
            format: oomtrace_proto::python::LineTableFormat::Lnotab as u8,
            first_line: 10,
            filename: "train.py".into(),
            name: "step".into(),
            // Offsets 0..50 are line 10, from 50 on line 11.
            line_table: vec![50, 1],
        }),
        &mut (),
    );
    let at = |offset| {
        PyFrame {
            code: 7,
            offset,
            group_end: true,
        }
        .encode()
    };
    p.define_stack(StackId(1), &[0x9000, at(40)]);
    p.define_stack(StackId(2), &[0x9000, at(44)]);
    p.define_stack(StackId(3), &[0x9000, at(60)]);
    assert_eq!(p.stack_site(StackId(1)), p.stack_site(StackId(2)));
    assert_ne!(p.stack_site(StackId(1)), p.stack_site(StackId(3)));
    // The site keeps the frames it was first seen with.
    assert_eq!(p.sites[p.stack_site(StackId(2)).0 as usize][1].addr, at(40));
}

#[test]
fn the_interpreter_is_known_by_its_file_name() {
    for path in [
        "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
        "/root/.pyenv/versions/3.12.1/lib/libpython3.12d.so",
        "/usr/bin/python3.11",
        "/usr/local/bin/python3",
        "/opt/conda/bin/python",
        "/opt/py/bin/python3.13t",
    ] {
        assert!(is_interpreter_module(path), "{path}");
    }
    for path in [
        "/venv/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so",
        "/usr/lib/x86_64-linux-gnu/libffi.so.8",
        "/home/u/python_ext.so",
        "/home/u/bin/python-train",
        "/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so",
        "/usr/lib/libpythonish.a",
    ] {
        assert!(!is_interpreter_module(path), "{path}");
    }
}

#[test]
fn pinned_host_memory_is_kept_apart() {
    let mut p = proc();
    p.apply_event(&ev(EventKind::Alloc, Api::cudaMallocHost, 0xa, 10), &mut ());
    p.apply_event(&ev(EventKind::Alloc, Api::cudaMalloc, 0xb, 20), &mut ());
    assert_eq!(p.devices[&HOST_DEVICE].live_bytes, 10);
    assert_eq!(p.devices[&0].live_bytes, 20);
}

/// Defines stacks 1 and 2 (one frame each) and returns their sites.
fn two_sites(p: &mut Process) -> (SiteId, SiteId) {
    p.apply(
        &Frame::StackDef {
            id: StackId(1),
            frames: vec![0x1000],
        },
        &mut (),
    );
    p.apply(
        &Frame::StackDef {
            id: StackId(2),
            frames: vec![0x2000],
        },
        &mut (),
    );
    (p.stack_site(StackId(1)), p.stack_site(StackId(2)))
}

fn at(kind: EventKind, ptr: u64, size: u64, stack: u32, ts: u64) -> Event {
    let api = if kind == EventKind::Alloc {
        Api::cudaMalloc
    } else {
        Api::cudaFree
    };
    let mut e = ev(kind, api, ptr, size);
    e.stack = StackId(stack);
    e.ts_ns = ts;
    e
}

#[test]
fn the_peak_remembers_who_held_it() {
    const M: u64 = 1 << 20;
    let mut p = proc();
    let (s1, s2) = two_sites(&mut p);
    p.apply_event(&at(EventKind::Alloc, 0xa, 8 * M, 1, 1), &mut ());
    p.apply_event(&at(EventKind::Alloc, 0xb, 4 * M, 2, 2), &mut ());
    p.apply_event(&at(EventKind::Free, 0xb, 0, 0, 3), &mut ());
    p.apply_event(&at(EventKind::Alloc, 0xc, 2 * M, 1, 4), &mut ());
    assert_eq!(p.devices[&0].peak_bytes, 12 * M);
    assert_eq!(
        p.peak_sites(0),
        vec![(s1, 8 * M, 1), (s2, 4 * M, 1)],
        "not the end"
    );
    // A new peak, not yet left: the peak is now.
    p.apply_event(&at(EventKind::Alloc, 0xd, 8 * M, 2, 5), &mut ());
    assert_eq!(p.peak_sites(0), vec![(s1, 10 * M, 2), (s2, 8 * M, 1)]);
    p.apply_event(&at(EventKind::Free, 0xd, 0, 0, 6), &mut ());
    // A peak only 4 KiB higher (under 1/64 of 18 MiB): the snapshot stays the one of
    // 18 MiB rather than scanning the sites again.
    p.apply_event(&at(EventKind::Alloc, 0xe, 8 * M + 4096, 2, 7), &mut ());
    p.apply_event(&at(EventKind::Free, 0xe, 0, 0, 8), &mut ());
    assert_eq!(p.devices[&0].peak_bytes, 18 * M + 4096);
    assert_eq!(p.peak_sites(0), vec![(s1, 10 * M, 2), (s2, 8 * M, 1)]);
    let buckets = &p.devices[&0].size_buckets;
    // 2 MiB -> [2^21, 2^22), 4 MiB -> [2^22, 2^23), 8 MiB -> [2^23, 2^24).
    assert_eq!(buckets[22..], [(1, 2 * M), (1, 4 * M), (3, 24 * M + 4096)]);
}

/// Sizes near 2^64 (any bytes on the wire): the peak snapshot's threshold saturates
/// instead of overflowing (found by the wire_decoder fuzz target).
#[test]
fn a_peak_near_the_largest_size_does_not_overflow() {
    let mut p = proc();
    p.apply_event(
        &ev(EventKind::Alloc, Api::cudaMalloc, 0xa, u64::MAX - 8),
        &mut (),
    );
    p.apply_event(&ev(EventKind::Free, Api::cudaFree, 0xa, 0), &mut ());
    p.apply_event(
        &ev(EventKind::Alloc, Api::cudaMalloc, 0xb, u64::MAX),
        &mut (),
    );
    assert_eq!(p.devices[&0].peak_bytes, u64::MAX);
}

#[test]
fn temporaries_and_growth_are_counted_by_step() {
    let mut p = proc();
    let (_, s2) = two_sites(&mut p);
    let marker = |p: &mut Process, ts| {
        let mut e = Event::new(EventKind::Marker, Api::cudaMalloc);
        e.ts_ns = ts;
        p.apply_event(&e, &mut ());
    };
    p.apply_event(&at(EventKind::Alloc, 0x1, 1, 1, 10), &mut ());
    marker(&mut p, 20);
    // Born in the step before: not temporary.
    p.apply_event(&at(EventKind::Free, 0x1, 0, 0, 25), &mut ());
    p.apply_event(&at(EventKind::Alloc, 0x2, 1, 1, 30), &mut ());
    p.apply_event(&at(EventKind::Free, 0x2, 0, 0, 35), &mut ());
    p.apply_event(&at(EventKind::Alloc, 0x3, 8, 2, 40), &mut ());
    marker(&mut p, 50);
    p.apply_event(&at(EventKind::Alloc, 0x4, 8, 2, 60), &mut ());
    marker(&mut p, 70);
    // The teardown at exit, after the last marker.
    p.apply_event(&at(EventKind::Free, 0x3, 0, 0, 80), &mut ());
    p.apply_event(&at(EventKind::Free, 0x4, 0, 0, 81), &mut ());
    assert_eq!(p.devices[&0].temporary, 1);
    let s = &p.site_stats[&(s2, 0)];
    assert_eq!((s.frees, s.temporary, s.live_bytes), (2, 0, 0));
    assert_eq!(s.live_at_first_step, 0);
    assert_eq!(s.live_at_last_step(p.markers), 16, "before the teardown");
}

#[test]
fn a_library_frame_is_named_as_a_user_names_the_library() {
    let sp = "/venv/lib/python3.11/site-packages";
    for (file, name) in [
        (format!("{sp}/torch/nn/modules/module.py"), Some("torch.nn")),
        (format!("{sp}/torch/_tensor.py"), Some("torch")),
        (format!("{sp}/torch/optim/adam.py"), Some("torch.optim")),
        (format!("{sp}/six.py"), Some("six")),
        ("/usr/lib/python3.11/contextlib.py".into(), Some("stdlib")),
        ("<frozen runpy>".into(), Some("stdlib")),
        ("/home/me/train.py".into(), None),
        ("/home/me/python3.11/train.py".into(), None),
    ] {
        assert_eq!(library_name(&file).as_deref(), name, "{file}");
    }
}
