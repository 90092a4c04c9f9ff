//! Detectors: what turns a stream of allocations into findings, while the job runs.
//!
//! Each detector is one file behind [`Detector`]: O(1) work per event, its statistics once per
//! epoch ([`crate::epoch`]), and the findings it stands by at any moment. They run inside
//! [`crate::state::Process`], identically in the live collector and in a replay of its trace,
//! so what `oomtrace run` printed while the job ran is what `oomtrace report` shows later.
//!
//! - [`growth`]: leaks per call site and device (docs/detection.md).
//! - [`device_growth`]: the process's total on each device rising step after step, whoever
//!   allocates it (the view that still works when a caching allocator spreads a leak over
//!   many call sites); runs after `growth` and reads its per-site generations.
//! - [`fragmentation`]: allocator retries, failures with free memory, reserved-minus-live creep.
//! - [`oom`]: forensics at each failed allocation (the report opens with them).
//! - [`threshold`]: 85 / 90 / 95 % of device capacity, once per crossing.
//!
//! To add a detector: a file here, a field in [`Detectors`], one line in each of its loops.
//! A detector that reads another's state at an epoch's end (device growth reads the leaks')
//! gets an inherent method called after that one's, instead of `Detector::on_epoch_end`.

pub mod device_growth;
pub mod fragmentation;
pub mod growth;
pub mod oom;
#[cfg(test)]
mod sim;
pub mod stats;
pub mod threshold;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::epoch::EpochClock;
use crate::state::{DeviceState, SiteId};
use oomtrace_proto::Api;

/// Severity, in the report's words. Leaks use the last three.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Info,
    Warning,
    Error,
    Suspected,
    Likely,
    Confirmed,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
            Level::Suspected => "suspected",
            Level::Likely => "likely",
            Level::Confirmed => "confirmed",
        }
    }
}

/// What a finding is about. Its `name` is the report's `kind` (the JSON contract: names are
/// added, never changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Oom,
    /// A call site whose memory survives step after step.
    Leak,
    /// A device whose total keeps growing step after step, whoever allocates it.
    DeviceGrowth,
    Fragmentation,
    Threshold,
    /// A call site that looked like a leak but whose growth stopped, slowed or is shape-keyed.
    Growth,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Oom => "oom",
            Kind::Leak => "leak",
            Kind::DeviceGrowth => "device_growth",
            Kind::Fragmentation => "fragmentation",
            Kind::Threshold => "threshold",
            Kind::Growth => "growth",
        }
    }
}

/// What changed when an alert was raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    New,
    Upgraded,
    /// Evidence now points away from a leak (growth slowed, sizes are all new).
    Downgraded,
    /// Growth stopped long enough ago.
    Resolved,
}

/// A finding as it happens: what the live collector prints. Sites are raw; the printer
/// symbolizes them.
#[derive(Clone, Debug)]
pub struct Alert {
    pub finding: Finding,
    pub change: Change,
    pub epoch: u32,
    pub ts_ns: u64,
}

/// A finding before symbolization. `crate::report` turns it into the JSON contract.
#[derive(Clone, Debug)]
pub struct Finding {
    pub kind: Kind,
    pub level: Level,
    pub device: i16,
    pub site: SiteId,
    pub bytes: u64,
    pub growth_bytes_per_step: Option<f64>,
    pub growth_bytes_per_s: Option<f64>,
    pub steps: Option<u64>,
    pub count: u64,
    pub api: Option<Api>,
    /// What was seen, one sentence, without the call site (the report shows its stack).
    pub message: String,
    /// The likely cause, in a PyTorch user's words; what the evidence cannot show is not
    /// claimed.
    pub hint: String,
    pub evidence: Option<Evidence>,
    /// For OOM findings: the index of their record in [`oom::OomDetector::records`].
    pub record: Option<usize>,
}

/// The numbers behind a finding.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Evidence {
    /// Boxed: a leak's evidence (its samples and history) is several times the others'.
    Leak(Box<growth::LeakEvidence>),
    DeviceGrowth(Box<device_growth::DeviceGrowthEvidence>),
    Fragmentation(fragmentation::FragEvidence),
    Threshold(threshold::ThresholdEvidence),
}

