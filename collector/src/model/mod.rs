//! The model: what the collector knows about one traced process: its live allocations, VMM
//! handles and mappings, call sites, and per-device totals. Fed one frame at a time, in
//! stream order.
//!
//! The bottom layer: it imports nothing else of the crate, so accounting can be read, tested
//! and replayed (`oomtrace export`) without the detectors. What the analysis needs to know
//! (an allocation, a free, a step, a failure) is told to an [`Observer`] passed to
//! [`Process::apply`]; the model neither owns nor knows who listens.
//!
//! - [`trace`]: replays a trace file into processes, each beside its observer.
//! - [`history`]: shows each event of such a replay to a visitor (exporters).
//!
//! Memory is O(live allocations + sites + modules), never O(events): events only update
//! counters and the live tables.
//!
//! Accounting rules:
//! - Plain allocations are keyed by pointer (unique per process under unified addressing).
//! - VMM physical memory (`cuMemCreate`) is live while the handle has references (create and
//!   retain add one, release removes one) *or* is mapped: PyTorch and NCCL release while
//!   mapped. Handle values are reused by the driver, so a freed handle is forgotten at once.
//! - A free of an unknown pointer is counted as unmatched, never guessed at.

use std::collections::BTreeMap;

use oomtrace_proto::python::{CodeDef, PyFrame};
use oomtrace_proto::wire::{Frame, GoodbyeReason, Hello, Lost, ModuleDef};
use oomtrace_proto::{Api, Event, EventKind, MemoryClass, StackId, DEVICE_UNKNOWN};
use rustc_hash::FxHashMap;

mod error;
pub mod history;
mod observer;
pub mod trace;

pub use error::Error;
pub use observer::{Alloc, Free, MemInfo, Observer, OutOfMemory};

/// A deduplicated call site within one process. 0 = no stack recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteId(pub u32);

/// The pseudo-device under which pinned host memory is reported.
pub const HOST_DEVICE: i16 = DEVICE_UNKNOWN;

/// CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation share the value 2.
pub const OUT_OF_MEMORY: i32 = 2;

#[derive(Clone, Debug)]
pub struct LiveAlloc {
    pub size: u64,
    pub device: i16,
    pub site: SiteId,
    pub api: Api,
    pub ts_ns: u64,
    /// What the observer returned at its birth (the analysis's epoch), handed back at its free.
    pub birth: u32,
}

#[derive(Clone, Debug)]
pub struct PhysHandle {
    pub size: u64,
    pub device: i16,
    pub site: SiteId,
    /// As [`LiveAlloc::birth`].
    pub birth: u32,
    pub ts_ns: u64,
    pub refs: u32,
    pub mappings: u32,
}

#[derive(Clone, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
    pub offset: u64,
}

/// Totals of one device (or of pinned host memory under `HOST_DEVICE`).
#[derive(Clone, Debug, Default)]
pub struct DeviceState {
    /// Tracked live bytes now.
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_bytes: u64,
    pub peak_ts_ns: u64,
    /// Events attributed to this device.
    pub events: u64,
    pub allocations: u64,
    pub frees: u64,
    pub failed_allocations: u64,
    pub bytes_allocated: u64,
    /// Device capacity and free memory as last reported by the driver.
    pub capacity: Option<u64>,
    pub last_free: Option<u64>,
    /// Address space reserved with `cuMemAddressReserve` (not memory).
    pub reserved_va_bytes: u64,
    /// Physical VMM bytes currently mapped somewhere.
    pub mapped_bytes: u64,
}

/// Failed allocations of one (API, error, device).
#[derive(Clone, Debug, Default)]
pub struct AllocFailures {
    pub count: u64,
    /// Bytes asked for by the most recent one.
    pub last_size: u64,
    pub last_site: SiteId,
}

/// Per (site, device) aggregates.
#[derive(Clone, Debug, Default)]
pub struct SiteStats {
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_bytes: u64,
    pub total_bytes: u64,
    pub allocations: u64,
    /// The API that allocated most recently at this site.
    pub api: Option<Api>,
}

/// One frame of a stack, resolved to its module when the stack arrived.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawFrame {
    pub addr: u64,
    /// Index into `Process::modules`, if the address lay in a known module.
    pub module: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Module {
    pub def: ModuleDef,
    pub gone: bool,
}

/// The tables a call site's frames are read with (sites, modules, Python code objects):
/// what symbolization needs of a process, and no more.
#[derive(Clone, Copy, Debug)]
pub struct Stacks<'a> {
    /// Frames of each site; index = [`SiteId`].
    pub sites: &'a [Vec<RawFrame>],
    pub modules: &'a [Module],
    pub codes: &'a FxHashMap<u32, CodeDef>,
}

