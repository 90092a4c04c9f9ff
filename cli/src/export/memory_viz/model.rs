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

/// A trace entry's `action`.
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
}

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
mod tests {
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
}
