//! The allocator model: PyTorch's caching-allocator state (segments, the blocks inside them,
//! the per-device trace entries) rebuilt from our events, as `torch.cuda.memory._snapshot()`
//! would have reported it. The mapping of events to segments, blocks and entries is described
//! in the parent module; this file implements it and nothing of the pickle, so it is tested on
//! synthetic events alone.
//!
//! Feed it a process's events in order with [`Model::on_event`] (with a [`Context`] that
//! answers from the process's state just before each event); read the result with
//! [`Model::entries`] (each device's trace, oldest first), [`Model::each_segment`] (the final
//! segments with their blocks tiled) and the counters of entries left out of the ring.
//!
//! Memory: the live segments and blocks and at most `max_entries` entries per device; an
//! entry that must disappear later (the whole-segment block of a segment that comes to hold
//! tensors) is hidden in place, found by its index in the ring.

use std::collections::{BTreeMap, HashMap, VecDeque};

use oomtrace_proto::{Api, Event, EventKind};

use crate::export::view::{Site, OUT_OF_MEMORY};

/// What the model needs to know of the process besides the event itself, as it stood just
/// before the event.
pub trait Context {
    /// The driver's last free-memory reading of `device`.
    fn last_free(&self, device: i16) -> Option<u64>;
    /// The device and creation site of the physical allocation `handle`.
    fn handle(&self, handle: u64) -> Option<(i16, Site)>;
}

/// A trace entry's `action`: the format's one vocabulary, which its reader has too.
pub use oomtrace_collector::snapshot::Action;

/// One entry of a device's trace.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub action: Action,
    /// A whole-segment block's alloc whose segment later held tensor blocks: not written.
    hidden: bool,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    /// Monotonic time of the event (ns).
    pub ts_ns: u64,
    pub site: Site,
    /// For `oom`: the driver's free memory after the failure (else its last reading).
    pub device_free: u64,
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
    site: Site,
    /// Frames of its whole-segment block (for a mapping: the handle's creation).
    block_site: Site,
    kind: SegKind,
    /// It has held a tensor block: the tensors are its blocks, not the whole segment.
    hosts_tensors: bool,
    /// Index (in the device's entry stream) of its whole-segment block's `alloc` entry.
    block_entry: u64,
}

impl Seg {
    fn new(kind: SegKind, size: u64, stream: i64, site: Site, block_site: Site) -> Seg {
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
    site: Site,
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
pub struct Model {
    devs: BTreeMap<i16, Dev>,
    /// Entries kept per device (0: all).
    max_entries: usize,
    /// OOM entries waiting for the driver's reading that follows them: (device, tid) -> the
    /// entry's stream index.
    pending_oom: HashMap<(i16, u32), u64>,
    /// Whether any VMM mapping was seen (PyTorch maps memory only with expandable segments).
    mapped: bool,
}

impl Model {
    /// A model that keeps the most recent `max_entries` entries per device (0: all).
    pub fn new(max_entries: usize) -> Model {
        Model {
            max_entries,
            ..Model::default()
        }
    }

    /// Entries kept per device (0: all).
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Whether the process mapped memory through the VMM API (as expandable segments do).
    pub fn mapped(&self) -> bool {
        self.mapped
    }

    /// Devices the snapshot lists: every ordinal up to the highest with any entry, segment
    /// or block.
    pub fn device_count(&self) -> usize {
        self.devs
            .iter()
            .filter(|(_, d)| !d.trace.is_empty() || !d.segs.is_empty() || !d.blocks.is_empty())
            .map(|(&d, _)| d)
            .max()
            .map_or(0, |d| d as usize + 1)
    }

    /// Device `d`'s trace entries as written, oldest first.
    pub fn entries(&self, d: i16) -> impl Iterator<Item = &Entry> {
        self.devs
            .get(&d)
            .into_iter()
            .flat_map(|dev| dev.trace.iter().filter(|e| !e.hidden))
    }

    /// Entries of device `d` that fell out of the ring.
    pub fn dropped(&self, d: i16) -> u64 {
        self.devs.get(&d).map_or(0, |dev| dev.dropped)
    }

    /// Entries that fell out of the ring, all devices.
    pub fn dropped_entries(&self) -> u64 {
        self.devs.values().map(|d| d.dropped).sum()
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
        site: Site,
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
        self.mapped |= seg.kind == SegKind::Mapping;
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

    fn tensor_alloc(&mut self, d: i16, addr: u64, size: u64, stream: i64, ts: u64, site: Site) {
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

    /// Applies one event of the process (`site`: its call site); `cx` answers from the
    /// process's state just before it.
    pub fn on_event(&mut self, cx: &impl Context, ev: &Event, site: Site) {
        let Some(kind) = ev.kind() else { return };
        let api = ev.api();
        let ts = ev.ts_ns;
        match kind {
            EventKind::Alloc => {
                let tensor = matches!(api, Api::oomtrace_malloc | Api::oomtrace_torch_alloc);
                let shown = tensor || api.memory_class().on_device();
                if !shown || ev.device < 0 || ev.size == 0 || ev.ptr == 0 {
                    return;
                }
                let stream = ev.aux as i64;
                if tensor {
                    self.tensor_alloc(ev.device, ev.ptr, ev.size, stream, ts, site);
                } else {
                    let seg = Seg::new(SegKind::Driver, ev.size, stream, site, site);
                    self.driver_alloc(ev.device, ev.ptr, ts, seg);
                }
            }
            EventKind::Free => {
                let tensor = matches!(api, Api::oomtrace_free | Api::oomtrace_torch_free);
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
                let free = cx.last_free(d).unwrap_or(0);
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
                let (d, block_site) = cx.handle(ev.aux).unwrap_or((ev.device, site));
                if d < 0 || ev.size == 0 {
                    return;
                }
                let seg_site = if site.is_none() { block_site } else { site };
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

/// One block of a final segment.
pub struct OutBlock {
    pub addr: u64,
    pub size: u64,
    /// `active_allocated`, or `inactive` for the gaps between live blocks.
    pub state: &'static str,
    pub site: Site,
}

/// One segment of the final state.
pub struct OutSeg {
    pub device: i16,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub site: Site,
    /// A run of VMM mappings (PyTorch's expandable segments).
    pub expandable: bool,
    /// Tiling the segment in address order.
    pub blocks: Vec<OutBlock>,
}

impl Model {
    /// The final `segments`, one at a time in (device, address) order (never all at once:
    /// with millions of live allocations that list alone was gigabytes): live segments
    /// (adjacent mappings of one stream merged), blocks tiling each one, and the synthetic
    /// segments of tensor blocks that lie in no traced segment.
    pub fn each_segment(&self, mut emit: impl FnMut(OutSeg)) {
        for (&d, dev) in &self.devs {
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
                let mut blocks: Vec<(u64, u64, Site)> = Vec::new();
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
}

/// Blocks in address order covering `[addr, addr + size)` exactly: the live ones, `inactive`
/// between them. A block that would overlap another or stick out is left out (the trace never
/// produces one).
fn tile(addr: u64, size: u64, mut live: Vec<(u64, u64, Site)>) -> Vec<OutBlock> {
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
                site: Site::NONE,
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
            site: Site::NONE,
        });
    }
    out
}

#[cfg(test)]
mod tests;
