//! What PyTorch's caching allocator tells: its segments (its reserve), and its own
//! statistics of each device after a step.

use oomtrace_proto::{Api, Event, EventKind};

use crate::model::{Free, Observer, Process, SiteId, TorchMemory};

impl Process {
    /// A segment of PyTorch's caching allocator made (`Segment`) or given back (`SegmentFree`): its reserve.
    #[inline]
    pub(super) fn on_segment<O: Observer + ?Sized>(
        &mut self,
        ev: &Event,
        kind: EventKind,
        obs: &mut O,
    ) {
        if kind == EventKind::Segment {
            self.mark_reserve((ev.ptr, ev.size), ev.ts_ns, obs);
        }
        let dev = self.device(ev.device);
        dev.events += 1;
        dev.torch_segments = if kind == EventKind::Segment {
            dev.torch_segments + 1
        } else {
            dev.torch_segments.saturating_sub(1)
        };
        let reserved = dev.torch_reserved_bytes.unwrap_or(0);
        dev.torch_reserved_bytes = Some(if kind == EventKind::Segment {
            reserved.saturating_add(ev.size)
        } else {
            reserved.saturating_sub(ev.size)
        });
    }

    /// The segment at `ptr` is PyTorch's allocator's: reserve, whose tensors are traced one by
    /// one. Either the allocation at `ptr` (the caching allocator's `cudaMalloc`, seen by the
    /// hooks just before), or, with `expandable_segments:True`, the physical memory mapped into
    /// `[ptr, ptr + size)` (its `cuMemCreate`s, mapped just before). Each is told once, so that
    /// the leak detectors stop counting it as a line's memory; the device's totals keep it
    /// (the GPU holds it).
    pub(super) fn mark_reserve<O: Observer + ?Sized>(
        &mut self,
        (ptr, size): (u64, u64),
        ts: u64,
        obs: &mut O,
    ) {
        if let Some(a) = self.live.get_mut(&ptr) {
            if !a.reserve {
                a.reserve = true;
                let a = a.clone();
                self.reserve_told(ptr, (a.device, a.site, a.size, a.api, a.birth), ts, obs);
            }
            return;
        }
        let end = ptr.saturating_add(size.max(1));
        let handles: Vec<u64> = self
            .mappings
            .range(ptr..end)
            .map(|(_, m)| m.handle)
            .collect();
        for handle in handles {
            let Some(h) = self.handles.get_mut(&handle) else {
                continue;
            };
            if !h.reserve {
                h.reserve = true;
                let h = (h.device, h.site, h.size, Api::cuMemCreate, h.birth);
                self.reserve_told(handle, h, ts, obs);
            }
        }
    }

    /// One allocation newly reserve: counted at its site and told to the observer.
    fn reserve_told<O: Observer + ?Sized>(
        &mut self,
        ptr: u64,
        (device, site, size, api, birth): (i16, SiteId, u64, Api, u32),
        ts: u64,
        obs: &mut O,
    ) {
        if let Some(s) = self.site_stats.get_mut(&(site, device)) {
            s.reserve_allocations += 1;
        }
        let (device_live, capacity) = self
            .devices
            .get(&device)
            .map_or((0, None), |d| (d.live_bytes, d.capacity));
        let free = Free {
            ptr,
            device,
            site,
            size,
            api,
            ts_ns: ts,
            birth,
            device_live,
            capacity,
            reserve: true,
        };
        obs.reserve(self, &free);
    }

    /// PyTorch's own statistics of one device: the device's last reading, told to the
    /// observer. A device no process can have is garbage: counted, never a table entry.
    pub(super) fn on_torch_memory<O: Observer + ?Sized>(
        &mut self,
        m: &oomtrace_proto::wire::TorchMemory,
        obs: &mut O,
    ) {
        if !(0..oomtrace_proto::MAX_DEVICES).contains(&m.device) {
            self.implausible_torch_memory += 1;
            return;
        }
        let reading = TorchMemory {
            device: m.device,
            ts_ns: m.ts_ns,
            step: self.markers,
            allocated: m.allocated,
            max_allocated: m.max_allocated,
            reserved: m.reserved,
        };
        self.torch_memory.insert(m.device, reading);
        obs.torch_memory(self, &reading);
    }
}