impl<'a> From<&'a Process> for Stacks<'a> {
    fn from(p: &'a Process) -> Stacks<'a> {
        Stacks {
            sites: &p.sites,
            modules: &p.modules,
            codes: &p.codes,
        }
    }
}

/// One symbolized frame (filled in by the report's symbolizer). Empty strings and 0 mean
/// unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrameInfo {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// File name of the module (executable or shared object).
    pub module: String,
    /// Absolute return address in the traced process, hex.
    pub address: String,
    /// Address within the module's file, hex (what `addr2line -e MODULE` takes).
    pub offset: String,
    /// A Python frame (`function` is the code object's qualified name, `line` its source
    /// line, `module` is "python", `offset` the bytecode offset).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
}

/// How a process's stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndState {
    /// Still connected (live collector) or the trace ends while it was.
    Running,
    /// Said goodbye.
    Exited(Option<GoodbyeReason>),
    /// Connection closed without a goodbye: killed, crashed, or its collector link broke.
    Abrupt,
    /// Dropped for sending garbage.
    ProtocolError,
}

#[derive(Debug)]
pub struct Process {
    pub conn: u32,
    pub hello: Hello,
    pub end: EndState,
    pub devices: BTreeMap<i16, DeviceState>,
    pub live: FxHashMap<u64, LiveAlloc>,
    pub handles: FxHashMap<u64, PhysHandle>,
    /// Mappings by VA start, ordered for range unmaps.
    pub mappings: BTreeMap<u64, Mapping>,
    pub reservations: FxHashMap<u64, (u64, i16)>,
    pub modules: Vec<Module>,
    /// Python code objects by the shim's code id (frames in `sites` refer to them).
    pub codes: FxHashMap<u32, CodeDef>,
    module_index: FxHashMap<u32, usize>,
    /// Shim stack id -> site (the shim may send one stack under several ids).
    stack_sites: FxHashMap<u32, SiteId>,
    site_index: FxHashMap<Vec<RawFrame>, SiteId>,
    /// Frames of each site; index = SiteId (0 is the empty "no stack" site).
    pub sites: Vec<Vec<RawFrame>>,
    pub site_stats: FxHashMap<(SiteId, i16), SiteStats>,
    pub lost: Lost,
    pub events: u64,
    pub unmatched_frees: u64,
    pub failed_frees: u64,
    /// Failed allocations by (API, error code, device): the error is what tells a user "no
    /// driver" from "out of memory", so each kind is counted apart.
    pub alloc_failures: BTreeMap<(Api, i32, i16), AllocFailures>,
    pub unknown_stacks: u64,
    pub markers: u64,
    pub last_marker: Option<String>,
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    pub last_seq: u64,
    pub cuda_initialized: bool,
}

impl Process {
    pub fn new(conn: u32, hello: Hello) -> Process {
        Process {
            conn,
            hello,
            end: EndState::Running,
            devices: BTreeMap::new(),
            live: FxHashMap::default(),
            handles: FxHashMap::default(),
            mappings: BTreeMap::new(),
            reservations: FxHashMap::default(),
            modules: Vec::new(),
            codes: FxHashMap::default(),
            module_index: FxHashMap::default(),
            stack_sites: FxHashMap::default(),
            site_index: FxHashMap::default(),
            sites: vec![Vec::new()],
            site_stats: FxHashMap::default(),
            lost: Lost::default(),
            events: 0,
            unmatched_frees: 0,
            failed_frees: 0,
            alloc_failures: BTreeMap::new(),
            unknown_stacks: 0,
            markers: 0,
            last_marker: None,
            first_ts_ns: 0,
            last_ts_ns: 0,
            last_seq: 0,
            cuda_initialized: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.hello.pid
    }

    /// The tables its call sites are read with.
    pub fn stacks(&self) -> Stacks<'_> {
        Stacks::from(self)
    }

    /// The command line, as one string.
    pub fn command(&self) -> String {
        if self.hello.argv.is_empty() {
            self.hello.exe.clone()
        } else {
            self.hello.argv.join(" ")
        }
    }

