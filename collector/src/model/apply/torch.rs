//! What PyTorch's caching allocator tells: its segments (its reserve), and its own
//! statistics of each device after a step.

use oomtrace_proto::{Event, EventKind};

use crate::model::{Free, Observer, Process, TorchMemory};

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
            self.mark_reserve(ev.ptr, ev.ts_ns, obs);
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

    /// The allocation at `ptr` (the caching allocator's `cudaMalloc`, seen by the hooks just
    /// before) is a segment of PyTorch's allocator: reserve, whose tensors are traced one by
    /// one. Told once, so that the leak detectors stop counting it as a line's memory; the
    /// device's totals keep it (the GPU holds it).
    pub(super) fn mark_reserve<O: Observer + ?Sized>(&mut self, ptr: u64, ts: u64, obs: &mut O) {
        let Some(a) = self.live.get_mut(&ptr) else {
            return;
        };
        if a.reserve {
            return;
        }
        a.reserve = true;
        let a = a.clone();
        if let Some(s) = self.site_stats.get_mut(&(a.site, a.device)) {
            s.reserve_allocations += 1;
        }
        let dev = &self.devices[&a.device];
        let free = Free {
            device: a.device,
            site: a.site,
            size: a.size,
            api: a.api,
            ts_ns: ts,
            birth: a.birth,
            device_live: dev.live_bytes,
            capacity: dev.capacity,
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
