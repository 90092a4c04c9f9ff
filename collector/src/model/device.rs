//! Per-device state: each device's totals and peaks (`DeviceState`, with `Tally` for
//! PyTorch's tensors), failed allocations, each (site, device)'s aggregates (`SiteStats`),
//! and the questions asked of them (who holds a device's memory now, who held its peak).

use oomtrace_proto::{Api, MemoryClass, DEVICE_UNKNOWN};

use super::{Process, SiteId};

/// The pseudo-device under which pinned host memory is reported.
pub const HOST_DEVICE: i16 = DEVICE_UNKNOWN;

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
    /// Live tensors of PyTorch's caching allocator (its trace tracker): memory in use inside
    /// the segments counted in `live_bytes`.
    pub tensor_bytes: u64,
    pub tensor_count: u64,
    pub tensor_peak_bytes: u64,
    /// What PyTorch's caching allocator holds as segments, from its own segment events
    /// (None until the first one): its reserve, and nothing else's.
    pub torch_reserved_bytes: Option<u64>,
    /// How many segments make up `torch_reserved_bytes`.
    pub torch_segments: u64,
    /// The tensors' counterparts of the counters below (allocations, frees, temporaries, sizes,
    /// who held them at their peak): what a report about tensors reads.
    pub tensor_tally: Tally,
    /// Allocations freed in the step (between two markers) they were made in.
    pub temporary: u64,
    /// Allocations and bytes by size, in power-of-two buckets: index `i` holds sizes in
    /// `[2^(i-1), 2^i)` (0 holds size 0). Grown on demand, at most 65 entries.
    pub size_buckets: Vec<(u64, u64)>,
    /// The largest sites (site, live bytes, live allocations) at the device's peak, at most
    /// [`PEAK_SITES`], largest first. Taken when memory first falls from a new peak that is
    /// at least 1/64 (and 64 KiB) above the last snapshot's, so it shows who held memory
    /// within 1/64 of the peak; while `peak_pending`, the peak is now.
    pub peak_sites: Vec<(SiteId, u64, u64)>,
    pub peak_pending: bool,
    /// Live bytes when `peak_sites` was taken.
    pub peak_snap_bytes: u64,
}

/// Call sites kept per device from the moment of its peak.
pub const PEAK_SITES: usize = 32;

/// A device's counters for PyTorch's tensors (the trace tracker's `MemoryClass::Tensor`),
/// kept as [`DeviceState`] keeps them for CUDA allocations: the same questions (how many,
/// how big, who held the peak) asked of tensors instead of the segments that hold them.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub allocations: u64,
    pub frees: u64,
    /// Freed in the step they were made in.
    pub temporary: u64,
    pub bytes_allocated: u64,
    /// As [`DeviceState::size_buckets`].
    pub size_buckets: Vec<(u64, u64)>,
    /// When `DeviceState::tensor_peak_bytes` was reached.
    pub peak_ts_ns: u64,
    /// As [`DeviceState::peak_sites`], for tensor sites at the tensors' peak.
    pub peak_sites: Vec<(SiteId, u64, u64)>,
    pub peak_pending: bool,
    pub peak_snap_bytes: u64,
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
    pub frees: u64,
    /// Frees of allocations made in the same step (see [`DeviceState::temporary`]).
    pub temporary: u64,
    /// Live bytes when the first step marker came (0 for a site first seen after it): the
    /// base of its growth per step.
    pub live_at_first_step: u64,
    /// Allocations made here that PyTorch's caching allocator named its segments (reserve):
    /// a site of the allocator itself, not of a line that holds memory.
    pub reserve_allocations: u64,
    /// Live bytes when the current step began, kept lazily: valid while `step_seen` is the
    /// process's marker count (see [`SiteStats::live_at_last_step`]).
    live_at_step_start: u64,
    step_seen: u64,
}

impl SiteStats {
    /// Live bytes when the last step marker came: the end of the last whole step, before the
    /// teardown a program does at exit. `markers`: the process's count.
    pub fn live_at_last_step(&self, markers: u64) -> u64 {
        if self.step_seen == markers {
            self.live_at_step_start
        } else {
            self.live_bytes
        }
    }

    /// Remembers the live bytes at the start of the step, before the first change in it.
    pub(super) fn enter_step(&mut self, markers: u64) {
        if self.step_seen != markers {
            self.step_seen = markers;
            self.live_at_step_start = self.live_bytes;
        }
    }
}

impl Process {
    #[inline]
    pub(super) fn device(&mut self, d: i16) -> &mut DeviceState {
        self.devices.entry(d).or_default()
    }