    /// Applies one frame of this process's stream, telling `obs` what happened.
    pub fn apply<O: Observer + ?Sized>(&mut self, frame: &Frame<'_>, obs: &mut O) {
        match frame {
            Frame::Events(batch) => {
                for ev in batch.iter() {
                    self.apply_event(&ev, obs);
                }
            }
            Frame::StackDef { id, frames } => self.define_stack(*id, frames),
            Frame::ModuleDef(def) => self.define_module(def.clone()),
            Frame::CodeDef(def) => {
                self.codes.insert(def.id, def.clone());
            }
            Frame::ModuleGone { id } => {
                if let Some(&i) = self.module_index.get(id) {
                    self.modules[i].gone = true;
                    self.module_index.remove(id);
                }
            }
            Frame::Marker {
                seq, ts_ns, label, ..
            } => {
                self.last_marker = Some(label.clone());
                self.touch(*seq, *ts_ns);
                self.on_marker(*ts_ns, obs);
            }
            Frame::Lost(l) => self.lost = l.clone(),
            Frame::Goodbye { reason, last_seq } => {
                self.end = EndState::Exited(GoodbyeReason::from_u8(*reason));
                self.last_seq = self.last_seq.max(*last_seq);
            }
            Frame::Hello(_) | Frame::Unknown { .. } => {}
        }
    }

    fn touch(&mut self, seq: u64, ts: u64) {
        if self.first_ts_ns == 0 {
            self.first_ts_ns = ts;
        }
        self.last_ts_ns = self.last_ts_ns.max(ts);
        self.last_seq = self.last_seq.max(seq);
    }

    fn define_module(&mut self, def: ModuleDef) {
        let id = def.id;
        self.modules.push(Module { def, gone: false });
        self.module_index.insert(id, self.modules.len() - 1);
    }

    fn module_of(&self, addr: u64) -> Option<usize> {
        // Return addresses point after the call; look up the call instruction.
        let a = addr.wrapping_sub(1);
        self.module_index.values().copied().find(|&i| {
            let d = &self.modules[i].def;
            d.start <= a && a < d.end
        })
    }

    fn define_stack(&mut self, id: StackId, frames: &[u64]) {
        let raw: Vec<RawFrame> = frames
            .iter()
            .map(|&addr| RawFrame {
                addr,
                module: if PyFrame::decode(addr).is_some() {
                    None
                } else {
                    self.module_of(addr)
                },
            })
            .collect();
        let site = match self.site_index.get(&raw) {
            Some(&s) => s,
            None => {
                let s = SiteId(self.sites.len() as u32);
                self.sites.push(raw.clone());
                self.site_index.insert(raw, s);
                s
            }
        };
        self.stack_sites.insert(id.0, site);
    }

    /// The call site a shim stack id stands for (0 if none or not yet defined); counts nothing.
    pub fn stack_site(&self, stack: StackId) -> SiteId {
        self.stack_sites.get(&stack.0).copied().unwrap_or_default()
    }

    fn site_of(&mut self, stack: StackId) -> SiteId {
        if stack.is_none() {
            return SiteId(0);
        }
        match self.stack_sites.get(&stack.0) {
            Some(&s) => s,
            None => {
                self.unknown_stacks += 1;
                SiteId(0)
            }
        }
    }

    fn device(&mut self, d: i16) -> &mut DeviceState {
        self.devices.entry(d).or_default()
    }

    /// A step marker: counted, and told to the observer.
    fn on_marker<O: Observer + ?Sized>(&mut self, ts: u64, obs: &mut O) {
        self.markers += 1;
        obs.step(self, ts);
    }

    /// A new live allocation: told to the observer (before it counts in the totals), then
    /// the totals and site aggregates. Returns what the observer said (its birth stamp).
    fn add_live<O: Observer + ?Sized>(
        &mut self,
        obs: &mut O,
        (device, site, size, ts, api, tid): (i16, SiteId, u64, u64, Api, u32),
    ) -> u32 {
        let (before, capacity) = self
            .devices
            .get(&device)
            .map_or((0, None), |d| (d.live_bytes, d.capacity));
        let birth = obs.alloc(
            self,
            &Alloc {
                device,
                site,
                size,
                api,
                ts_ns: ts,
                tid,
                device_live_before: before,
                capacity,
            },
        );
        let dev = self.device(device);
        dev.live_bytes = dev.live_bytes.saturating_add(size);
        dev.live_count += 1;
        dev.allocations += 1;
        dev.bytes_allocated = dev.bytes_allocated.saturating_add(size);
        if dev.live_bytes > dev.peak_bytes {
            dev.peak_bytes = dev.live_bytes;
            dev.peak_ts_ns = ts;
        }
        let s = self.site_stats.entry((site, device)).or_default();
        s.live_bytes = s.live_bytes.saturating_add(size);
        s.live_count += 1;
        s.total_bytes = s.total_bytes.saturating_add(size);
        s.allocations += 1;
        s.peak_bytes = s.peak_bytes.max(s.live_bytes);
        s.api = Some(api);
        birth
    }

