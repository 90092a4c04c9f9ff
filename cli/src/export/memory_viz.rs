//! A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`'s format) of one process,
//! as a protocol-4 pickle that pytorch.org/memory_viz opens in all three classic views
//! (PyTorch's `torch/cuda/_memory_viz.py` and the viewer read it).
//!
//! Mapping (decisions where the format leaves a choice):
//! - A driver-level allocation (cudaMalloc, cuMemAlloc, pools, managed memory) is a segment
//!   and one block of the same address and size: `segment_alloc` + `alloc`; its free is
//!   `free_requested` + `free_completed` + `segment_free`. So non-PyTorch memory shows in the
//!   Active Memory Timeline too.
//! - A VMM mapping (`cuMemMap` of a `cuMemCreate` handle) is `segment_map` + `alloc` of the
//!   mapped range (block frames: the handle's `cuMemCreate` site), its unmap
//!   `free_requested` + `free_completed` + `segment_unmap`, as PyTorch's expandable segments
//!   do. Physical memory that is not mapped has no address and is not shown; the Cached
//!   Segment Timeline ignores `segment_map` (the viewer's choice).
//! - Tensor-level events (`oomtrace_malloc`/`oomtrace_free`) are blocks: `alloc` /
//!   `free_requested` + `free_completed`. A driver segment that ever holds a tensor block
//!   loses its whole-segment block (in the trace and in `segments`): the tensors are its blocks,
//!   as with PyTorch's caching allocator. A tensor block inside no traced segment gets a
//!   synthetic segment of its own size (`segment_alloc`/`segment_free` around it). A block may
//!   span adjacent mappings of one stream (the viewer merges those into one segment).
//! - `oom` for each out-of-memory failure on a device: `size` = requested bytes,
//!   `device_free` = the driver's free memory read right after the failure (else the last
//!   reading), `addr` = 0.
//! - `segments` is the state at the end of the trace: every live segment (adjacent live
//!   mappings of one stream merged into one, `is_expandable`), blocks tiling it in address
//!   order with `inactive` fillers.
//! - `device_traces[d]` for every ordinal from 0 to the highest device seen. `time_us`:
//!   the process's start time (Unix) plus the monotonic time since its first event.
//!   `stream`: the CUDA stream as int64 (0 for non-stream-ordered APIs); every entry about an
//!   allocation carries the stream it was allocated on. Frames: `{filename, line, name}`,
//!   innermost first (PyTorch's order); a free's frames are its allocation's.
//! - Left out: pinned host memory (not device memory), allocations of 0 bytes, frees of
//!   addresses the trace never saw allocated, step markers.
//! - `device_traces[d]` keeps the most recent `max_entries` entries of each device (`export
//!   --max-entries`, default [`DEFAULT_MAX_ENTRIES`]; 0 keeps all), like PyTorch's
//!   `_record_memory_history(max_entries=...)` ring buffer; the viewer draws blocks freed in
//!   the window but allocated before it as allocated from the start, as for PyTorch's own
//!   snapshots. When entries were left out, the snapshot has an extra key the viewer ignores,
//!   `oomtrace`: `{"max_entries": N, "dropped_entries": [per device], "note": "..."}`.
//!
//! Memory: the live segments and blocks (they are the snapshot) and at most `max_entries`
//! entries per device, never anything per event: entries of a whole-segment block whose
//! segment later holds tensors are hidden in place (found by their index in the ring), and
//! the final `segments` are written one at a time.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::Path;

use oomtrace_collector::model::history::{self, Seen};
use oomtrace_collector::model::{Process, SiteId, OUT_OF_MEMORY};
use oomtrace_collector::report::symbolize::StackSymbolizer;
use oomtrace_proto::{Api, EventKind};

use super::pickle::Pickler;
use super::{frame_file, frame_name};
use crate::progress::Progress;
use crate::Failure;

