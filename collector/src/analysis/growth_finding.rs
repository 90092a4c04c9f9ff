//! The one way a growth detector's finding is built: [`super::growth`], [`super::site_growth`]
//! and [`super::device_growth`] each say what they found in a [`GrowthFinding`], and
//! [`GrowthFinding::finding`] fills the rest as every other finding starts (no process, no
//! stack, no OOM: the report completes those). This file names no detector.

use super::{Cause, Evidence, Finding, Kind, Level};
use crate::model::SiteId;
use oomtrace_proto::Api;

/// What a growth detector says about one growing series.
pub(crate) struct GrowthFinding {
    pub kind: Kind,
    pub level: Level,
    pub device: i16,
    /// The call site (none for a device's total).
    pub site: SiteId,
    /// Live bytes and allocations now.
    pub bytes: u64,
    pub count: u64,
    pub api: Option<Api>,
    pub per_step: Option<f64>,
    pub per_s: Option<f64>,
    pub steps: Option<u64>,
    pub message: String,
    pub cause: Cause,
    pub hint: String,
    pub evidence: Evidence,
}

impl GrowthFinding {
    pub(crate) fn finding(self) -> Finding {
        Finding {
            site: self.site,
            cause: self.cause,
            bytes: self.bytes,
            growth_bytes_per_step: self.per_step,
            growth_bytes_per_s: self.per_s,
            steps: self.steps,
            count: self.count,
            api: self.api,
            message: self.message,
            hint: self.hint,
            evidence: Some(self.evidence),
            ..Finding::new(self.kind, self.level, self.device)
        }
    }
}
