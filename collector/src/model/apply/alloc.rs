//! Allocations and frees: the live tables, the device and site totals, and what the
//! observer is told of each (`Alloc` before it counts, `Free` after, `OutOfMemory`).

use oomtrace_proto::{Api, Event, MemoryClass, DEVICE_UNKNOWN};
use rustc_hash::FxHashMap;

use crate::model::device::{count_size, snapshot_due, PEAK_SITES};
use crate::model::process::LiveAlloc;
use crate::model::{Alloc, Free, Observer, OutOfMemory, Process, SiteId, SiteStats, HOST_DEVICE};

/// CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation share the value 2.
pub const OUT_OF_MEMORY: i32 = 2;

impl Process {
    /// An allocation: live, after the one it replaced at this address (whose free was lost).
    #[inline]
    pub(super) fn on_alloc<O: Observer + ?Sized>(&mut self, ev: &Event, api: Api, obs: &mut O) {
        let device = Self::device_for_class(api, ev.device);
        if let Some(old) = self.table(api).remove(&ev.ptr) {
            // The free of the previous owner of this address was lost.
            let gone = (
                old.device,
                old.site,
                old.size,
                old.api,
                old.birth,
                ev.ts_ns,
                old.reserve,
            );
            self.remove_live(obs, ev.ptr, gone, old.ts_ns, false);
        }
        let site = self.site_of(ev.stack);
        let birth = self.add_live(
            obs,
            ev.ptr,
            (device, site, ev.size, ev.ts_ns, api, ev.tid),
            true,
        );
        self.table(api).insert(
            ev.ptr,
            LiveAlloc {
                size: ev.size,
                device,
                site,
                api,
                ts_ns: ev.ts_ns,
                birth,
                reserve: false,
            },
        );
    }

    /// A free: its allocation is gone, or the free is counted as unmatched.
    #[inline]
    pub(super) fn on_free<O: Observer + ?Sized>(&mut self, ev: &Event, api: Api, obs: &mut O) {
        match self.table(api).remove(&ev.ptr) {
            Some(a) => {
                let gone = (
                    a.device, a.site, a.size, a.api, a.birth, ev.ts_ns, a.reserve,
                );
                self.remove_live(obs, ev.ptr, gone, a.ts_ns, true);
            }
            None => self.unmatched_frees += 1,
        }
    }

