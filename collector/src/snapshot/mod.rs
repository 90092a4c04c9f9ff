//! PyTorch memory snapshots in: the pickles `torch.cuda.memory._dump_snapshot()` writes
//! (PyTorch 2.4 to 2.15), turned into an oomtrace trace, so that `report`, `view`, `whatif`,
//! `diff` and `fit` read a snapshot as they read a trace.
//!
//! A snapshot holds the allocator's state when it was taken (`segments`, each with its
//! `blocks`) and, when `_record_memory_history()` ran, each device's recent actions
//! (`device_traces`: `alloc`, `free_completed`, `segment_alloc`/`segment_free`,
//! `segment_map`/`segment_unmap` with expandable segments, `oom`), each with its stack
//! (`frames`: C++ and Python frames, innermost first, with names). These are the actions
//! oomtrace's own trace tracker records (`shim/src/torch_tracker.rs`), so each becomes the
//! events the shim would have sent:
//!
//! | snapshot action | events |
//! |---|---|
//! | `alloc` | `Alloc` of `oomtrace_torch_alloc` (a tensor) |
//! | `free_completed` | `Free` of `oomtrace_torch_free` (`free_requested` is not a free yet) |
//! | `segment_alloc` / `segment_free` | `Alloc`/`Free` of `cudaMalloc`/`cudaFree`, and `Segment`/`SegmentFree` |
//! | `segment_map` / `segment_unmap` | per 2 MiB page `PhysCreate`+`Map` / `Unmap`+`PhysRelease`, and `Segment`/`SegmentFree` |
//! | `oom` | `AllocFailed` of `oomtrace_torch_alloc`, and a `MemInfo` with the free bytes it reported (total: PyTorch's reserve plus that) |
//!
//! The trace is a ring buffer (`max_entries`): when it dropped its oldest entries, or
//! recording began after the program had allocated, some blocks and segments were live before
//! its first entry. Walking the entries backwards from the final state finds them; they are
//! made at the trace's start, with the stack the final state gives them (a block still live)
//! or none, and [`Converted::limits`] says so. Python frames become code objects (one per file,
//! function and line); C++ frames become `FrameName`s (the snapshot names them, and its
//! addresses are of a process that is gone), less PyTorch's recorder and the interpreter's
//! own frames. A snapshot has no step markers, no threads and no device size: what the report
//! does instead is in [`Converted::limits`].
//!
//! Imports nothing of the crate (a layer of its own below the model, which reads what it
//! makes); tested through the model (`model/snapshot_tests.rs`).

pub mod pickle;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use oomtrace_proto::python::{CodeDef, LineTableFormat, PyFrame};
use oomtrace_proto::trace_file as tf;
use oomtrace_proto::wire::{encode, hello_flags, GoodbyeReason, Hello};
use oomtrace_proto::{Api, Event, EventKind, StackId};

use pickle::{Pickle, Value};

/// The largest snapshot read (bytes): PyTorch's default ring of 10^6 entries with C++ frames
/// is a few hundred MiB; reading takes some 3 times the file in memory.
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

/// Devices a snapshot may name (as `oomtrace_proto::MAX_DEVICES`).
const MAX_DEVICES: usize = oomtrace_proto::MAX_DEVICES as usize;

/// The granularity PyTorch's expandable segments map memory in.
const PAGE: u64 = 2 << 20;

/// Where the addresses of named C++ frames begin: far above any user-space address, below
/// the Python frame bit (`python.rs`).
const NAMED_FRAME_BASE: u64 = 1 << 56;

/// Frames of these functions are PyTorch's recorder taking the stack, not the program.
const RECORDER_FRAMES: &[&str] = &["torch::unwind::", "torch::CapturedTraceback::"];

/// Whether `head` (a file's first bytes) starts a pickle (protocol 2 to 5: what Python 3
/// writes by default).
pub fn is_pickle(head: &[u8]) -> bool {
    head.len() >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1])
}

/// A snapshot made into a trace.
#[derive(Debug)]
pub struct Converted {
    /// A whole `.oomt` trace file: one connection, ended cleanly.
    pub trace: Vec<u8>,
    /// What a reader should know of a snapshot, in one line.
    pub limits: String,
}