    /// A live allocation gone: the totals and site aggregates, then the observer.
    fn remove_live<O: Observer + ?Sized>(
        &mut self,
        obs: &mut O,
        (device, site, size, api, birth, ts): (i16, SiteId, u64, Api, u32, u64),
    ) {
        let dev = self.device(device);
        dev.live_bytes = dev.live_bytes.saturating_sub(size);
        dev.live_count = dev.live_count.saturating_sub(1);
        dev.frees += 1;
        if let Some(s) = self.site_stats.get_mut(&(site, device)) {
            s.live_bytes = s.live_bytes.saturating_sub(size);
            s.live_count = s.live_count.saturating_sub(1);
        }
        let dev = &self.devices[&device];
        let free = Free {
            device,
            site,
            size,
            api,
            ts_ns: ts,
            birth,
            device_live: dev.live_bytes,
            capacity: dev.capacity,
        };
        obs.free(self, &free);
    }

    /// Frees a VMM handle's physical memory once nothing holds it.
    fn maybe_release_handle<O: Observer + ?Sized>(&mut self, handle: u64, ts: u64, obs: &mut O) {
        let done = matches!(self.handles.get(&handle), Some(h) if h.refs == 0 && h.mappings == 0);
        if done {
            if let Some(h) = self.handles.remove(&handle) {
                let gone = (h.device, h.site, h.size, Api::cuMemCreate, h.birth, ts);
                self.remove_live(obs, gone);
            }
        }
    }

    fn device_for_class(api: Api, device: i16) -> i16 {
        if api.memory_class() == MemoryClass::HostPinned {
            HOST_DEVICE
        } else {
            device
        }
    }

