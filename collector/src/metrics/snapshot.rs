//! What the metrics need of one process, copied out of its model and analysis by its
//! connection thread (see the module above for when): a few numbers per device, its current
//! findings counted by kind and level, its leak rates and its top call sites by live bytes.

use std::sync::Arc;

use super::names::{Asked, Names};
use crate::analysis::{Analysis, Kind};
use crate::model::{DeviceState, EndState, Process, SiteId, HOST_DEVICE};

/// Call sites exported per process by live bytes (`oomtrace_site_live_bytes`): a bound on the
/// series, whatever the number of sites.
pub const TOP_SITES: usize = 10;

#[derive(Clone, Debug, Default)]
pub struct ProcessSnapshot {
    /// The collector's connection (a pid may come back under a new one after an exec).
    pub conn: u32,
    pub pid: u32,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub exe: String,
    /// Still connected.
    pub running: bool,
    pub events: u64,
    pub lost_events: u64,
    pub devices: Vec<DeviceSnapshot>,
    /// Current findings: (kind, level) -> how many.
    pub findings: Vec<(&'static str, &'static str, u64)>,
    pub leak_rates: Vec<LeakRate>,
    pub top_sites: Vec<SiteLive>,
}

#[derive(Clone, Debug, Default)]
pub struct DeviceSnapshot {
    /// The `device` label: the CUDA ordinal, or `host` for pinned host memory.
    pub device: String,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// PyTorch's caching-allocator reserve (`--torch`), 0 otherwise.
    pub reserved_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

#[derive(Clone, Debug)]
pub struct LeakRate {
    pub device: String,
    /// The process's site (named at render time, see [`super::names`]).
    pub site: SiteId,
    pub bytes_per_step: Option<f64>,
    pub bytes_per_second: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct SiteLive {
    pub device: String,
    pub site: SiteId,
    pub live_bytes: u64,
}

/// The `device` label of a model device.
pub fn device_label(device: i16) -> String {
    if device == HOST_DEVICE {
        "host".into()
    } else {
        device.to_string()
    }
}

impl ProcessSnapshot {
    /// The metrics of `p` now. Costs O(devices + sites + findings); the sites it exports for
    /// the first time are handed to `names` (never symbolized here).
    pub fn of(p: &Process, a: &Analysis, names: &Arc<Names>, asked: &mut Asked) -> ProcessSnapshot {
        let shown = |d: &DeviceState| d.allocations > 0 || d.failed_allocations > 0;
        let devices = p
            .devices
            .iter()
            .filter(|(_, d)| shown(d))
            .map(|(&device, d)| DeviceSnapshot {
                device: device_label(device),
                live_bytes: d.live_bytes,
                peak_bytes: d.peak_bytes,
                reserved_bytes: d.torch_reserved_bytes.unwrap_or(0),
                allocations: d.allocations,
                frees: d.frees,
            })
            .collect();
        let mut name = |site: SiteId| {
            names.ask(asked, p, site);
            site
        };
        let findings_now = if a.failed { Vec::new() } else { a.findings(p) };
        let mut counted: Vec<(&'static str, &'static str, u64)> = Vec::new();
        let mut leak_rates = Vec::new();
        for f in &findings_now {
            let (kind, level) = (f.kind.name(), f.level.name());
            match counted
                .iter_mut()
                .find(|(k, l, _)| *k == kind && *l == level)
            {
                Some(c) => c.2 += 1,
                None => counted.push((kind, level, 1)),
            }
            if f.kind == Kind::Leak
                && (f.growth_bytes_per_step.is_some() || f.growth_bytes_per_s.is_some())
            {
                leak_rates.push(LeakRate {
                    device: device_label(f.device),
                    site: name(f.site),
                    bytes_per_step: f.growth_bytes_per_step,
                    bytes_per_second: f.growth_bytes_per_s,
                });
            }
        }
        let mut top: Vec<(SiteId, i16, u64)> = p
            .site_stats
            .iter()
            .filter(|(_, s)| s.live_bytes > 0)
            .map(|(&(site, device), s)| (site, device, s.live_bytes))
            .collect();
        let by_bytes = |a: &(SiteId, i16, u64), b: &(SiteId, i16, u64)| {
            b.2.cmp(&a.2).then(a.0 .0.cmp(&b.0 .0)).then(a.1.cmp(&b.1))
        };
        if top.len() > TOP_SITES {
            top.select_nth_unstable_by(TOP_SITES - 1, by_bytes);
            top.truncate(TOP_SITES);
        }
        top.sort_unstable_by(by_bytes);
        let top_sites = top
            .into_iter()
            .map(|(site, device, live_bytes)| SiteLive {
                device: device_label(device),
                site: name(site),
                live_bytes,
            })
            .collect();
        ProcessSnapshot {
            conn: p.conn,
            pid: p.pid(),
            rank: p.launch.rank,
            local_rank: p.launch.local_rank,
            world_size: p.launch.world_size,
            exe: p.hello.exe.clone(),
            running: p.end == EndState::Running,
            events: p.events,
            lost_events: p.lost_events(),
            devices,
            findings: counted,
            leak_rates,
            top_sites,
        }
    }
}