/// One allocation, as the detectors see it.
#[derive(Clone, Copy, Debug)]
pub struct AllocObs {
    pub device: i16,
    pub site: SiteId,
    pub size: u64,
    pub api: Api,
    /// The epoch it was born in.
    pub epoch: u32,
    pub ts_ns: u64,
    /// Tracked live bytes on the device after it.
    pub device_live: u64,
    pub capacity: Option<u64>,
}

/// What every detector may read at an epoch boundary or when the report is built.
pub struct Context<'a> {
    /// The epoch that just ended (at a boundary) or the current one (for a report).
    pub epoch: u32,
    pub ts_ns: u64,
    pub clock: &'a EpochClock,
    pub devices: &'a BTreeMap<i16, DeviceState>,
    /// The process has ended (said goodbye, or its stream ended): what it freed after its
    /// last step was freed on its way out.
    pub ended: bool,
}

pub trait Detector {
    fn on_alloc(&mut self, _a: &AllocObs, _out: &mut Alerts) {}
    /// A free of an allocation born in epoch `birth`.
    fn on_free(&mut self, _a: &AllocObs, _birth: u32) {}
    fn on_epoch_end(&mut self, _ctx: &Context<'_>, _out: &mut Alerts) {}
    /// The findings this detector stands by now.
    fn findings(&self, ctx: &Context<'_>) -> Vec<Finding>;
}

/// How many alerts a process keeps (a flapping site must not grow memory).
const MAX_ALERTS: usize = 4096;

/// Alerts raised so far, in order; the live printer keeps a cursor into them.
#[derive(Debug, Default)]
pub struct Alerts {
    pub list: Vec<Alert>,
    pub dropped: u64,
}

impl Alerts {
    pub fn push(&mut self, a: Alert) {
        if self.list.len() < MAX_ALERTS {
            self.list.push(a);
        } else {
            self.dropped += 1;
        }
    }
}

/// All detectors of one process.
#[derive(Debug, Default)]
pub struct Detectors {
    pub growth: growth::GrowthDetector,
    pub device_growth: device_growth::DeviceGrowthDetector,
    pub fragmentation: fragmentation::FragmentationDetector,
    pub threshold: threshold::ThresholdDetector,
    pub oom: oom::OomDetector,
    pub alerts: Alerts,
}

impl Detectors {
    pub fn on_alloc(&mut self, a: &AllocObs) {
        self.growth.on_alloc(a, &mut self.alerts);
        self.device_growth.on_alloc(a, &mut self.alerts);
        self.fragmentation.on_alloc(a, &mut self.alerts);
        self.threshold.on_alloc(a, &mut self.alerts);
        if let Some(r) = self.oom.take_retry(a) {
            self.fragmentation
                .on_retry(&r, a.epoch, a.ts_ns, &mut self.alerts);
        }
    }

    pub fn on_free(&mut self, a: &AllocObs, birth: u32) {
        self.growth.on_free(a, birth);
        self.device_growth.on_free(a, birth);
        self.fragmentation.on_free(a, birth);
        self.threshold.on_free(a, birth);
        self.oom.on_free(a, birth);
    }

    pub fn on_epoch_end(&mut self, ctx: &Context<'_>) {
        self.growth.on_epoch_end(ctx, &mut self.alerts);
        // After the leaks: it reads their generations and findings.
        self.device_growth
            .on_epoch_end_after_leaks(ctx, &self.growth, &mut self.alerts);
        self.fragmentation.on_epoch_end(ctx, &mut self.alerts);
        self.threshold.on_epoch_end(ctx, &mut self.alerts);
    }

    /// Every finding, OOMs first.
    pub fn findings(&self, ctx: &Context<'_>) -> Vec<Finding> {
        let mut v = self.oom.findings(ctx);
        v.extend(self.growth.findings(ctx));
        v.extend(self.device_growth.findings(ctx));
        v.extend(self.fragmentation.findings(ctx));
        v.extend(self.threshold.findings(ctx));
        v
    }
}

/// "+1.00 MiB/step (2.10 MiB/s)".
pub fn fmt_rate(per_step: f64, per_s: Option<f64>) -> String {
    let sign = if per_step < 0.0 { "-" } else { "+" };
    let step = crate::report::fmt_bytes(per_step.abs() as u64);
    match per_s {
        Some(s) if s.is_finite() => format!(
            "{sign}{step}/step ({}/s)",
            crate::report::fmt_bytes(s.abs() as u64)
        ),
        _ => format!("{sign}{step}/step"),
    }
}