    /// Applies one event, telling `obs` what happened.
    pub fn apply_event<O: Observer + ?Sized>(&mut self, ev: &Event, obs: &mut O) {
        self.events += 1;
        self.touch(ev.seq, ev.ts_ns);
        let Some(kind) = ev.kind() else { return };
        let api = ev.api();
        match kind {
            EventKind::Alloc => {
                let device = Self::device_for_class(api, ev.device);
                if let Some(old) = self.live.remove(&ev.ptr) {
                    // The free of the previous owner of this address was lost.
                    let gone = (old.device, old.site, old.size, old.api, old.birth, ev.ts_ns);
                    self.remove_live(obs, gone);
                }
                let site = self.site_of(ev.stack);
                self.device(device).events += 1;
                let birth = self.add_live(obs, (device, site, ev.size, ev.ts_ns, api, ev.tid));
                self.live.insert(
                    ev.ptr,
                    LiveAlloc {
                        size: ev.size,
                        device,
                        site,
                        api,
                        ts_ns: ev.ts_ns,
                        birth,
                    },
                );
            }
            EventKind::Free => match self.live.remove(&ev.ptr) {
                Some(a) => {
                    self.device(a.device).events += 1;
                    self.remove_live(obs, (a.device, a.site, a.size, a.api, a.birth, ev.ts_ns));
                }
                None => self.unmatched_frees += 1,
            },
            EventKind::FreeFailed => self.failed_frees += 1,
            EventKind::AllocFailed => {
                let device = Self::device_for_class(api, ev.device);
                let site = self.site_of(ev.stack);
                let failures = self
                    .alloc_failures
                    .entry((api, ev.result, device))
                    .or_default();
                failures.count += 1;
                failures.last_size = ev.size;
                failures.last_site = site;
                if device == DEVICE_UNKNOWN && api.memory_class() != MemoryClass::HostPinned {
                    // No device at all (no driver, no device visible): not pinned host memory,
                    // whose slot shares the number. Kept in `alloc_failures` only.
                    return;
                }
                let dev = self.device(device);
                dev.events += 1;
                dev.failed_allocations += 1;
                let live_bytes = dev.live_bytes;
                if ev.result == OUT_OF_MEMORY {
                    let oom = OutOfMemory {
                        seq: ev.seq,
                        ts_ns: ev.ts_ns,
                        api,
                        result: ev.result,
                        device,
                        size: ev.size,
                        site,
                        tid: ev.tid,
                        live_bytes,
                    };
                    obs.out_of_memory(self, &oom);
                }
            }
            EventKind::PhysCreate => {
                let site = self.site_of(ev.stack);
                self.device(ev.device).events += 1;
                if let Some(old) = self.handles.remove(&ev.ptr) {
                    let gone = (old.device, old.site, old.size, api, old.birth, ev.ts_ns);
                    self.remove_live(obs, gone);
                }
                let birth = self.add_live(obs, (ev.device, site, ev.size, ev.ts_ns, api, ev.tid));
                self.handles.insert(
                    ev.ptr,
                    PhysHandle {
                        size: ev.size,
                        device: ev.device,
                        site,
                        birth,
                        ts_ns: ev.ts_ns,
                        refs: 1,
                        mappings: 0,
                    },
                );
            }
            EventKind::PhysRetain => match self.handles.get_mut(&ev.ptr) {
                Some(h) => h.refs += 1,
                None => self.unmatched_frees += 1,
            },
            EventKind::PhysRelease => {
                match self.handles.get_mut(&ev.ptr) {
                    Some(h) => {
                        h.refs = h.refs.saturating_sub(1);
                        let d = h.device;
                        self.device(d).events += 1;
                    }
                    None => self.unmatched_frees += 1,
                }
                self.maybe_release_handle(ev.ptr, ev.ts_ns, obs);
            }
            EventKind::Map => {
                if let Some(h) = self.handles.get_mut(&ev.aux) {
                    h.mappings += 1;
                    let d = h.device;
                    let dev = self.device(d);
                    dev.events += 1;
                    dev.mapped_bytes = dev.mapped_bytes.saturating_add(ev.size);
                }
                self.mappings.insert(
                    ev.ptr,
                    Mapping {
                        size: ev.size,
                        handle: ev.aux,
                        offset: ev.extra,
                    },
                );
            }
            EventKind::Unmap => {
                let end = ev.ptr.saturating_add(ev.size.max(1));
                let gone: Vec<u64> = self
                    .mappings
                    .range(ev.ptr..end)
                    .map(|(&va, _)| va)
                    .collect();
                for va in gone {
                    if let Some(m) = self.mappings.remove(&va) {
                        if let Some(h) = self.handles.get_mut(&m.handle) {
                            h.mappings = h.mappings.saturating_sub(1);
                            let d = h.device;
                            let dev = self.device(d);
                            dev.events += 1;
                            dev.mapped_bytes = dev.mapped_bytes.saturating_sub(m.size);
                        }
                        self.maybe_release_handle(m.handle, ev.ts_ns, obs);
                    }
                }
            }
            EventKind::VaReserve => {
                self.reservations.insert(ev.ptr, (ev.size, ev.device));
                let dev = self.device(ev.device);
                dev.reserved_va_bytes = dev.reserved_va_bytes.saturating_add(ev.size);
            }
            EventKind::VaFree => {
                if let Some((size, d)) = self.reservations.remove(&ev.ptr) {
                    let dev = self.device(d);
                    dev.reserved_va_bytes = dev.reserved_va_bytes.saturating_sub(size);
                }
            }
            EventKind::MemInfo => {
                if ev.device >= 0 {
                    let dev = self.device(ev.device);
                    dev.capacity = Some(ev.size);
                    dev.last_free = Some(ev.ptr);
                    let info = MemInfo {
                        device: ev.device,
                        tid: ev.tid,
                        free: ev.ptr,
                        total: ev.size,
                    };
                    obs.mem_info(self, &info);
                }
            }
            EventKind::Marker => self.on_marker(ev.ts_ns, obs),
            EventKind::Init => self.cuda_initialized |= ev.result == 0,
        }
    }

    /// The `n` sites holding the most live bytes on `device`: (site, bytes, count).
    pub fn top_sites(&self, device: i16, n: usize) -> Vec<(SiteId, u64, u64)> {
        let mut v: Vec<(SiteId, u64, u64)> = self
            .site_stats
            .iter()
            .filter(|((_, d), s)| *d == device && s.live_bytes > 0)
            .map(|((site, _), s)| (*site, s.live_bytes, s.live_count))
            .collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Lost events attributed to `device` by the shim.
    pub fn lost_on(&self, device: i16) -> u64 {
        self.lost
            .by_device
            .iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn pinned_host_memory_is_kept_apart() {
        let mut p = proc();
        p.apply_event(&ev(EventKind::Alloc, Api::cudaMallocHost, 0xa, 10), &mut ());
        p.apply_event(&ev(EventKind::Alloc, Api::cudaMalloc, 0xb, 20), &mut ());
        assert_eq!(p.devices[&HOST_DEVICE].live_bytes, 10);
        assert_eq!(p.devices[&0].live_bytes, 20);
    }
}
