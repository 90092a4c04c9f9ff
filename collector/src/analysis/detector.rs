//! What every detector shares: the allocation it is told (`AllocObs`), what it may read at a
//! step's end (`Context`), the one trait it implements (`Detector`) and the alerts it raises
//! (`Alerts`). `Analysis` (`mod.rs`) feeds the detectors through these and nothing else.

use super::epoch::EpochClock;
use super::finding::{Alert, Finding};
use crate::model::{DeviceMap, DeviceState, SiteId};
use oomtrace_proto::Api;

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
    pub devices: &'a DeviceMap<DeviceState>,
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