/// Reads the snapshot pickle in `bytes` (from the file `name`) into a trace. The error is a
/// sentence naming what is wrong.
pub fn convert(bytes: &[u8], name: &str) -> Result<Converted, String> {
    let p = pickle::read(bytes).map_err(|e| format!("not a readable pickle: {e}"))?;
    let snapshot = Snapshot::read(&p)?;
    Ok(Builder::new(&p, name).build(&snapshot))
}

/// A trace entry's `action`, as PyTorch names it: the one vocabulary of the format for the
/// reader here and for the CLI's writer of it (`export --format memory-viz`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    const ALL: [Action; 8] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }

    /// The action named `name`; `None` for one this reader does not know (`snapshot`, and
    /// anything newer), which changes nothing.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    device: i16,
    /// None: an action that changes nothing here (`snapshot`, a newer one).
    action: Option<Action>,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: Option<u64>,
    frames: Value,
    /// `oom`: the free bytes the driver reported.
    device_free: u64,
}

#[derive(Clone, Debug)]
struct Segment {
    device: i16,
    address: u64,
    total_size: u64,
    stream: u64,
    expandable: bool,
    frames: Value,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    device: i16,
    address: u64,
    size: u64,
    stream: u64,
    frames: Value,
}

/// What a snapshot says, typed.
struct Snapshot {
    segments: Vec<Segment>,
    /// Blocks live when it was taken (allocated, or freed but waiting for a stream).
    blocks: Vec<Block>,
    /// Every device's trace entries, in time order.
    entries: Vec<Entry>,
    /// Devices that have a trace (`device_traces` has a list for each device; recording may
    /// have been off).
    traced_devices: usize,
    /// The allocator setting it ran with (`allocator_settings`, 2.5 on).
    alloc_conf: Option<String>,
}

/// What a pickle that builds objects is told: PyTorch's snapshots are plain data.
const OBJECT: &str = "it builds a Python object (a class, or a call it would make when Python \
                      loads it) where a PyTorch memory snapshot has plain data: not a snapshot, \
                      and nothing in it was run";

fn int(v: Option<Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(i),
        Value::Bool(b) => Some(b as i64),
        _ => None,
    }
}

fn uint(p: &Pickle, v: Value, key: &str) -> u64 {
    int(p.get(v, key)).map_or(0, |i| i as u64)
}

fn device_of(i: i64) -> Result<i16, String> {
    if (0..MAX_DEVICES as i64).contains(&i) {
        Ok(i as i16)
    } else {
        Err(format!("it names device {i}, which no process can have"))
    }
}