    /// A failed allocation: counted by (API, error, device); an out-of-memory is told.
    #[inline]
    pub(super) fn on_alloc_failed<O: Observer + ?Sized>(
        &mut self,
        ev: &Event,
        api: Api,
        obs: &mut O,
    ) {
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
                allowed_bytes: (api == Api::oomtrace_torch_alloc && ev.extra != 0)
                    .then_some(ev.extra),
            };
            obs.out_of_memory(self, &oom);
        }
    }

    /// A new live allocation: told to the observer (before it counts in the totals), then
    /// the totals and site aggregates. Returns what the observer said (its birth stamp).
    /// `count_event`: the event counts on the device too (in the lookup this makes anyway).
    pub(super) fn add_live<O: Observer + ?Sized>(
        &mut self,
        obs: &mut O,
        ptr: u64,
        (device, site, size, ts, api, tid): (i16, SiteId, u64, u64, Api, u32),
        count_event: bool,
    ) -> u32 {
        let (before, capacity) = if count_event {
            let d = self.device(device);
            d.events += 1;
            (d.live_bytes, d.capacity)
        } else {
            self.devices
                .get(&device)
                .map_or((0, None), |d| (d.live_bytes, d.capacity))
        };
        let birth = obs.alloc(
            self,
            &Alloc {
                ptr,
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
        if api.memory_class() == MemoryClass::Tensor {
            dev.tensor_bytes = dev.tensor_bytes.saturating_add(size);
            dev.tensor_count += 1;
            let t = &mut dev.tensor_tally;
            t.allocations += 1;
            t.bytes_allocated = t.bytes_allocated.saturating_add(size);
            count_size(&mut t.size_buckets, size);
            if dev.tensor_bytes > dev.tensor_peak_bytes {
                dev.tensor_peak_bytes = dev.tensor_bytes;
                t.peak_ts_ns = ts;
                if snapshot_due(
                    t.peak_sites.is_empty(),
                    t.peak_snap_bytes,
                    dev.tensor_peak_bytes,
                ) {
                    t.peak_pending = true;
                }
            }
        } else {
            dev.live_bytes = dev.live_bytes.saturating_add(size);
            dev.live_count += 1;
            dev.allocations += 1;
            dev.bytes_allocated = dev.bytes_allocated.saturating_add(size);
            count_size(&mut dev.size_buckets, size);
            if dev.live_bytes > dev.peak_bytes {
                dev.peak_bytes = dev.live_bytes;
                dev.peak_ts_ns = ts;
                if snapshot_due(
                    dev.peak_sites.is_empty(),
                    dev.peak_snap_bytes,
                    dev.peak_bytes,
                ) {
                    dev.peak_pending = true;
                }
            }
        }
        let s = match self.site_stats.entry((site, device)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                self.device_sites.entry(device).or_default().push(site);
                v.insert(SiteStats::default())
            }
        };
        s.enter_step(self.markers);
        s.live_bytes = s.live_bytes.saturating_add(size);
        s.live_count += 1;
        s.total_bytes = s.total_bytes.saturating_add(size);
        s.allocations += 1;
        s.peak_bytes = s.peak_bytes.max(s.live_bytes);
        s.api = Some(api);
        birth
    }

    /// A live allocation gone: the totals and site aggregates, then the observer.
    pub(super) fn remove_live<O: Observer + ?Sized>(
        &mut self,
        obs: &mut O,
        ptr: u64,
        (device, site, size, api, birth, ts, reserve): (i16, SiteId, u64, Api, u32, u64, bool),
        born_ns: u64,
        count_event: bool,
    ) {
        let tensor = api.memory_class() == MemoryClass::Tensor;
        let temporary = born_ns >= self.step_start_ts_ns;
        // One lookup of the device for a free (this runs for every one), a second only when
        // memory falls from a new peak.
        let dev = self.device(device);
        if count_event {
            dev.events += 1;
        }
        let pending = if tensor {
            dev.tensor_tally.peak_pending
        } else {
            dev.peak_pending
        };
        let dev = if pending {
            // Memory falls from a new peak: who holds it is who held the peak.
            let sites = self.largest_sites(device, PEAK_SITES, tensor);
            let dev = self.device(device);
            if tensor {
                dev.tensor_tally.peak_sites = sites;
                dev.tensor_tally.peak_snap_bytes = dev.tensor_bytes;
                dev.tensor_tally.peak_pending = false;
            } else {
                dev.peak_sites = sites;
                dev.peak_snap_bytes = dev.live_bytes;
                dev.peak_pending = false;
            }
            dev
        } else {
            dev
        };
        if !tensor && temporary {
            dev.temporary += 1;
        }
        if tensor {
            dev.tensor_bytes = dev.tensor_bytes.saturating_sub(size);
            dev.tensor_count = dev.tensor_count.saturating_sub(1);
            dev.tensor_tally.frees += 1;
            dev.tensor_tally.temporary += u64::from(temporary);
        } else {
            dev.live_bytes = dev.live_bytes.saturating_sub(size);
            dev.live_count = dev.live_count.saturating_sub(1);
            dev.frees += 1;
        }
        let (device_live, capacity) = (dev.live_bytes, dev.capacity);
        if let Some(s) = self.site_stats.get_mut(&(site, device)) {
            s.enter_step(self.markers);
            s.live_bytes = s.live_bytes.saturating_sub(size);
            s.live_count = s.live_count.saturating_sub(1);
            s.frees += 1;
            s.temporary += u64::from(temporary);
        }
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
            reserve,
        };
        obs.free(self, &free);
    }

    /// The live table of `api`'s allocations: tensors have their own address space.
    fn table(&mut self, api: Api) -> &mut FxHashMap<u64, LiveAlloc> {
        if api.memory_class() == MemoryClass::Tensor {
            &mut self.tensors
        } else {
            &mut self.live
        }
    }

    pub(super) fn device_for_class(api: Api, device: i16) -> i16 {
        if api.memory_class() == MemoryClass::HostPinned {
            HOST_DEVICE
        } else {
            device
        }
    }
}
