//! Step markers and the driver's readings of a device's memory.

use oomtrace_proto::Event;

use crate::model::{MemInfo, Observer, Process};

impl Process {
    /// The driver's reading of a device's free and total memory, told to the observer.
    #[inline]
    pub(super) fn on_mem_info<O: Observer + ?Sized>(&mut self, ev: &Event, obs: &mut O) {
        if ev.device >= 0 {
            let dev = self.device(ev.device);
            // 0: the total is not known (a PyTorch snapshot's out-of-memory entry).
            if ev.size > 0 {
                dev.capacity = Some(ev.size);
            }
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

    /// A step marker: counted, and told to the observer.
    pub(in crate::model) fn on_marker<O: Observer + ?Sized>(&mut self, ts: u64, obs: &mut O) {
        self.markers += 1;
        self.step_start_ts_ns = self.step_start_ts_ns.max(ts);
        if self.markers == 1 {
            // Once per process: the base of each site's growth per step.
            for s in self.site_stats.values_mut() {
                s.live_at_first_step = s.live_bytes;
            }
        }
        obs.step(self, ts);
    }
}