impl Snapshot {
    fn read(p: &Pickle) -> Result<Snapshot, String> {
        let not_snapshot = "a pickle, but not a PyTorch memory snapshot (no 'segments' list: \
                            write one with torch.cuda.memory._dump_snapshot())";
        let root = p.root.ok_or(not_snapshot)?;
        if root == Value::Object {
            return Err(OBJECT.into());
        }
        let segments_v = p.get(root, "segments").and_then(|v| p.seq(v));
        let Some(segments_v) = segments_v else {
            return Err(not_snapshot.into());
        };
        let mut segments = Vec::new();
        let mut blocks = Vec::new();
        for &s in segments_v {
            if s == Value::Object {
                return Err(OBJECT.into());
            }
            if !p.is_dict(s) {
                return Err("a segment of the snapshot is not a dict".into());
            }
            let device = device_of(int(p.get(s, "device")).unwrap_or(0))?;
            let address = uint(p, s, "address");
            let stream = uint(p, s, "stream");
            segments.push(Segment {
                device,
                address,
                total_size: uint(p, s, "total_size"),
                stream,
                expandable: int(p.get(s, "is_expandable")) == Some(1),
                frames: p.get(s, "frames").unwrap_or(Value::None),
            });
            // Blocks before 2.1 had no address: they follow each other from the segment's.
            let mut at = address;
            for &b in p.get(s, "blocks").and_then(|v| p.seq(v)).unwrap_or(&[]) {
                let size = uint(p, b, "size");
                let address = int(p.get(b, "address")).map_or(at, |a| a as u64);
                at = address.saturating_add(size);
                let state = p.get(b, "state").and_then(|v| p.str(v)).unwrap_or("");
                if state.starts_with("active") {
                    blocks.push(Block {
                        device,
                        address,
                        size,
                        stream,
                        frames: p.get(b, "frames").unwrap_or(Value::None),
                    });
                }
            }
        }
        let mut entries = Vec::new();
        let traces = p
            .get(root, "device_traces")
            .and_then(|v| p.seq(v))
            .unwrap_or(&[]);
        let mut traced_devices = 0;
        for (device, &list) in traces.iter().enumerate() {
            let device = device_of(device as i64)?;
            let list = p.seq(list).unwrap_or(&[]);
            traced_devices += usize::from(!list.is_empty());
            for &e in list {
                let action = match p.get(e, "action").and_then(|v| p.str(v)) {
                    Some(name) => Action::from_name(name),
                    None => return Err("a trace entry of the snapshot has no action".into()),
                };
                entries.push(Entry {
                    device,
                    action,
                    addr: uint(p, e, "addr"),
                    size: uint(p, e, "size"),
                    stream: uint(p, e, "stream"),
                    time_us: int(p.get(e, "time_us")).map(|t| t.max(0) as u64),
                    frames: p.get(e, "frames").unwrap_or(Value::None),
                    device_free: uint(p, e, "device_free"),
                });
            }
        }
        // Devices' lists are each in time order; merged by time (stable: ties keep device
        // order). Entries without a time keep the order they were written in.
        if entries.iter().all(|e| e.time_us.is_some()) {
            entries.sort_by_key(|e| e.time_us);
        }
        let settings = p.get(root, "allocator_settings");
        let alloc_conf = settings
            .and_then(|s| p.get(s, "PYTORCH_CUDA_ALLOC_CONF"))
            .and_then(|v| p.str(v))
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .or_else(|| {
                let expandable = int(settings.and_then(|s| p.get(s, "expandable_segments")))
                    == Some(1)
                    || segments.iter().any(|s| s.expandable);
                expandable.then(|| "expandable_segments:True".to_owned())
            });
        Ok(Snapshot {
            segments,
            blocks,
            entries,
            traced_devices,
            alloc_conf,
        })
    }

    /// What was live before the first entry: the final state walked back through the entries.
    /// Blocks by (device, address) with the stack of the final state where they are still
    /// live; segments (not expandable) by (device, address); mapped pages of expandable ones.
    fn before_trace(&self) -> Before {
        let mut blocks: BTreeMap<(i16, u64), (u64, u64, Value)> = self
            .blocks
            .iter()
            .map(|b| ((b.device, b.address), (b.size, b.stream, b.frames)))
            .collect();
        let mut segments: BTreeMap<(i16, u64), (u64, u64, Value)> = BTreeMap::new();
        let mut pages: BTreeSet<(i16, u64)> = BTreeSet::new();
        for s in &self.segments {
            if s.expandable {
                pages.extend(page_range(s.address, s.total_size).map(|pg| (s.device, pg)));
            } else {
                segments.insert((s.device, s.address), (s.total_size, s.stream, s.frames));
            }
        }
        for e in self.entries.iter().rev() {
            let key = (e.device, e.addr);
            let Some(action) = e.action else {
                continue;
            };
            match action {
                Action::Alloc => {
                    blocks.remove(&key);
                }
                Action::FreeCompleted => {
                    blocks.insert(key, (e.size, e.stream, Value::None));
                }
                Action::SegmentAlloc => {
                    segments.remove(&key);
                }
                Action::SegmentFree => {
                    segments.insert(key, (e.size, e.stream, Value::None));
                }
                Action::SegmentMap => {
                    for pg in page_range(e.addr, e.size) {
                        pages.remove(&(e.device, pg));
                    }
                }
                Action::SegmentUnmap => {
                    pages.extend(page_range(e.addr, e.size).map(|pg| (e.device, pg)));
                }
                Action::FreeRequested | Action::Oom => {}
            }
        }
        Before {
            blocks,
            segments,
            pages,
        }
    }
}

