//! One report from many traces of one job: each node (or each process) wrote its own trace
//! file, and the user wants every rank in one place.
//!
//! Merged from the per-trace reports, not from the traces: each trace is replayed and
//! analysed alone (a process never spans two traces), so the merge only concatenates and
//! re-orders, and the rank comparison ([`super::ranks`]) runs on the result.

use std::cmp::Ordering;

use super::{order, ranks, Kind, Report, TraceInfo, REPORT_VERSION};

/// Merges `reports` (one per trace, in the order given). Processes say which trace they came
/// from (`trace`); findings are ordered as in one report (OOMs first, live-at-exit last and
/// largest first); `trace` sums up the files and `traces` lists each.
pub fn merge(reports: Vec<Report>) -> Report {
    let mut traces = Vec::with_capacity(reports.len());
    let mut processes = Vec::new();
    let mut findings = Vec::new();
    let mut sections = Vec::new();
    let mut stale_modules = Vec::new();
    for r in reports {
        for m in r.stale_modules {
            if !stale_modules.contains(&m) {
                stale_modules.push(m);
            }
        }
        for mut p in r.processes {
            p.trace = Some(r.trace.path.clone());
            processes.push(p);
        }
        findings.extend(r.findings);
        sections.extend(r.sections);
        traces.push(r.trace);
    }
    // Stable: within one kind, each trace's own order is kept.
    findings.sort_by(|a, b| {
        order(a).cmp(&order(b)).then_with(|| {
            if a.kind == Kind::LiveAtExit {
                b.bytes.cmp(&a.bytes)
            } else {
                Ordering::Equal
            }
        })
    });
    let summary = TraceInfo {
        path: traces
            .iter()
            .map(|t| t.path.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        producer: traces
            .first()
            .map_or_else(String::new, |t| t.producer.clone()),
        complete: traces.iter().all(|t| t.complete),
        truncated: traces.iter().any(|t| t.truncated),
        warnings: traces
            .iter()
            .flat_map(|t| t.warnings.iter().map(move |w| format!("{}: {w}", t.path)))
            .collect(),
        incomplete: traces.iter().find_map(|t| t.incomplete.clone()),
        simulated: None,
    };
    let ranks = ranks::build(&processes, &findings);
    Report {
        version: REPORT_VERSION,
        trace: summary,
        processes,
        findings,
        sections,
        ranks,
        traces,
        stale_modules,
        skipped: Vec::new(),
    }
}