    /// The `n` sites of `device` holding most memory now, as (site, live bytes, live
    /// allocations), largest first: those of tensors inside PyTorch's segments, or (`tensors`
    /// false) those of everything else (the segments hold the tensors' bytes).
    pub(super) fn largest_sites(
        &self,
        device: i16,
        n: usize,
        tensors: bool,
    ) -> Vec<(SiteId, u64, u64)> {
        let mut v: Vec<(SiteId, u64, u64)> = self
            .sites_on(device)
            .filter(|(_, s)| {
                s.live_bytes > 0
                    && s.api
                        .is_some_and(|a| a.memory_class() == MemoryClass::Tensor)
                        == tensors
            })
            .map(|(site, s)| (site, s.live_bytes, s.live_count))
            .collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Who held `device`'s memory at its peak: (site, bytes, allocations), largest first, at
    /// most [`PEAK_SITES`].
    pub fn peak_sites(&self, device: i16) -> Vec<(SiteId, u64, u64)> {
        match self.devices.get(&device) {
            Some(d) if d.peak_pending => self.largest_sites(device, PEAK_SITES, false),
            Some(d) => d.peak_sites.clone(),
            None => Vec::new(),
        }
    }

    /// Who held `device`'s tensors at their peak, as [`Process::peak_sites`].
    pub fn tensor_peak_sites(&self, device: i16) -> Vec<(SiteId, u64, u64)> {
        match self.devices.get(&device) {
            Some(d) if d.tensor_tally.peak_pending => self.largest_sites(device, PEAK_SITES, true),
            Some(d) => d.tensor_tally.peak_sites.clone(),
            None => Vec::new(),
        }
    }

    /// Whether PyTorch's trace tracker reported on `device` (its segments or its tensors):
    /// the device's memory is then told as tensors and PyTorch's reserve.
    pub fn tensors_traced(&self, device: i16) -> bool {
        self.devices
            .get(&device)
            .is_some_and(|d| d.torch_reserved_bytes.is_some() || d.tensor_tally.allocations > 0)
    }

    /// The call sites that allocated on `device`, with their aggregates there, in the order
    /// they first did: O(those sites), whatever the other devices hold.
    pub fn sites_on(&self, device: i16) -> impl Iterator<Item = (SiteId, &SiteStats)> + '_ {
        self.device_sites
            .get(&device)
            .into_iter()
            .flatten()
            .filter_map(move |&site| Some((site, self.site_stats.get(&(site, device))?)))
    }

    pub fn top_sites(&self, device: i16, n: usize) -> Vec<(SiteId, u64, u64)> {
        self.top_sites_where(device, n, |_| true)
    }

    /// The `n` sites of `device` holding most memory now, as (site, live bytes, live
    /// allocations), largest first; without PyTorch's segments where its tensors are traced
    /// (the tensors and the memory outside its allocator are who holds memory then).
    pub fn top_holders(&self, device: i16, n: usize) -> Vec<(SiteId, u64, u64)> {
        if self.tensors_traced(device) {
            self.top_sites_where(device, n, |s| s.reserve_allocations == 0)
        } else {
            self.top_sites(device, n)
        }
    }

    /// [`Process::top_sites`] among the sites whose counters pass `keep`.
    pub fn top_sites_where(
        &self,
        device: i16,
        n: usize,
        keep: impl Fn(&SiteStats) -> bool,
    ) -> Vec<(SiteId, u64, u64)> {
        let mut v: Vec<(SiteId, u64, u64)> = self
            .sites_on(device)
            .filter(|(_, s)| s.live_bytes > 0 && keep(s))
            .map(|(site, s)| (site, s.live_bytes, s.live_count))
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

/// The size-histogram bucket of `size`: sizes in `[2^(i-1), 2^i)` go to `i`, 0 to 0.
pub fn size_bucket(size: u64) -> usize {
    (u64::BITS - size.leading_zeros()) as usize
}

/// Counts one allocation of `size` in `buckets` (see [`DeviceState::size_buckets`]).
pub(super) fn count_size(buckets: &mut Vec<(u64, u64)>, size: u64) {
    let bucket = size_bucket(size);
    if buckets.len() <= bucket {
        buckets.resize(bucket + 1, (0, 0));
    }
    let b = &mut buckets[bucket];
    b.0 += 1;
    b.1 = b.1.saturating_add(size);
}

/// Whether a new peak (`peak` bytes) calls for another snapshot of the sites holding memory:
/// the first one, then only once the peak has grown by 1/64 (at least 64 KiB) since the last
/// (`snapped` bytes). A snapshot scans the sites, so a peak that creeps up with every
/// allocation costs at most a few hundred scans in a run. The device's peak and the tensors'
/// peak follow the same rule.
pub(super) fn snapshot_due(never_taken: bool, snapped: u64, peak: u64) -> bool {
    let step = (snapped / 64).max(64 << 10);
    never_taken || peak >= snapped.saturating_add(step)
}