struct Before {
    blocks: BTreeMap<(i16, u64), (u64, u64, Value)>,
    segments: BTreeMap<(i16, u64), (u64, u64, Value)>,
    pages: BTreeSet<(i16, u64)>,
}

/// Microseconds as nanoseconds, saturating (a file's times are whatever it says).
fn ns(us: u64) -> u64 {
    us.saturating_mul(1000)
}

/// The largest range mapped in pages: 1 TiB, more than any GPU has. A larger one is garbage
/// and counts as one piece, so that no loop runs as long as a file says.
const MAX_MAPPED: u64 = 1 << 40;

/// The 2 MiB pages of `[addr, addr + size)` as (address, length): one piece when the range is
/// not page-aligned or larger than [`MAX_MAPPED`].
fn pieces(addr: u64, size: u64) -> impl Iterator<Item = (u64, u64)> {
    let whole = addr.is_multiple_of(PAGE) && size.is_multiple_of(PAGE) && size <= MAX_MAPPED;
    let (n, len) = if whole {
        (size / PAGE, PAGE)
    } else {
        (1, size)
    };
    (0..n).map(move |i| (addr.saturating_add(i * len), len))
}

/// The pieces' addresses.
fn page_range(addr: u64, size: u64) -> impl Iterator<Item = u64> {
    pieces(addr, size).map(|(a, _)| a)
}

/// Writes the trace: frames of one connection, chunked.
struct Builder<'p> {
    p: &'p Pickle,
    name: String,
    out: Vec<u8>,
    frames: Vec<u8>,
    events: Vec<Event>,
    seq: u64,
    /// (file, function, line) -> code id: by content (equal strings need not be one object
    /// in the pickle).
    codes: HashMap<(String, String, i64), u32>,
    /// (module, function) -> named frame address, by content.
    named: HashMap<(String, String), u64>,
    /// A frames list's pickle handle -> stack id (0: no frames).
    stack_of_list: HashMap<u32, StackId>,
    stacks: HashMap<Vec<u64>, StackId>,
    native_frames: bool,
    /// Live segment bytes per device, for the device size an OOM implies.
    reserved: HashMap<i16, u64>,
    /// Expandable segments' mapped pages: page -> handle.
    mapped: BTreeMap<(i16, u64), u64>,
    next_handle: u64,
}

/// Chunks are cut at about this many bytes of frames.
const CHUNK: usize = 1 << 20;

