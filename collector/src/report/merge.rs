//! One report from many traces of one job: each node (or each process) wrote its own trace
//! file, and the user wants every rank in one place.
//!
//! Merged from the per-trace reports, not from the traces: each trace is replayed and
//! analysed alone (a process never spans two traces), so the merge only concatenates and
//! re-orders, and the rank comparison ([`super::ranks`]) runs on the result.
//!
//! Only traces of one job are one report by default ([`runs`]: a launcher job id in common);
//! traces of separate runs are reported side by side ([`separate`]), each with its own rank
//! table, unless the user asks to merge them.

use std::cmp::Ordering;

use serde::Serialize;

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
        simulated: traces.iter().find_map(|t| t.simulated.clone()),
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
        combined: None,
        runs: Vec::new(),
        stale_modules,
        skipped: Vec::new(),
        fit: None,
    }
}

/// How the traces of a report of several were put together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// Every trace is of one job (their processes name a launcher job id in common): one
    /// report, ranks compared.
    OneJob,
    /// Traces of separate runs, merged because the user asked (`oomtrace report --merge`).
    MergedOnRequest,
    /// Traces of separate runs, reported side by side: each its own report and rank table.
    SeparateRuns,
}

/// What a report of several traces did with them, and the line that says so.
#[derive(Clone, Debug, Serialize)]
pub struct Combined {
    pub how: How,
    /// How many runs (jobs) the traces are of.
    pub runs: usize,
    /// The sentence the text report opens with.
    pub message: String,
}

/// One run (one job) among the separate runs of a report.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// Its trace files.
    pub traces: Vec<String>,
    /// The launcher job id its processes share; absent for a run of one trace without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Its own rank table, when it holds two ranks or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<ranks::Ranks>,
}

/// The job ids of a report's processes. torchrun's run id when none was given (`none`)
/// names no job: unrelated runs all have it.
fn job_ids(r: &Report) -> Vec<&str> {
    let mut ids: Vec<&str> = r
        .processes
        .iter()
        .filter_map(|p| p.job.as_deref())
        .filter(|j| !j.is_empty() && *j != "none")
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// What ties a group of traces to one job: the launcher job ids its processes name, and the
/// ranks they hold with the world size they say.
#[derive(Default)]
struct Ties<'a> {
    jobs: Vec<&'a str>,
    /// Each world size said (one, in a consistent job).
    worlds: Vec<u32>,
    ranks: Vec<u32>,
}

impl<'a> Ties<'a> {
    fn of(r: &'a Report) -> Ties<'a> {
        let mut worlds: Vec<u32> = r.processes.iter().filter_map(|p| p.world_size).collect();
        worlds.sort_unstable();
        worlds.dedup();
        Ties {
            jobs: job_ids(r),
            worlds,
            ranks: r.processes.iter().filter_map(|p| p.rank).collect(),
        }
    }

    /// One job: a launcher job id in common; or, where neither names one, ranks of one world
    /// size that no two traces both hold (the per-rank traces of a job whose launcher gave no
    /// id: `RANK`/`WORLD_SIZE` set by hand, a multi-node torchrun without `--rdzv-id`). Two
    /// runs of the same ranks (each its own job) share a rank, so they stay apart.
    fn same_job(&self, other: &Ties<'_>) -> bool {
        if self.jobs.iter().any(|j| other.jobs.contains(j)) {
            return true;
        }
        self.jobs.is_empty()
            && other.jobs.is_empty()
            && self.worlds.len() == 1
            && self.worlds == other.worlds
            && !self.ranks.is_empty()
            && !other.ranks.is_empty()
            && !self.ranks.iter().any(|r| other.ranks.contains(r))
    }

    fn absorb(&mut self, other: Ties<'a>) {
        self.jobs.extend(other.jobs);
        self.jobs.sort_unstable();
        self.jobs.dedup();
        self.worlds.extend(other.worlds);
        self.worlds.sort_unstable();
        self.worlds.dedup();
        self.ranks.extend(other.ranks);
    }
}

/// The runs among `reports` (one per trace), as indices into it in the order given, runs in
/// the order of their first trace: traces of one job (the same launcher job id, the same
/// collector, or ranks of one world; transitively) are one run; a trace tied to no other is a
/// run of its own (a collector writes one trace: processes of one collector are already in one).
pub fn runs(reports: &[Report]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Vec<usize>, Ties<'_>)> = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        let mut mine = (vec![i], Ties::of(r));
        let mut k = 0;
        while k < groups.len() {
            if groups[k].1.same_job(&mine.1) {
                let (members, ties) = groups.remove(k);
                mine.0.extend(members);
                mine.1.absorb(ties);
                // What joined may tie to a group passed over already: look again.
                k = 0;
            } else {
                k += 1;
            }
        }
        mine.0.sort_unstable();
        groups.push(mine);
    }
    groups.sort_by_key(|g| g.0[0]);
    groups.into_iter().map(|g| g.0).collect()
}

/// The job id a run's traces share, if any.
pub fn job_of(reports: &[&Report]) -> Option<String> {
    let first = job_ids(reports.first()?);
    first
        .into_iter()
        .find(|j| reports.iter().all(|r| job_ids(r).contains(j)))
        .map(str::to_string)
}

/// The reports of separate runs side by side: one document with every process and finding
/// (each process says its `trace`), no rank table across runs, and `runs` listing each run
/// with its own; and each run's own report (merged from its traces), for the text.
pub fn separate(reports: Vec<Report>, groups: &[Vec<usize>]) -> (Report, Vec<Report>) {
    let mut per_run = Vec::with_capacity(groups.len());
    let mut runs = Vec::with_capacity(groups.len());
    for g in groups {
        let members: Vec<&Report> = g.iter().map(|&i| &reports[i]).collect();
        let job = job_of(&members);
        let run = match members.as_slice() {
            [one] => (*one).clone(),
            _ => merge(members.iter().map(|&r| r.clone()).collect()),
        };
        runs.push(Run {
            traces: members.iter().map(|r| r.trace.path.clone()).collect(),
            job,
            ranks: run.ranks.clone(),
        });
        per_run.push(run);
    }
    let mut all = merge(reports);
    all.ranks = None;
    all.runs = runs;
    (all, per_run)
}
