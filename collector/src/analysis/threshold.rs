//! Capacity warnings: tracked live bytes crossing 85 / 90 / 95 % of the device's capacity,
//! once per crossing. A threshold re-arms only after usage falls 5 points below it, so a
//! sawtooth around a line does not repeat the warning every step.
//!
//! Usage is this process's tracked memory over the capacity the driver reported (other
//! processes and the CUDA context are not counted, so the real headroom is smaller).

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::{
    Alert, Alerts, AllocObs, Cause, Change, Context, Detector, Evidence, Finding, Kind, Severity,
};
use crate::units::fmt_bytes;

const THRESHOLDS: [u32; 3] = [85, 90, 95];
const REARM_POINTS: f64 = 5.0;

#[derive(Clone, Debug, Serialize)]
pub struct ThresholdEvidence {
    pub percent: u32,
    pub crossings: u64,
    pub peak_percent: f64,
    pub capacity_bytes: u64,
    pub first_crossed_step: u32,
}

#[derive(Debug, Default, Clone)]
struct Line {
    armed: bool,
    crossings: u64,
    first: Option<(u32, u64)>,
}

#[derive(Debug, Default)]
struct DeviceLines {
    lines: [Line; 3],
    peak: f64,
    capacity: u64,
    /// The most live bytes seen at `capacity`: an allocation that leaves less live is no
    /// higher a percentage (the same division, of a smaller number), so it is not divided.
    peak_live: u64,
}

#[derive(Debug, Default)]
pub struct ThresholdDetector {
    devices: FxHashMap<i16, DeviceLines>,
    /// Some line fired on some device: until then a free has nothing to rearm (no lookup).
    fired: bool,
}

fn percent(live: u64, cap: u64) -> f64 {
    live as f64 * 100.0 / cap as f64
}

impl Detector for ThresholdDetector {
    fn on_alloc(&mut self, a: &AllocObs, out: &mut Alerts) {
        let Some(cap) = a.capacity.filter(|&c| c > 0 && a.device >= 0) else {
            return;
        };
        // Found without `entry` (which readies an insertion) at every allocation after the
        // device's first.
        let d = match self.devices.get_mut(&a.device) {
            Some(d) => d,
            None => self.devices.entry(a.device).or_insert_with(|| DeviceLines {
                lines: std::array::from_fn(|_| Line {
                    armed: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        if d.capacity != cap {
            d.capacity = cap;
            d.peak_live = 0;
        }
        // No higher than the peak, and no armed line at or below the peak: nothing to do.
        if a.device_live <= d.peak_live
            && d.lines
                .iter()
                .zip(THRESHOLDS)
                .all(|(l, t)| !l.armed || d.peak < f64::from(t))
        {
            return;
        }
        d.peak_live = d.peak_live.max(a.device_live);
        let pct = percent(a.device_live, cap);
        d.peak = d.peak.max(pct);
        for (i, &t) in THRESHOLDS.iter().enumerate() {
            let line = &mut d.lines[i];
            if line.armed && pct >= f64::from(t) {
                line.armed = false;
                self.fired = true;
                line.crossings += 1;
                line.first.get_or_insert((a.epoch, a.ts_ns));
                out.push(Alert {
                    finding: finding(a.device, t, line, d.peak, cap, a.device_live),
                    change: Change::New,
                    epoch: a.epoch,
                    ts_ns: a.ts_ns,
                });
            }
        }
    }

    fn on_free(&mut self, a: &AllocObs, _birth: u32) {
        if !self.fired {
            return;
        }
        let Some(d) = self.devices.get_mut(&a.device) else {
            return;
        };
        // Only a line that fired has anything to rearm.
        if d.capacity == 0 || d.lines.iter().all(|l| l.armed) {
            return;
        }
        let pct = percent(a.device_live, d.capacity);
        for (i, &t) in THRESHOLDS.iter().enumerate() {
            if pct < f64::from(t) - REARM_POINTS {
                d.lines[i].armed = true;
            }
        }
    }

    fn findings(&self, ctx: &Context<'_>) -> Vec<Finding> {
        let mut v = Vec::new();
        for (&device, d) in &self.devices {
            // The highest line crossed speaks for the device.
            if let Some(i) = (0..THRESHOLDS.len())
                .rev()
                .find(|&i| d.lines[i].crossings > 0)
            {
                let live = ctx.devices.get(&device).map(|s| s.peak_bytes).unwrap_or(0);
                v.push(finding(
                    device,
                    THRESHOLDS[i],
                    &d.lines[i],
                    d.peak,
                    d.capacity,
                    live,
                ));
            }
        }
        v
    }
}

fn finding(device: i16, t: u32, line: &Line, peak: f64, cap: u64, live: u64) -> Finding {
    Finding {
        kind: Kind::Threshold,
        level: if t >= 95 {
            Severity::Error
        } else {
            Severity::Warning
        }
        .into(),
        pid: 0,
        rank: None,
        device,
        site: Default::default(),
        stack: Vec::new(),
        oom: None,
        cause: Cause::NearCapacity,
        bytes: live,
        growth_bytes_per_step: None,
        growth_bytes_per_s: None,
        steps: None,
        count: line.crossings,
        api: None,
        message: format!(
            "device {device} reached {t} % of its {} ({} tracked, peak {peak:.1} %){}",
            fmt_bytes(cap),
            fmt_bytes(live),
            if line.crossings > 1 {
                format!(", {} times", line.crossings)
            } else {
                String::new()
            }
        ),
        hint: format!(
            "Less than {} % of the device is left for this process: a growing cache, a leak \
             or a larger batch will run out of memory. The leak and live-memory findings show \
             who holds it.",
            100 - t
        ),
        evidence: Some(Evidence::Threshold(ThresholdEvidence {
            percent: t,
            crossings: line.crossings,
            peak_percent: (peak * 10.0).round() / 10.0,
            capacity_bytes: cap,
            first_crossed_step: line.first.map(|f| f.0).unwrap_or(0),
        })),
        record: None,
        culprit: None,
        backward_node: None,
        site_name: String::new(),
        held: None,
        anatomy: None,
        parts: Vec::new(),
        levers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SiteId;
    use oomtrace_proto::Api;

    fn at(live: u64) -> AllocObs {
        AllocObs {
            device: 0,
            site: SiteId(1),
            size: 1,
            api: Api::cudaMalloc,
            epoch: 0,
            ts_ns: 1,
            device_live: live,
            capacity: Some(1000),
        }
    }

    #[test]
    fn once_per_crossing_with_hysteresis() {
        let mut t = ThresholdDetector::default();
        let mut out = Alerts::default();
        for live in [800, 860, 870, 860, 870, 910, 960] {
            t.on_alloc(&at(live), &mut out);
        }
        let pcts: Vec<String> = out.list.iter().map(|a| a.finding.message.clone()).collect();
        assert_eq!(out.list.len(), 3, "{pcts:?}");
        // Down to 82 % re-arms nothing (85 − 5 = 80); down to 79 % re-arms 85.
        t.on_free(&at(820), 0);
        t.on_alloc(&at(870), &mut out);
        assert_eq!(out.list.len(), 3);
        t.on_free(&at(790), 0);
        t.on_alloc(&at(870), &mut out);
        assert_eq!(out.list.len(), 4);
        assert_eq!(out.list[2].finding.level, Severity::Error.into());
    }
}