impl<'p> Builder<'p> {
    fn new(p: &'p Pickle, name: &str) -> Builder<'p> {
        Builder {
            p,
            name: name.to_owned(),
            out: Vec::new(),
            frames: Vec::new(),
            events: Vec::new(),
            seq: 0,
            codes: HashMap::new(),
            named: HashMap::new(),
            stack_of_list: HashMap::new(),
            stacks: HashMap::new(),
            native_frames: false,
            reserved: HashMap::new(),
            mapped: BTreeMap::new(),
            next_handle: 1,
        }
    }

    fn build(mut self, s: &Snapshot) -> Converted {
        let before = s.before_trace();
        let first_us = s.entries.iter().find_map(|e| e.time_us).unwrap_or(0);
        let last_us = s
            .entries
            .iter()
            .rev()
            .find_map(|e| e.time_us)
            .unwrap_or(first_us);
        // The events' clock: 1 s, then the snapshot's microseconds since its first entry.
        let clock = |i: usize, e: &Entry| match e.time_us {
            Some(t) => ns(t.saturating_sub(first_us)).saturating_add(1_000_000_000),
            None => ns(i as u64).saturating_add(1_000_000_000),
        };
        // Writing to a Vec cannot fail (`let _`).
        let _ = tf::write_header(&mut self.out, ns(first_us), "oomtrace snapshot reader");
        let _ = tf::write_conn_open(
            &mut self.out,
            0,
            ns(first_us),
            oomtrace_proto::wire::WIRE_VERSION,
        );
        let mut launch = Vec::new();
        if let Some(conf) = &s.alloc_conf {
            launch.push(("PYTORCH_CUDA_ALLOC_CONF".to_owned(), conf.clone()));
        }
        // Stacks are resolved now so that the Hello can say whether native stacks came.
        let mut stacks_of = Vec::with_capacity(s.entries.len());
        for e in &s.entries {
            stacks_of.push(self.stack(e.frames));
        }
        let before_blocks: Vec<(i16, u64, u64, u64, StackId)> = before
            .blocks
            .iter()
            .map(|(&(d, a), &(size, stream, frames))| (d, a, size, stream, self.stack(frames)))
            .collect();
        let before_segments: Vec<(i16, u64, u64, u64, StackId)> = before
            .segments
            .iter()
            .map(|(&(d, a), &(size, stream, frames))| (d, a, size, stream, self.stack(frames)))
            .collect();
        let defs = std::mem::take(&mut self.frames);
        encode::hello(
            &mut self.frames,
            &Hello {
                pid: 0,
                ppid: 0,
                start_unix_ns: ns(first_us),
                flags: hello_flags::NO_STEP_MARKERS
                    | if self.native_frames {
                        hello_flags::NATIVE_STACKS
                    } else {
                        0
                    },
                shim_version: "snapshot".into(),
                exe: self.name.clone(),
                argv: vec![self.name.clone()],
                start_mono_ns: 1_000_000_000,
                host: String::new(),
                launch,
            },
        );
        self.frames.extend_from_slice(&defs);

        // What was live before the first entry, made just before it.
        let start = 999_999_000;
        for &(device, addr, size, stream, stack) in &before_segments {
            self.segment_alloc(start, device, addr, size, stream, stack);
        }
        let mut pages_before: BTreeMap<i16, Vec<u64>> = BTreeMap::new();
        for &(device, pg) in &before.pages {
            pages_before.entry(device).or_default().push(pg);
        }
        for (device, pages) in &pages_before {
            for &pg in pages {
                self.map(start, *device, pg, PAGE, 0);
            }
        }
        for &(device, addr, size, stream, stack) in &before_blocks {
            self.tensor(EventKind::Alloc, start, device, addr, size, stream, stack);
        }

        // A real trace reads the device's memory when it first sees it; a snapshot's is known
        // only at its first out-of-memory error: said at the start, so that `whatif` and `fit`
        // replay the whole history under that limit.
        for (device, capacity) in capacities(s, &before) {
            let reserved = self.reserved.get(&device).copied().unwrap_or(0);
            let mut info = Event::new(EventKind::MemInfo, Api::cuMemGetInfo_v2);
            (info.ts_ns, info.device, info.ptr, info.size) =
                (start, device, capacity.saturating_sub(reserved), capacity);
            self.push(info);
        }
        let mut ooms = 0;
        for (i, (e, &stack)) in s.entries.iter().zip(&stacks_of).enumerate() {
            let ts = clock(i, e);
            let Some(action) = e.action else {
                continue;
            };
            match action {
                Action::Alloc => self.tensor(
                    EventKind::Alloc,
                    ts,
                    e.device,
                    e.addr,
                    e.size,
                    e.stream,
                    stack,
                ),
                Action::FreeCompleted => self.tensor(
                    EventKind::Free,
                    ts,
                    e.device,
                    e.addr,
                    e.size,
                    e.stream,
                    stack,
                ),
                Action::SegmentAlloc => {
                    self.segment_alloc(ts, e.device, e.addr, e.size, e.stream, stack)
                }
                Action::SegmentFree => self.segment_free(ts, e.device, e.addr, e.size, stack),
                Action::SegmentMap => self.map(ts, e.device, e.addr, e.size, e.stream),
                Action::SegmentUnmap => self.unmap(ts, e.device, e.addr, e.size),
                Action::Oom => {
                    ooms += 1;
                    self.oom(ts, e, stack)
                }
                // Not a free yet: the block is the tensor's until `free_completed`.
                Action::FreeRequested => {}
            }
        }
        self.flush_events();
        encode::goodbye(&mut self.frames, GoodbyeReason::Exit, self.seq);
        self.flush_frames();
        let end_ns = ns(last_us);
        let _ = tf::write_conn_close(&mut self.out, 0, end_ns, tf::CloseReason::Clean, "");
        let _ = tf::write_end(&mut self.out, end_ns, 1);
        let limits = limits(s, &before, ooms);
        Converted {
            trace: self.out,
            limits,
        }
    }

    fn flush_frames(&mut self) {
        if !self.frames.is_empty() {
            tf::append_chunk(&mut self.out, 0, &self.frames, true);
            self.frames.clear();
        }
    }

    fn flush_events(&mut self) {
        if !self.events.is_empty() {
            encode::events(&mut self.frames, &self.events);
            self.events.clear();
        }
        if self.frames.len() >= CHUNK {
            self.flush_frames();
        }
    }

    fn push(&mut self, mut ev: Event) {
        self.seq += 1;
        ev.seq = self.seq;
        ev.tid = 1;
        self.events.push(ev);
        if self.events.len() >= 4096 {
            self.flush_events();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        kind: EventKind,
        api: Api,
        ts: u64,
        device: i16,
        (ptr, size, aux): (u64, u64, u64),
        stack: StackId,
    ) {
        let mut ev = Event::new(kind, api);
        ev.ts_ns = ts;
        ev.device = device;
        ev.ptr = ptr;
        ev.size = size;
        ev.aux = aux;
        ev.stack = stack;
        self.push(ev);
    }

    #[allow(clippy::too_many_arguments)]
    fn tensor(
        &mut self,
        kind: EventKind,
        ts: u64,
        device: i16,
        addr: u64,
        size: u64,
        stream: u64,
        stack: StackId,
    ) {
        let api = if kind == EventKind::Alloc {
            Api::oomtrace_torch_alloc
        } else {
            Api::oomtrace_torch_free
        };
        self.event(kind, api, ts, device, (addr, size, stream), stack);
    }

    fn segment_alloc(
        &mut self,
        ts: u64,
        device: i16,
        addr: u64,
        size: u64,
        stream: u64,
        stack: StackId,
    ) {
        self.event(
            EventKind::Alloc,
            Api::cudaMalloc,
            ts,
            device,
            (addr, size, 0),
            stack,
        );
        self.event(
            EventKind::Segment,
            Api::oomtrace_torch_segment,
            ts,
            device,
            (addr, size, stream),
            stack,
        );
        let r = self.reserved.entry(device).or_default();
        *r = r.saturating_add(size);
    }

    fn segment_free(&mut self, ts: u64, device: i16, addr: u64, size: u64, stack: StackId) {
        self.event(
            EventKind::SegmentFree,
            Api::oomtrace_torch_segment,
            ts,
            device,
            (addr, size, 0),
            stack,
        );
        self.event(
            EventKind::Free,
            Api::cudaFree,
            ts,
            device,
            (addr, size, 0),
            stack,
        );
        let r = self.reserved.entry(device).or_default();
        *r = r.saturating_sub(size);
    }

    fn map(&mut self, ts: u64, device: i16, addr: u64, size: u64, stream: u64) {
        for (pg, len) in pieces(addr, size) {
            let handle = self.next_handle;
            self.next_handle += 1;
            self.event(
                EventKind::PhysCreate,
                Api::cuMemCreate,
                ts,
                device,
                (handle, len, 0),
                StackId::NONE,
            );
            let mut ev = Event::new(EventKind::Map, Api::cuMemMap);
            (ev.ts_ns, ev.device, ev.ptr, ev.size, ev.aux) = (ts, device, pg, len, handle);
            self.push(ev);
            self.mapped.insert((device, pg), handle);
        }
        self.event(
            EventKind::Segment,
            Api::oomtrace_torch_segment,
            ts,
            device,
            (addr, size, stream),
            StackId::NONE,
        );
        let r = self.reserved.entry(device).or_default();
        *r = r.saturating_add(size);
    }

    fn unmap(&mut self, ts: u64, device: i16, addr: u64, size: u64) {
        self.event(
            EventKind::SegmentFree,
            Api::oomtrace_torch_segment,
            ts,
            device,
            (addr, size, 0),
            StackId::NONE,
        );
        for (pg, len) in pieces(addr, size) {
            let Some(handle) = self.mapped.remove(&(device, pg)) else {
                continue;
            };
            self.event(
                EventKind::Unmap,
                Api::cuMemUnmap,
                ts,
                device,
                (pg, len, 0),
                StackId::NONE,
            );
            self.event(
                EventKind::PhysRelease,
                Api::cuMemRelease,
                ts,
                device,
                (handle, 0, 0),
                StackId::NONE,
            );
        }
        let r = self.reserved.entry(device).or_default();
        *r = r.saturating_sub(size);
    }

    fn oom(&mut self, ts: u64, e: &Entry, stack: StackId) {
        let mut ev = Event::new(EventKind::AllocFailed, Api::oomtrace_torch_alloc);
        (ev.ts_ns, ev.device, ev.size, ev.aux) = (ts, e.device, e.size, e.stream);
        ev.result = 2;
        ev.stack = stack;
        self.push(ev);
        // The device's size is not in a snapshot: PyTorch's reserve plus what was free is what
        // PyTorch could have had (memory outside its allocator, the CUDA context and other
        // processes are not in a snapshot): the limit `whatif` and `fit` replay under.
        let reserved = self.reserved.get(&e.device).copied().unwrap_or(0);
        let mut info = Event::new(EventKind::MemInfo, Api::cuMemGetInfo_v2);
        (info.ts_ns, info.device, info.ptr, info.size) = (
            ts,
            e.device,
            e.device_free,
            reserved.saturating_add(e.device_free),
        );
        self.push(info);
    }

    /// The stack of a frames list: defined (with its frames) on first use.
    fn stack(&mut self, frames: Value) -> StackId {
        let Value::List(handle) = frames else {
            return StackId::NONE;
        };
        if let Some(&id) = self.stack_of_list.get(&handle) {
            return id;
        }
        let p = self.p;
        let mut native = Vec::new();
        let mut python = Vec::new();
        for &f in p.seq(frames).unwrap_or(&[]) {
            let Some(filename) = p.get(f, "filename") else {
                continue;
            };
            let Some(name) = p.get(f, "name") else {
                continue;
            };
            let (Some(file), Some(function)) = (p.str(filename), p.str(name)) else {
                continue;
            };
            let line = int(p.get(f, "line")).unwrap_or(0);
            if is_python_file(file) {
                python.push(self.code(file, function, line));
            } else if let Some(addr) = self.named_frame(file, function) {
                native.push(addr);
            }
        }
        if native.is_empty() && python.is_empty() {
            self.stack_of_list.insert(handle, StackId::NONE);
            return StackId::NONE;
        }
        let n = python.len();
        let mut all = native;
        all.extend(python.into_iter().enumerate().map(|(i, code)| {
            PyFrame {
                code,
                offset: 0,
                group_end: i + 1 == n,
            }
            .encode()
        }));
        all.truncate(u16::MAX as usize);
        let next = StackId(self.stacks.len() as u32 + 1);
        let id = *self.stacks.entry(all.clone()).or_insert_with(|| {
            encode::stack_def(&mut self.frames, next, &all);
            next
        });
        self.stack_of_list.insert(handle, id);
        id
    }

    fn code(&mut self, file: &str, function: &str, line: i64) -> u32 {
        let key = (file.to_owned(), function.to_owned(), line);
        if let Some(&id) = self.codes.get(&key) {
            return id;
        }
        let id = self.codes.len() as u32 + 1;
        encode::code_def(
            &mut self.frames,
            &CodeDef {
                id,
                format: LineTableFormat::Lnotab as u8,
                first_line: u32::try_from(line).unwrap_or(0),
                filename: key.0.clone(),
                name: key.1.clone(),
                line_table: Vec::new(),
            },
        );
        self.codes.insert(key, id);
        id
    }

    /// A C++ frame's address, or `None` for frames that say nothing of the program: unnamed
    /// ones, PyTorch's recorder, the interpreter's and the C library's own.
    fn named_frame(&mut self, file: &str, function: &str) -> Option<u64> {
        if function.is_empty()
            || function == "??"
            || RECORDER_FRAMES.iter().any(|r| function.starts_with(r))
            || is_interpreter_file(file)
        {
            return None;
        }
        self.native_frames = true;
        let key = (file.to_owned(), function.to_owned());
        if let Some(&addr) = self.named.get(&key) {
            return Some(addr);
        }
        let addr = NAMED_FRAME_BASE + 16 * (self.named.len() as u64 + 1);
        encode::frame_name(&mut self.frames, addr, file, function);
        self.named.insert(key, addr);
        Some(addr)
    }
}

/// Each device's size as its first out-of-memory entry implies: what PyTorch held then plus
/// what the driver said was free.
fn capacities(s: &Snapshot, before: &Before) -> BTreeMap<i16, u64> {
    let mut reserved: HashMap<i16, u64> = HashMap::new();
    for (&(device, _), &(size, ..)) in &before.segments {
        let r = reserved.entry(device).or_default();
        *r = r.saturating_add(size);
    }
    for &(device, _) in &before.pages {
        let r = reserved.entry(device).or_default();
        *r = r.saturating_add(PAGE);
    }
    let mut out = BTreeMap::new();
    for e in &s.entries {
        let Some(action) = e.action else {
            continue;
        };
        let r = reserved.entry(e.device).or_default();
        match action {
            Action::SegmentAlloc | Action::SegmentMap => *r = r.saturating_add(e.size),
            Action::SegmentFree | Action::SegmentUnmap => *r = r.saturating_sub(e.size),
            Action::Oom => {
                out.entry(e.device)
                    .or_insert_with(|| r.saturating_add(e.device_free));
            }
            _ => {}
        }
    }
    out
}

fn is_python_file(file: &str) -> bool {
    file.ends_with(".py") || file.starts_with('<')
}

/// The interpreter's own modules and the C library: frames every stack has.
fn is_interpreter_file(file: &str) -> bool {
    let base = file.rsplit('/').next().unwrap_or(file);
    base.starts_with("libpython")
        || base.starts_with("python")
        || base.starts_with("libc.so")
        || base.starts_with("ld-linux")
}

/// The snapshot's limits in one line.
fn limits(s: &Snapshot, before: &Before, ooms: usize) -> String {
    // Devices with a history, or with memory in the state (recording off).
    let devices = s
        .segments
        .iter()
        .map(|seg| seg.device)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        .max(s.traced_devices);
    let mut parts = vec![format!(
        "a PyTorch memory snapshot: {} trace entr{} on {} device{}, no step markers (steps are \
         found from the allocations' pattern), no device size{}",
        s.entries.len(),
        if s.entries.len() == 1 { "y" } else { "ies" },
        devices,
        if devices == 1 { "" } else { "s" },
        if ooms > 0 {
            " (taken as PyTorch's reserve plus the free memory at its out-of-memory error: what \
             PyTorch could have had)"
        } else {
            ""
        },
    )];
    if s.entries.is_empty() {
        parts.push(
            "no history (recording was off: torch.cuda.memory._record_memory_history() was \
             not called), only the state when it was taken"
                .into(),
        );
    }
    // Saturated: a hostile snapshot's sizes may add up past 64 bits.
    let live_bytes = before
        .blocks
        .values()
        .fold(0u64, |sum, b| sum.saturating_add(b.0));
    if !s.entries.is_empty() && (!before.blocks.is_empty() || !before.segments.is_empty()) {
        parts.push(format!(
            "its history begins after the program had allocated (recording began late, or its \
             ring buffer of max_entries dropped the oldest entries): {} tensor{} ({:.2} MiB) and {} \
             segment{} live before it are shown from its state, without their history",
            before.blocks.len(),
            if before.blocks.len() == 1 { "" } else { "s" },
            live_bytes as f64 / (1u64 << 20) as f64,
            before.segments.len() + before.pages.len(),
            if before.segments.len() + before.pages.len() == 1 {
                ""
            } else {
                "s"
            },
        ));
    }
    parts.join("; ")
}