/// Entries kept per device unless `--max-entries` says otherwise: enough for many steps of a
/// training loop, and a pickle of some tens of MB that the viewer opens in seconds.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
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
    fn name(self) -> &'static str {
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
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    action: Action,
    /// A whole-segment block's alloc whose segment later held tensor blocks: not written.
    hidden: bool,
    addr: u64,
    size: u64,
    stream: i64,
    ts_ns: u64,
    site: SiteId,
    device_free: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SegKind {
    Driver,
    Mapping,
}

#[derive(Clone, Debug)]
struct Seg {
    size: u64,
    stream: i64,
    /// Frames of the segment (its allocation or mapping call).
    site: SiteId,
    /// Frames of its whole-segment block (for a mapping: the handle's creation).
    block_site: SiteId,
    kind: SegKind,
    /// It has held a tensor block: the tensors are its blocks, not the whole segment.
    hosts_tensors: bool,
    /// Index (in the device's entry stream) of its whole-segment block's `alloc` entry.
    block_entry: u64,
}

impl Seg {
    fn new(kind: SegKind, size: u64, stream: i64, site: SiteId, block_site: SiteId) -> Seg {
        Seg {
            size,
            stream,
            site,
            block_site,
            kind,
            hosts_tensors: false,
            block_entry: 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Blk {
    size: u64,
    stream: i64,
    site: SiteId,
    /// In a segment of its own (no traced segment contains it).
    synthetic: bool,
}

#[derive(Default)]
struct Dev {
    segs: BTreeMap<u64, Seg>,
    blocks: BTreeMap<u64, Blk>,
    /// The most recent entries (a ring of at most `Model::max_entries` when that is not 0).
    trace: VecDeque<Entry>,
    /// Entries ever pushed: `trace[0]` is entry number `pushed - trace.len()`.
    pushed: u64,
    /// Entries that would have been written but fell out of the ring.
    dropped: u64,
}

impl Dev {
    /// The entry with stream index `i`, if it is still in the ring.
    fn entry_mut(&mut self, i: u64) -> Option<&mut Entry> {
        let first = self.pushed - self.trace.len() as u64;
        let at = usize::try_from(i.checked_sub(first)?).ok()?;
        self.trace.get_mut(at)
    }
}

#[derive(Default)]
struct Model {
    devs: BTreeMap<i16, Dev>,
    /// Entries kept per device (0: all).
    max_entries: usize,
    /// OOM entries waiting for the driver's reading that follows them: (device, tid) -> the
    /// entry's stream index.
    pending_oom: HashMap<(i16, u32), u64>,
}

impl Model {
    fn new(max_entries: usize) -> Model {
        Model {
            max_entries,
            ..Model::default()
        }
    }

    fn dev(&mut self, d: i16) -> &mut Dev {
        self.devs.entry(d).or_default()
    }

    /// Appends an entry to device `d`'s ring; returns its stream index.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        d: i16,
        action: Action,
        addr: u64,
        size: u64,
        stream: i64,
        ts: u64,
        site: SiteId,
    ) -> u64 {
        let max = self.max_entries;
        let dev = self.dev(d);
        if max > 0 && dev.trace.len() >= max {
            if let Some(old) = dev.trace.pop_front() {
                if !old.hidden {
                    dev.dropped += 1;
                }
            }
        }
        dev.trace.push_back(Entry {
            action,
            hidden: false,
            addr,
            size,
            stream,
            ts_ns: ts,
            site,
            device_free: 0,
        });
        dev.pushed += 1;
        dev.pushed - 1
    }

    /// A new segment at `addr` and its whole-segment block.
    fn driver_alloc(&mut self, d: i16, addr: u64, ts: u64, mut seg: Seg) {
        if self.dev(d).segs.contains_key(&addr) {
            // The free of the previous owner of this address was lost.
            self.release_segment(d, addr, ts);
        }
        let seg_action = match seg.kind {
            SegKind::Driver => Action::SegmentAlloc,
            SegKind::Mapping => Action::SegmentMap,
        };
        let (size, stream) = (seg.size, seg.stream);
        self.push(d, seg_action, addr, size, stream, ts, seg.site);
        seg.block_entry = self.push(d, Action::Alloc, addr, size, stream, ts, seg.block_site);
        self.dev(d).segs.insert(addr, seg);
    }

    /// Frees a segment and every block still inside it.
    fn release_segment(&mut self, d: i16, addr: u64, ts: u64) {
        let Some(seg) = self.dev(d).segs.remove(&addr) else {
            return;
        };
        let end = addr.saturating_add(seg.size);
        let inside: Vec<u64> = self
            .dev(d)
            .blocks
            .range(..end)
            .rev()
            .take_while(|(&a, b)| a.saturating_add(b.size) > addr)
            .map(|(&a, _)| a)
            .collect();
        for a in inside {
            self.free_block(d, a, ts);
        }
        let (s, st) = (seg.size, seg.stream);
        if !seg.hosts_tensors {
            self.push(d, Action::FreeRequested, addr, s, st, ts, seg.block_site);
            self.push(d, Action::FreeCompleted, addr, s, st, ts, seg.block_site);
        }
        let action = match seg.kind {
            SegKind::Driver => Action::SegmentFree,
            SegKind::Mapping => Action::SegmentUnmap,
        };
        self.push(d, action, addr, s, st, ts, seg.site);
    }

    fn free_block(&mut self, d: i16, addr: u64, ts: u64) {
        let Some(b) = self.dev(d).blocks.remove(&addr) else {
            return;
        };
        let (s, st) = (b.size, b.stream);
        self.push(d, Action::FreeRequested, addr, s, st, ts, b.site);
        self.push(d, Action::FreeCompleted, addr, s, st, ts, b.site);
        if b.synthetic {
            self.push(d, Action::SegmentFree, addr, s, st, ts, b.site);
        }
    }

    /// The segments (their addresses) that together cover `[addr, addr + size)`: one segment,
    /// or a run of adjacent mappings of one stream.
    fn cover(&self, d: i16, addr: u64, size: u64) -> Option<Vec<u64>> {
        let dev = self.devs.get(&d)?;
        let (&start, first) = dev.segs.range(..=addr).next_back()?;
        let mut end = start.saturating_add(first.size);
        if addr >= end {
            return None;
        }
        let mut out = vec![start];
        let want = addr.saturating_add(size);
        while end < want {
            let next = dev.segs.get(&end)?;
            if first.kind != SegKind::Mapping
                || next.kind != SegKind::Mapping
                || next.stream != first.stream
            {
                return None;
            }
            out.push(end);
            end = end.saturating_add(next.size);
        }
        Some(out)
    }

    fn tensor_alloc(&mut self, d: i16, addr: u64, size: u64, stream: i64, ts: u64, site: SiteId) {
        // Blocks this one overlaps were freed without the trace seeing it.
        let end = addr.saturating_add(size);
        let mut stale: Vec<u64> = self
            .dev(d)
            .blocks
            .range(addr..end)
            .map(|(&a, _)| a)
            .collect();
        if let Some((&a, b)) = self.dev(d).blocks.range(..addr).next_back() {
            if a.saturating_add(b.size) > addr {
                stale.push(a);
            }
        }
        for a in stale {
            self.free_block(d, a, ts);
        }
        let synthetic = match self.cover(d, addr, size) {
            Some(segs) => {
                let dev = self.dev(d);
                for a in segs {
                    let Some(seg) = dev.segs.get_mut(&a) else {
                        continue;
                    };
                    if !seg.hosts_tensors {
                        // From now on its tensors are its blocks: its whole-segment block
                        // never shows (its free is not written either, see release_segment).
                        seg.hosts_tensors = true;
                        let i = seg.block_entry;
                        if let Some(e) = dev.entry_mut(i) {
                            e.hidden = true;
                        }
                    }
                }
                false
            }
            None => {
                self.push(d, Action::SegmentAlloc, addr, size, stream, ts, site);
                true
            }
        };
        self.push(d, Action::Alloc, addr, size, stream, ts, site);
        self.dev(d).blocks.insert(
            addr,
            Blk {
                size,
                stream,
                site,
                synthetic,
            },
        );
    }

    fn on_event(&mut self, p: &Process, seen: Seen<'_>) {
        let Seen::Event { event: ev, site } = seen else {
            return;
        };
        let Some(kind) = ev.kind() else { return };
        let api = ev.api();
        let ts = ev.ts_ns;
        match kind {
            EventKind::Alloc => {
                if !api.memory_class().on_device() || ev.device < 0 || ev.size == 0 || ev.ptr == 0 {
                    return;
                }
                let stream = ev.aux as i64;
                if api == Api::oomtrace_malloc {
                    self.tensor_alloc(ev.device, ev.ptr, ev.size, stream, ts, site);
                } else {
                    let seg = Seg::new(SegKind::Driver, ev.size, stream, site, site);
                    self.driver_alloc(ev.device, ev.ptr, ts, seg);
                }
            }
            EventKind::Free => {
                let tensor = api == Api::oomtrace_free;
                let found = self.devs.iter().find_map(|(&d, dev)| {
                    let hit = if tensor {
                        dev.blocks.contains_key(&ev.ptr)
                    } else {
                        dev.segs
                            .get(&ev.ptr)
                            .is_some_and(|s| s.kind == SegKind::Driver)
                    };
                    hit.then_some(d)
                });
                if let Some(d) = found {
                    if tensor {
                        self.free_block(d, ev.ptr, ts);
                    } else {
                        self.release_segment(d, ev.ptr, ts);
                    }
                }
            }
            EventKind::AllocFailed => {
                if ev.result != OUT_OF_MEMORY || !api.memory_class().on_device() || ev.device < 0 {
                    return;
                }
                let d = ev.device;
                let free = p.devices.get(&d).and_then(|s| s.last_free).unwrap_or(0);
                let i = self.push(d, Action::Oom, 0, ev.size, ev.aux as i64, ts, site);
                if let Some(e) = self.dev(d).entry_mut(i) {
                    e.device_free = free;
                }
                self.pending_oom.insert((d, ev.tid), i);
            }
            EventKind::MemInfo => {
                if let Some(i) = self.pending_oom.remove(&(ev.device, ev.tid)) {
                    if let Some(e) = self.dev(ev.device).entry_mut(i) {
                        e.device_free = ev.ptr;
                    }
                }
            }
            EventKind::Map => {
                let (d, block_site) = p
                    .handles
                    .get(&ev.aux)
                    .map_or((ev.device, site), |h| (h.device, h.site));
                if d < 0 || ev.size == 0 {
                    return;
                }
                let seg_site = if site.0 == 0 { block_site } else { site };
                let seg = Seg::new(SegKind::Mapping, ev.size, 0, seg_site, block_site);
                self.driver_alloc(d, ev.ptr, ts, seg);
            }
            EventKind::Unmap => {
                let end = ev.ptr.saturating_add(ev.size.max(1));
                let gone: Vec<(i16, u64)> = self
                    .devs
                    .iter()
                    .flat_map(|(&d, dev)| {
                        dev.segs
                            .range(ev.ptr..end)
                            .filter(|(_, s)| s.kind == SegKind::Mapping)
                            .map(move |(&a, _)| (d, a))
                    })
                    .collect();
                for (d, a) in gone {
                    self.release_segment(d, a, ts);
                }
            }
            _ => {}
        }
    }
}

/// What [`write`] left out.
pub struct Written {
    /// Entries that fell out of the per-device ring (all devices).
    pub dropped_entries: u64,
}

/// Writes the snapshot of the process on connection `conn` of the trace file at `path`,
/// keeping the most recent `max_entries` entries per device (0: all).
pub fn write(
    path: &Path,
    conn: u32,
    max_entries: usize,
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<Written, Failure> {
    let mut model = Model::new(max_entries);
    let mut anchor: Option<u64> = None;
    let trace = history::replay_with_progress(
        path,
        &mut |done, total| progress.update(done, total),
        |p, seen| {
            if p.conn != conn {
                return;
            }
            if let Seen::Event { event, .. } = seen {
                anchor.get_or_insert(event.ts_ns);
            }
            model.on_event(p, seen);
        },
    )?;
    progress.end_pass();
    let process = super::by_conn(&trace, conn)?;
    let clock = Clock {
        anchor_ns: anchor.unwrap_or(0),
        start_unix_ns: process.hello.start_unix_ns,
    };
    let mut w = SnapshotWriter {
        p: Pickler::new(out),
        sym: StackSymbolizer::new(),
        process,
        frame_lists: HashMap::new(),
        frame_dicts: HashMap::new(),
        clock,
    };
    w.snapshot(&model);
    w.p.finish().map_err(super::write_failed)?;
    Ok(Written {
        dropped_entries: model.devs.values().map(|d| d.dropped).sum(),
    })
}

#[derive(Clone, Copy)]
struct Clock {
    anchor_ns: u64,
    start_unix_ns: u64,
}

impl Clock {
    fn time_us(&self, ts_ns: u64) -> i64 {
        let ns = if self.start_unix_ns == 0 {
            ts_ns
        } else {
            self.start_unix_ns
                .saturating_add(ts_ns.saturating_sub(self.anchor_ns))
        };
        (ns / 1000) as i64
    }
}

/// One block of a final segment.
struct OutBlock {
    addr: u64,
    size: u64,
    state: &'static str,
    site: SiteId,
}

/// One segment of the final state.
struct OutSeg {
    device: i16,
    addr: u64,
    size: u64,
    stream: i64,
    site: SiteId,
    expandable: bool,
    blocks: Vec<OutBlock>,
}

/// The final `segments`, one at a time in (device, address) order (never all at once: with
/// millions of live allocations that list alone was gigabytes): live segments (adjacent
/// mappings of one stream merged), blocks tiling each one, and the synthetic segments of
/// tensor blocks that lie in no traced segment.
fn each_segment(model: &Model, mut emit: impl FnMut(OutSeg)) {
    for (&d, dev) in &model.devs {
        let mut segs = dev.segs.range(..).peekable();
        let mut synthetic = dev.blocks.iter().filter(|(_, b)| b.synthetic).peekable();
        loop {
            let next_seg = segs.peek().map(|(&a, _)| a);
            let next_syn = synthetic.peek().map(|(&a, _)| a);
            let seg_first = match (next_seg, next_syn) {
                (None, None) => break,
                (Some(a), Some(b)) => a <= b,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if !seg_first {
                let Some((&a, b)) = synthetic.next() else {
                    break;
                };
                emit(OutSeg {
                    device: d,
                    addr: a,
                    size: b.size,
                    stream: b.stream,
                    site: b.site,
                    expandable: false,
                    blocks: tile(a, b.size, vec![(a, b.size, b.site)]),
                });
                continue;
            }
            let Some((&a, s)) = segs.next() else {
                break;
            };
            let mut seg = OutSeg {
                device: d,
                addr: a,
                size: s.size,
                stream: s.stream,
                site: s.site,
                expandable: s.kind == SegKind::Mapping,
                blocks: Vec::new(),
            };
            // Whole-segment blocks of the members that never held tensors.
            let mut blocks: Vec<(u64, u64, SiteId)> = Vec::new();
            if !s.hosts_tensors {
                blocks.push((a, s.size, s.block_site));
            }
            while let Some((&next, n)) = segs.peek() {
                let adjacent = seg.expandable
                    && n.kind == SegKind::Mapping
                    && seg.addr.saturating_add(seg.size) == next
                    && n.stream == seg.stream;
                if !adjacent {
                    break;
                }
                seg.size = seg.size.saturating_add(n.size);
                if !n.hosts_tensors {
                    blocks.push((next, n.size, n.block_site));
                }
                segs.next();
            }
            let end = seg.addr.saturating_add(seg.size);
            for (&a, b) in dev.blocks.range(seg.addr..end) {
                if !b.synthetic {
                    blocks.push((a, b.size, b.site));
                }
            }
            seg.blocks = tile(seg.addr, seg.size, blocks);
            emit(seg);
        }
    }
}

/// Blocks in address order covering `[addr, addr + size)` exactly: the live ones, `inactive`
/// between them. A block that would overlap another or stick out is left out (the trace never
/// produces one).
fn tile(addr: u64, size: u64, mut live: Vec<(u64, u64, SiteId)>) -> Vec<OutBlock> {
    live.sort_unstable_by_key(|b| b.0);
    let end = addr.saturating_add(size);
    let mut at = addr;
    let mut out = Vec::new();
    for (a, s, site) in live {
        if a < at || a.saturating_add(s) > end || s == 0 {
            continue;
        }
        if a > at {
            out.push(OutBlock {
                addr: at,
                size: a - at,
                state: "inactive",
                site: SiteId(0),
            });
        }
        out.push(OutBlock {
            addr: a,
            size: s,
            state: "active_allocated",
            site,
        });
        at = a + s;
    }
    if at < end {
        out.push(OutBlock {
            addr: at,
            size: end - at,
            state: "inactive",
            site: SiteId(0),
        });
    }
    out
}

struct SnapshotWriter<'a, W: Write> {
    p: Pickler<W>,
    sym: StackSymbolizer,
    process: &'a Process,
    /// Memo index of each site's frame list (shared by every entry of that site).
    frame_lists: HashMap<SiteId, u32>,
    /// Memo index of each distinct frame dict.
    frame_dicts: HashMap<(String, String, u32), u32>,
    clock: Clock,
}

impl<W: Write> SnapshotWriter<'_, W> {
    fn snapshot(&mut self, model: &Model) {
        let max_dev = model
            .devs
            .iter()
            .filter(|(_, d)| !d.trace.is_empty() || !d.segs.is_empty() || !d.blocks.is_empty())
            .map(|(&d, _)| d)
            .max();
        let n_dev = max_dev.map_or(0, |d| d as usize + 1);
        self.p.empty_dict();
        self.p.mark();
        self.p.str("segments");
        self.p.empty_list();
        let mut in_batch = 0;
        each_segment(model, |seg| {
            if in_batch == 0 {
                self.p.mark();
            }
            self.segment(&seg);
            in_batch += 1;
            if in_batch == super::pickle::BATCH {
                self.p.appends();
                in_batch = 0;
            }
        });
        if in_batch > 0 {
            self.p.appends();
        }
        self.p.str("device_traces");
        self.p.empty_list();
        self.p.mark();
        let empty = VecDeque::new();
        for d in 0..n_dev {
            let trace = model.devs.get(&(d as i16)).map_or(&empty, |dev| &dev.trace);
            self.trace(trace);
        }
        self.p.appends();
        let dropped: Vec<u64> = (0..n_dev)
            .map(|d| model.devs.get(&(d as i16)).map_or(0, |dev| dev.dropped))
            .collect();
        if dropped.iter().any(|&n| n > 0) {
            // Not a key of PyTorch's snapshots: the viewer ignores it; a reader of the pickle
            // learns that the history is cut.
            self.p.str("oomtrace");
            self.p.empty_dict();
            self.p.mark();
            self.p.str("max_entries");
            self.p.uint(model.max_entries as u64);
            self.p.str("dropped_entries");
            self.p.empty_list();
            self.p.mark();
            for n in dropped {
                self.p.uint(n);
            }
            self.p.appends();
            self.p.str("note");
            self.p.str(
                "device_traces holds the most recent max_entries entries of each device; \
                 older ones were left out (oomtrace export --max-entries 0 keeps all)",
            );
            self.p.setitems();
        }
        self.p.setitems();
    }

    fn segment(&mut self, s: &OutSeg) {
        let allocated: u64 = s
            .blocks
            .iter()
            .filter(|b| b.state != "inactive")
            .map(|b| b.size)
            .sum();
        self.p.empty_dict();
        self.p.mark();
        self.p.str("device");
        self.p.int(i64::from(s.device));
        self.p.str("address");
        self.p.uint(s.addr);
        self.p.str("total_size");
        self.p.uint(s.size);
        for key in ["allocated_size", "active_size", "requested_size"] {
            self.p.str(key);
            self.p.uint(allocated);
        }
        self.p.str("stream");
        self.p.int(s.stream);
        self.p.str("segment_type");
        self.p
            .str(if s.size <= 1 << 20 { "small" } else { "large" });
        self.p.str("segment_pool_id");
        self.p.int(0);
        self.p.int(0);
        self.p.tuple2();
        self.p.str("is_expandable");
        self.p.bool(s.expandable);
        self.p.str("frames");
        self.frames(s.site);
        self.p.str("blocks");
        self.p.empty_list();
        self.p.mark();
        for b in &s.blocks {
            self.p.empty_dict();
            self.p.mark();
            self.p.str("address");
            self.p.uint(b.addr);
            self.p.str("size");
            self.p.uint(b.size);
            self.p.str("requested_size");
            self.p.uint(b.size);
            self.p.str("state");
            self.p.str(b.state);
            self.p.str("frames");
            self.frames(b.site);
            self.p.setitems();
        }
        self.p.appends();
        self.p.setitems();
    }

    fn trace(&mut self, entries: &VecDeque<Entry>) {
        self.p.empty_list();
        let mut in_batch = 0;
        for e in entries {
            if e.hidden {
                continue;
            }
            if in_batch == 0 {
                self.p.mark();
            }
            self.entry(e);
            in_batch += 1;
            if in_batch == super::pickle::BATCH {
                self.p.appends();
                in_batch = 0;
            }
        }
        if in_batch > 0 {
            self.p.appends();
        }
    }

    fn entry(&mut self, e: &Entry) {
        self.p.empty_dict();
        self.p.mark();
        self.p.str("action");
        self.p.str(e.action.name());
        self.p.str("addr");
        self.p.uint(e.addr);
        self.p.str("size");
        self.p.uint(e.size);
        self.p.str("stream");
        self.p.int(e.stream);
        self.p.str("time_us");
        self.p.int(self.clock.time_us(e.ts_ns));
        if e.action == Action::Oom {
            self.p.str("device_free");
            self.p.uint(e.device_free);
        }
        self.p.str("frames");
        self.frames(e.site);
        self.p.setitems();
    }

    fn frames(&mut self, site: SiteId) {
        if let Some(&i) = self.frame_lists.get(&site) {
            self.p.get(i);
            return;
        }
        let frames = if site.0 == 0 {
            Vec::new()
        } else {
            self.sym.site(self.process, site)
        };
        self.p.empty_list();
        let i = self.p.memoize();
        self.frame_lists.insert(site, i);
        if frames.is_empty() {
            return;
        }
        self.p.mark();
        for f in &frames {
            let key = (frame_file(f), frame_name(f), f.line);
            if let Some(&i) = self.frame_dicts.get(&key) {
                self.p.get(i);
                continue;
            }
            self.p.empty_dict();
            let i = self.p.memoize();
            self.p.mark();
            self.p.str("filename");
            self.p.str(&key.0);
            self.p.str("line");
            self.p.int(i64::from(key.2));
            self.p.str("name");
            self.p.str(&key.1);
            self.p.setitems();
            self.frame_dicts.insert(key, i);
        }
        self.p.appends();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: SiteId = SiteId(0);

    /// The actions of device 0 as the snapshot writes them (whole-segment blocks of segments
    /// that held tensors left out).
    fn actions(m: &Model) -> Vec<(&'static str, u64, u64)> {
        m.devs[&0]
            .trace
            .iter()
            .filter(|e| !e.hidden)
            .map(|e| (e.action.name(), e.addr, e.size))
            .collect()
    }

    type Layout = Vec<(u64, u64, bool, Vec<(u64, u64, &'static str)>)>;

    fn layout(m: &Model) -> Layout {
        let mut out = Vec::new();
        each_segment(m, |s| {
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
        assert_eq!(m.devs[&0].dropped, 4);
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
        assert_eq!(m.devs[&0].dropped, 0);
    }
}
