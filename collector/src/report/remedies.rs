//! The remedies of a fragmentation finding (and of an out-of-memory whose memory was there in
//! pieces), with their effect predicted: the trace's tensor requests replayed through the
//! model of PyTorch's allocator ([`crate::whatif`]) under the process's own setting and under
//! each remedy added to it, in one pass over the trace file. Without tensor events (segments
//! only) nothing is predicted and the remedies stay as the detector gave them.

use std::collections::BTreeMap;
use std::path::Path;

use crate::analysis::fragmentation;
use crate::analysis::refusal::Remedy;
use crate::analysis::{Analysis, Evidence};
use crate::model::trace::Trace;
use crate::whatif::{self, replay::recorded_conf, AllocConf, Prediction};

use super::Report;

/// Fills in `predicted_peak_reserved_bytes`, `baseline_peak_reserved_bytes` and (for an
/// out-of-memory) `oom_avoided` of every remedy in `report`, from a replay of the trace at
/// `path` (the file `trace` was read from). Returns a sentence when the replay failed for a
/// reason a reader should know (not for a trace without tensors).
pub fn predict(report: &mut Report, trace: &Trace<Analysis>, path: &Path) -> Option<String> {
    let wanted: Vec<u32> = report
        .findings
        .iter()
        .filter(|f| has_remedies(f))
        .map(|f| f.pid)
        .collect();
    if wanted.is_empty() {
        return None;
    }
    // Every candidate, whatever a finding's pattern says: one pass answers all of them.
    let candidates: Vec<String> = fragmentation::every_remedy()
        .into_iter()
        .map(|r| r.alloc_conf)
        .collect();
    // The processes by the setting they ran with: each group is one replay.
    let mut groups: BTreeMap<String, (AllocConf, Vec<u32>)> = BTreeMap::new();
    for p in trace.processes.iter().filter(|p| wanted.contains(&p.pid())) {
        let own = recorded_conf(p).0.unwrap_or_default();
        groups
            .entry(own.source.clone())
            .or_insert_with(|| (own, Vec::new()))
            .1
            .push(p.pid());
    }
    for (own, pids) in groups.values() {
        let mut confs: Vec<Option<AllocConf>> = vec![None];
        let mut names = Vec::new();
        for c in &candidates {
            if let Ok(conf) = own.with(c) {
                confs.push(Some(conf));
                names.push(c.clone());
            }
        }
        let predictions = match whatif::predict(path, &confs) {
            Ok(p) => p,
            Err(whatif::Error::NoTensors(_)) => return None,
            Err(e) => return Some(format!("the remedies could not be predicted: {e}")),
        };
        for f in report.findings.iter_mut().filter(|f| pids.contains(&f.pid)) {
            let (pid, device) = (f.pid, f.device);
            let at_s = f.oom.as_ref().map(|o| (o.requested_bytes, o.time_s));
            let remedies = match (&mut f.evidence, &mut f.oom) {
                (Some(Evidence::Fragmentation(e)), _) => &mut e.remedies,
                (_, Some(o)) => &mut o.remedies,
                _ => continue,
            };
            fill(remedies, &names, &predictions, pid, device, at_s);
        }
    }
    // A growing gap whose every remedy, replayed, reserves no less than the run: the cache
    // grows with what the program asks for, and no setting changes it; not a finding.
    let dropped: Vec<(u32, i16)> = report
        .findings
        .iter()
        .filter(|f| nothing_helps(f))
        .map(|f| (f.pid, f.device))
        .collect();
    report.findings.retain(|f| !nothing_helps(f));
    // A device growth that pointed at it says what it is instead.
    for f in report.findings.iter_mut().filter(|f| {
        f.kind == crate::analysis::Kind::DeviceGrowth
            && f.cause == crate::analysis::Cause::Fragmented
            && dropped.contains(&(f.pid, f.device))
    }) {
        f.hint = SETTLED_CACHE_HINT.to_string();
    }
    None
}

/// A device growth whose fragmentation finding no remedy helps.
const SETTLED_CACHE_HINT: &str = "PyTorch's cache grows with what the program asks for: every \
    PYTORCH_CUDA_ALLOC_CONF remedy, replayed on this trace, reserves as much. The requests \
    themselves grow (larger batches or sequences): bound them, or pad them to a few sizes.";

/// The least share of the baseline's peak reserve a remedy must save to count as helping.
const HELPS: f64 = 0.05;

/// A fragmentation finding that rests on the growing gap alone (no retries, no failures) and
/// whose remedies were all predicted, none saving [`HELPS`] of the peak reserve.
fn nothing_helps(f: &crate::analysis::Finding) -> bool {
    let Some(Evidence::Fragmentation(e)) = &f.evidence else {
        return false;
    };
    if e.retries > 0 || e.failures_with_free_memory > 0 || e.remedies.is_empty() {
        return false;
    }
    e.remedies.iter().all(|r| {
        match (
            r.predicted_peak_reserved_bytes,
            r.baseline_peak_reserved_bytes,
        ) {
            (Some(p), Some(b)) => p as f64 > b as f64 * (1.0 - HELPS),
            _ => false,
        }
    })
}

fn has_remedies(f: &crate::analysis::Finding) -> bool {
    match (&f.evidence, &f.oom) {
        (Some(Evidence::Fragmentation(e)), _) => !e.remedies.is_empty(),
        (_, Some(o)) => !o.remedies.is_empty(),
        _ => false,
    }
}

/// `predictions[0]` is the process's own setting; `predictions[i + 1]` is `names[i]` added.
fn fill(
    remedies: &mut [Remedy],
    names: &[String],
    predictions: &[Prediction],
    pid: u32,
    device: i16,
    oom: Option<(u64, f64)>,
) {
    let device_of = |p: &Prediction| {
        p.processes
            .iter()
            .find(|pp| pp.pid == pid)
            .and_then(|pp| pp.devices.iter().find(|d| d.device == device))
            .cloned()
    };
    let Some(baseline) = predictions.first().and_then(device_of) else {
        return;
    };
    for r in remedies.iter_mut() {
        let Some(i) = names.iter().position(|n| *n == r.alloc_conf) else {
            continue;
        };
        let Some(d) = predictions.get(i + 1).and_then(device_of) else {
            continue;
        };
        r.predicted_peak_reserved_bytes = Some(d.peak_reserved_bytes);
        r.baseline_peak_reserved_bytes = Some(baseline.peak_reserved_bytes);
        // The recorded failure: the one of that size nearest in time.
        if let Some((size, at_s)) = oom {
            r.oom_avoided = d
                .ooms
                .iter()
                .filter(|o| o.request_bytes == size)
                .min_by(|a, b| (a.at_s - at_s).abs().total_cmp(&(b.at_s - at_s).abs()))
                .map(|o| !o.would_still_happen);
        }
    }
}
