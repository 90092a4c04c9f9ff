//! The comparison of two traces behind `oomtrace diff BEFORE AFTER` and its `--json` contract
//! (version 1): what changed, call site by call site: the verification loop after a fix (did
//! the leak go away? did the peak grow?). Reading the files and the exit codes are the
//! command's (`cli/src/cmd/diff.rs`), the text its rendering (`cli/src/render.rs`).
//!
//! Call sites are matched by their symbolized frames ([`sections::site_key`]), never by addresses or
//! site ids, which differ from run to run; the sites of all processes of a trace are added up
//! per key and device. Findings (OOMs and detected ones) are matched by kind, device and site.
//!
//! A frame of a module whose file changed since its trace was taken has no name, only
//! `module+offset` ([`super::module_file`]). Offsets match across the two traces only when both
//! ran the same build of that module; otherwise ("unmatched modules") a call site with frames
//! in it is `unmatched`, never `gone` or `new`, a finding there that the other trace lacks is
//! `unmatched` rather than appeared or disappeared, and neither is a regression: a missing
//! partner says nothing about the code.
//!
//! Sizes are compared only between runs that did the same work ([`Work`]): a fix that lets a
//! run finish (its leak gone, the evaluation buffer that ran out of memory now fits) makes it
//! reach a higher peak, and that is the work the fix made possible, not a regression. Peaks
//! compare only when both runs made the same number of steps, neither stopped early and they
//! ran out of memory at the same places (both at the same call sites, or neither); bytes live
//! at exit only when neither stopped early and AFTER got no further than BEFORE: BEFORE did not
//! run out of memory, or AFTER ran out at the same places. Two runs that fill the device until
//! the same allocation fails did the same work, and one that then keeps 3.81 GiB at exit where
//! the other freed it all regressed. A leak or OOM finding that disappeared is an improvement.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use serde::Serialize;

use super::module_file::StaleModule;
use super::sections::{self, site_key, SectionOptions, SiteOrder, NO_STACK};
use super::symbolize::FrameInfo;
use super::{Cause, Kind, Report, ReportOptions, REPLACED_BY_EXEC};
use crate::analysis::Analysis;
use crate::analysis::Held;
use crate::model::trace::Trace;
use crate::model::EndState;
use crate::units::{device_name, fmt_bytes};

/// The version of the `--json` document (fields are added, never renamed).
pub const DIFF_VERSION: u32 = 1;

/// A percentage threshold never counts a change smaller than this (a new 4 KiB buffer is not
/// a regression).
pub const MIN_REGRESSION_BYTES: u64 = 1 << 20;

/// What a comparison is asked: the two traces' names (as given) and how much may grow.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    pub before: String,
    pub after: String,
    pub threshold: Threshold,
    /// Call sites listed (the most changed first); regressions are looked for in all.
    pub top: usize,
}

/// How much growth is allowed before it counts as a regression.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Threshold {
    Percent(f64),
    Bytes(u64),
}

impl FromStr for Threshold {
    type Err = String;
    fn from_str(s: &str) -> Result<Threshold, String> {
        let bad = || format!("bad threshold {s:?} (expected e.g. 10%, 4096, 64KiB or 2MiB)");
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            return if v.is_finite() && v >= 0.0 {
                Ok(Threshold::Percent(v))
            } else {
                Err(bad())
            };
        }
        crate::units::parse_bytes(t)
            .map(Threshold::Bytes)
            .map_err(|_| bad())
    }
}

impl Threshold {
    /// Whether `after` grew from `before` by more than allowed.
    pub fn exceeded(self, before: u64, after: u64) -> bool {
        let grew = after.saturating_sub(before);
        match self {
            Threshold::Bytes(b) => grew > b,
            Threshold::Percent(p) => {
                grew >= MIN_REGRESSION_BYTES && grew as f64 > before as f64 * p / 100.0
            }
        }
    }
}

/// One call site (all processes of a trace added up) on one device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SideSite {
    pub peak_bytes: u64,
    pub live_at_exit_bytes: u64,
    pub growth_per_step: f64,
    pub allocations: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteDiff {
    /// The site's identity across traces (its frames, innermost first); for PyTorch's cache,
    /// [`TORCH_CACHE_KEY`]: its segments are one row per device.
    pub key: String,
    /// Its culprit frame, for reading.
    pub name: String,
    /// What the memory is, where PyTorch's tensors are traced (as a finding's `held`):
    /// tensors, PyTorch's cache (`torch_reserve`), or outside PyTorch's allocator; absent in
    /// a trace without PyTorch's tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// Where another row has the same name (and device): the frame that tells this one apart
    /// (`via Linear.forward linear.py:134`, the innermost frame where their stacks differ);
    /// absent when the name alone is unique.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tells_apart: Option<String>,
    pub device: i16,
    /// new | gone | changed | same | unmatched (it has frames in a module whose builds the
    /// two traces cannot compare: see `unmatched_modules`)
    pub status: &'static str,
    pub before: Option<SideSite>,
    pub after: Option<SideSite>,
    pub peak_delta_bytes: i64,
    pub live_at_exit_delta_bytes: i64,
    pub growth_per_step_delta: f64,
    /// Its peak or live-at-exit grew beyond the threshold.
    pub regression: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceDiff {
    pub device: i16,
    pub before_peak_bytes: u64,
    pub after_peak_bytes: u64,
    pub before_live_at_exit_bytes: u64,
    pub after_live_at_exit_bytes: u64,
    pub regression: bool,
}

/// A finding's identity across traces: its kind, device and site key. Its `name` is for
/// reading and is not compared: a backward-pass site is named by forward lines read from the
/// rest of its run (`backward of addmm at train.py:25`), which another run may order or
/// number differently while the site is the same code.
#[derive(Clone, Debug, Serialize)]
pub struct FindingKey {
    pub kind: &'static str,
    pub device: i16,
    pub key: String,
    pub name: String,
}

impl FindingKey {
    fn identity(&self) -> (&'static str, i16, &str) {
        (self.kind, self.device, &self.key)
    }
}

impl PartialEq for FindingKey {
    fn eq(&self, other: &FindingKey) -> bool {
        self.identity() == other.identity()
    }
}

impl Eq for FindingKey {}

impl PartialOrd for FindingKey {
    fn partial_cmp(&self, other: &FindingKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FindingKey {
    fn cmp(&self, other: &FindingKey) -> std::cmp::Ordering {
        self.identity().cmp(&other.identity())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FindingsDiff {
    pub appeared: Vec<FindingKey>,
    pub disappeared: Vec<FindingKey>,
    /// In one trace only, with frames in an unmatched module: whether the other trace has it
    /// cannot be told.
    pub unmatched: Vec<FindingKey>,
}

/// A module whose file changed since one of the traces was taken.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffStaleModule {
    /// The trace (BEFORE or AFTER, as given) it is a module of.
    pub trace: String,
    #[serde(flatten)]
    pub module: StaleModule,
}

/// What one trace's run did, to tell whether its sizes compare with the other's.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Work {
    /// Step markers, all processes.
    pub steps: u64,
    /// Allocations refused for want of memory and not recovered by a retry (its OOM
    /// findings).
    pub out_of_memory: u64,
    /// Where they were refused (kind, device and call site of each OOM finding counted in
    /// `out_of_memory`): runs that ran out at the same places did the same work up to there.
    #[serde(skip)]
    pub out_of_memory_at: BTreeSet<FindingKey>,
    /// Why the run ended before its end, when it did (a process killed or crashed, a trace
    /// cut short); absent when it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
    /// The simulated GPU the run was on (`run --simulate`), as its trace recorded it; absent
    /// on a real one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<super::SimulatedDevice>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub version: u32,
    pub before: String,
    pub after: String,
    pub threshold: Threshold,
    pub devices: Vec<DeviceDiff>,
    /// The most changed call sites first, at most `--top`.
    pub sites: Vec<SiteDiff>,
    /// Call sites in both traces, in neither list because of `--top`: all are in the counts.
    pub sites_compared: usize,
    pub findings: FindingsDiff,
    /// Each reason AFTER counts as a regression, one sentence each.
    pub regressions: Vec<String>,
    pub regression: bool,
    /// What each run did (steps, out of memory, stopped early).
    pub before_work: Work,
    pub after_work: Work,
    /// Peaks were compared (for regressions): both runs made the same number of steps, neither
    /// stopped early, and they ran out of memory at the same places (or neither did).
    pub peaks_compared: bool,
    /// Bytes live at exit were compared: neither run stopped early, and BEFORE did not run out
    /// of memory or AFTER ran out at the same places.
    pub live_at_exit_compared: bool,
    /// Why sizes were not compared, in one sentence; absent when they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_compared: Option<String>,
    /// Each leak or OOM finding of BEFORE that AFTER no longer has, one sentence each.
    pub improvements: Vec<String>,
    /// Modules whose files changed since a trace was taken (their frames are `module+offset`).
    pub stale_modules: Vec<DiffStaleModule>,
    /// File names of the modules whose call sites cannot be compared: changed since one trace
    /// was taken, and not the same build in both.
    pub unmatched_modules: Vec<String>,
}

/// The key of PyTorch's cache row: its segments, whatever their call sites, are one row per
/// device (a segment is made where a tensor first did not fit: that line did not ask for it).
pub const TORCH_CACHE_KEY: &str = "(PyTorch's cache)";

/// One call site of one trace, keyed for matching.
struct SiteEntry {
    name: String,
    held: Option<Held>,
    /// Its frames, innermost first: what tells it from a row of the same name.
    stack: Vec<FrameInfo>,
    stats: SideSite,
    /// The modules its native frames are in (file names).
    modules: BTreeSet<String>,
}

/// What one trace says, keyed for matching ([`Side::of`]).
pub struct Side {
    sites: BTreeMap<(String, i16), SiteEntry>,
    devices: BTreeMap<i16, (u64, u64)>,
    /// Each finding, with the modules of its frames.
    findings: BTreeMap<FindingKey, BTreeSet<String>>,
    stale: Vec<StaleModule>,
    work: Work,
}

/// The modules (file names) that `stack`'s native frames are in.
fn modules_of(stack: &[FrameInfo]) -> impl Iterator<Item = String> + '_ {
    stack
        .iter()
        .filter(|f| !f.python && !f.module.is_empty())
        .map(|f| f.module.clone())
}

impl FindingKey {
    /// Where the finding is, for reading: `at its site (device 0)`, or `on device 0` for one
    /// without a stack (a device's threshold or growth).
    pub fn place(&self) -> String {
        if self.key == NO_STACK {
            format!("on {}", device_name(self.device))
        } else {
            format!("at {} ({})", self.name, device_name(self.device))
        }
    }
}

impl Side {
    /// What `trace` (read from `path`) says, keyed for matching: its call sites and devices
    /// (all processes added up) and its findings.
    pub fn of(trace: &Trace<Analysis>, path: &Path) -> Side {
        let mut side = Side {
            sites: BTreeMap::new(),
            devices: BTreeMap::new(),
            findings: BTreeMap::new(),
            stale: Vec::new(),
            work: Work::default(),
        };
        for s in sections::build(
            trace,
            &SectionOptions {
                top: usize::MAX,
                order: SiteOrder::Peak,
                symbolize: true,
                // The devices compare by what the GPU holds (segments included), as they always
                // have; a tensor is matched by its own call site either way.
                segments: true,
            },
        ) {
            let d = side.devices.entry(s.device).or_default();
            d.0 = d.0.saturating_add(s.totals.peak_bytes);
            d.1 = d.1.saturating_add(s.totals.live_at_exit_bytes);
            for r in s.sites {
                let cache = r.held == Some(Held::TorchReserve);
                let (key, name, stack) = if cache {
                    (
                        TORCH_CACHE_KEY.to_string(),
                        "PyTorch's cache".to_string(),
                        Vec::new(),
                    )
                } else {
                    (r.key, r.name.clone(), r.stack.clone())
                };
                let e = side
                    .sites
                    .entry((key, s.device))
                    .or_insert_with(|| SiteEntry {
                        name,
                        held: r.held,
                        stack,
                        stats: SideSite::default(),
                        modules: BTreeSet::new(),
                    });
                if !cache {
                    e.modules.extend(modules_of(&r.stack));
                }
                let e = &mut e.stats;
                e.peak_bytes = e.peak_bytes.saturating_add(r.peak_bytes);
                e.live_at_exit_bytes = e.live_at_exit_bytes.saturating_add(r.live_at_exit_bytes);
                e.growth_per_step += r.growth_per_step;
                e.allocations = e.allocations.saturating_add(r.allocations);
            }
        }
        let report = super::build(
            trace,
            &ReportOptions {
                top: 0,
                path: path.display().to_string(),
                symbolize: true,
            },
        );
        for f in report
            .findings
            .iter()
            .filter(|f| f.kind != Kind::LiveAtExit)
        {
            side.findings
                .entry(FindingKey {
                    kind: f.kind.name(),
                    device: f.device,
                    key: site_key(&f.stack),
                    name: finding_name(f),
                })
                .or_default()
                .extend(modules_of(&f.stack));
        }
        let refused: Vec<&super::Finding> = report
            .findings
            .iter()
            .filter(|f| f.kind == Kind::Oom && f.cause != Cause::RetriedAfterFree)
            .collect();
        side.work = Work {
            steps: trace.processes.iter().map(|p| p.markers).sum(),
            out_of_memory: refused.len() as u64,
            out_of_memory_at: refused
                .iter()
                .map(|f| FindingKey {
                    kind: f.kind.name(),
                    device: f.device,
                    key: site_key(&f.stack),
                    name: finding_name(f),
                })
                .collect(),
            stopped_early: stopped_early(trace, &report),
            simulated: report.trace.simulated.clone(),
        };
        side.stale = report.stale_modules;
        side
    }
}

/// How a finding's site reads: the report's name of it, [`NO_STACK`] without a stack.
fn finding_name(f: &super::Finding) -> String {
    if f.site_name.is_empty() {
        NO_STACK.to_string()
    } else {
        f.site_name.clone()
    }
}

/// Why the run of `trace` ended before its end, if it did: a trace cut short, or a process
/// that ended without exiting (killed, crashed, still running when the trace ended).
fn stopped_early(trace: &Trace<Analysis>, report: &Report) -> Option<String> {
    if let Some(i) = &report.trace.incomplete {
        return Some(format!("its trace is cut short ({})", i.cause));
    }
    if report.trace.truncated {
        return Some("its trace ends inside a record".into());
    }
    trace
        .processes
        .iter()
        .zip(&report.processes)
        .find_map(|(p, r)| {
            let ended = match p.end {
                // It exited (the end of its stream may be lost, not its work).
                EndState::Exited(_) | EndState::Unheard(_) => false,
                // An image replaced by exec goes on in the next one.
                EndState::Abrupt => r.status != REPLACED_BY_EXEC,
                EndState::Running | EndState::ProtocolError => true,
            };
            ended.then(|| format!("pid {} {}", r.pid, r.status))
        })
}

/// Whether the two runs did the same work, and if not why, in one sentence: peaks compare
/// only between runs with the same steps where neither stopped early and both ran out of
/// memory at the same places (or neither did); live at exit where neither stopped early and
/// AFTER got no further than BEFORE (BEFORE did not run out of memory, or AFTER ran out at the
/// same places): a fix that lets a run finish may leave more at its end, a change that makes
/// AFTER run out of memory is a regression of its own (its new OOM finding), and memory that
/// AFTER keeps at exit after the same failure is one too.
fn comparable(before: &Work, after: &Work) -> (bool, bool, Option<String>) {
    let same_failures = before.out_of_memory_at == after.out_of_memory_at;
    // Reasons that keep both sizes apart, then those that keep only the peaks apart.
    let mut why = Vec::new();
    let mut why_peaks = Vec::new();
    for (name, w) in [("BEFORE", before), ("AFTER", after)] {
        if w.out_of_memory > 0 && !same_failures {
            let n = w.out_of_memory;
            let reason = format!(
                "{name} ran out of memory ({n} failed allocation{})",
                plural(n)
            );
            if name == "BEFORE" {
                why.push(reason);
            } else {
                why_peaks.push(reason);
            }
        }
        if let Some(s) = &w.stopped_early {
            why.push(format!("{name} stopped early ({s})"));
        }
    }
    let live = why.is_empty();
    why.extend(why_peaks);
    if before.steps != after.steps {
        why.push(format!(
            "BEFORE made {} step{} and AFTER {}",
            before.steps,
            plural(before.steps),
            after.steps
        ));
    }
    let peaks = why.is_empty();
    let not_compared = (!peaks).then(|| {
        format!(
            "{} not compared: {}; the runs did not do the same work (a fix that lets a run \
             finish raises its peak)",
            if live {
                "peaks"
            } else {
                "peaks and live-at-exit bytes"
            },
            why.join("; ")
        )
    });
    (peaks, live, not_compared)
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The modules (file names) whose call sites the two traces cannot compare: changed since
/// one trace was taken, used by the other, and not the same build in both (the same recorded
/// build id or file stamp: then their offsets are the same code, and match).
fn unmatched_modules(before: &Side, after: &Side) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (this, other) in [(before, after), (after, before)] {
        for m in &this.stale {
            let same_build_there = !m.traced.is_empty()
                && other
                    .stale
                    .iter()
                    .any(|o| o.path == m.path && o.traced == m.traced);
            let used_there = other.sites.values().any(|s| s.modules.contains(m.name()))
                || other.findings.values().any(|ms| ms.contains(m.name()));
            if used_there && !same_build_there {
                out.insert(m.name().to_string());
            }
        }
    }
    out
}

/// How a row reads in one line: what the memory is (where PyTorch's tensors are traced),
/// its name, and what tells it from a row of the same name.
pub fn row_label(name: &str, held: Option<Held>, tells_apart: Option<&str>) -> String {
    let what = match held {
        Some(Held::Tensors) => "tensors: ",
        Some(Held::OutsideTorch) => "outside PyTorch: ",
        Some(Held::TorchReserve) | None => "",
    };
    match tells_apart {
        Some(t) => format!("{what}{name} ({t})"),
        None => format!("{what}{name}"),
    }
}

/// For each row whose name (and device) another row shares, what tells it apart, in the
/// user's words: a cuBLAS workspace is said so; else the innermost Python frame of its own that
/// not every other such row has (the user's code first: `Linear.forward linear.py:134`) and the
/// PyTorch operator its line called (the outermost `at::_ops::NAME` frame: `op relu`); rows
/// still alike are numbered (`#2`). No C++ names: those stay in the key.
fn tells_apart(
    keys: &BTreeSet<&(String, i16)>,
    before: &Side,
    after: &Side,
) -> BTreeMap<(String, i16), String> {
    let entry = |k: &(String, i16)| after.sites.get(k).or_else(|| before.sites.get(k));
    // Rows by what they read as: name, device and what they hold.
    type Reading = (String, i16, Option<Held>);
    let mut by_name: BTreeMap<Reading, Vec<&(String, i16)>> = BTreeMap::new();
    for &k in keys {
        if let Some(e) = entry(k) {
            by_name
                .entry((e.name.clone(), k.1, e.held))
                .or_default()
                .push(k);
        }
    }
    let same = |f: &FrameInfo, g: &FrameInfo| {
        f.python == g.python
            && if f.python {
                (f.file.as_str(), f.line, f.function.as_str())
                    == (g.file.as_str(), g.line, g.function.as_str())
            } else {
                f.function == g.function && f.module == g.module
            }
    };
    let mut out = BTreeMap::new();
    for group in by_name.values().filter(|g| g.len() > 1) {
        let rows: Vec<(&(String, i16), &SiteEntry)> = group
            .iter()
            .filter_map(|&k| entry(k).map(|e| (k, e)))
            .collect();
        let mut said: Vec<String> = Vec::with_capacity(rows.len());
        for &(k, mine) in &rows {
            if super::roles::allocates_library_workspace(&mine.stack) {
                said.push("cuBLAS workspace".into());
                continue;
            }
            let others: Vec<&SiteEntry> = rows
                .iter()
                .filter(|(o, _)| *o != k)
                .map(|(_, e)| *e)
                .collect();
            let not_in_all =
                |f: &&FrameInfo| others.iter().any(|o| !o.stack.iter().any(|g| same(f, g)));
            let python = mine
                .stack
                .iter()
                .filter(|f| f.python)
                .filter(not_in_all)
                .min_by_key(|f| crate::model::is_library_file(&f.file));
            let op = mine.stack.iter().rev().find_map(torch_op);
            let parts: Vec<String> = python
                .map(frame_words)
                .into_iter()
                .chain(op.map(|o| format!("op {o}")))
                .collect();
            said.push(parts.join(", "));
        }
        for (i, &(k, _)) in rows.iter().enumerate() {
            let twins = said.iter().filter(|s| **s == said[i]).count();
            let text = if twins > 1 || said[i].is_empty() {
                let n = said[..=i].iter().filter(|s| **s == said[i]).count();
                if said[i].is_empty() {
                    format!("#{n}")
                } else {
                    format!("{} #{n}", said[i])
                }
            } else {
                said[i].clone()
            };
            out.insert(k.clone(), text);
        }
    }
    out
}

/// The PyTorch operator a native frame runs, `relu` for `at::_ops::relu::call(...)`.
fn torch_op(f: &FrameInfo) -> Option<&str> {
    let rest = f.function.strip_prefix("at::_ops::")?;
    rest.split("::").next().filter(|op| !op.is_empty())
}

/// A frame in a user's words: `function file:line` for Python, its module's file name for a
/// native frame (C++ names stay in the key).
fn frame_words(f: &FrameInfo) -> String {
    if f.python {
        let file = f.file.rsplit('/').next().unwrap_or(&f.file);
        format!("{} {file}:{}", f.function, f.line)
    } else {
        f.module.rsplit('/').next().unwrap_or(&f.module).to_string()
    }
}

/// `after - before`, clamped to an `i64`.
pub fn delta(before: u64, after: u64) -> i64 {
    (after as i128 - before as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// What changed from `before` to `after`.
pub fn compare(before: &Side, after: &Side, opts: &DiffOptions) -> Diff {
    let mut regressions = Vec::new();
    let (peaks_compared, live_compared, not_compared) = comparable(&before.work, &after.work);
    let grew = |b: u64, a: u64, compared: bool| compared && opts.threshold.exceeded(b, a);
    let mut sites = Vec::new();
    let unmatched = unmatched_modules(before, after);
    let keys: BTreeSet<&(String, i16)> = before.sites.keys().chain(after.sites.keys()).collect();
    let apart = tells_apart(&keys, before, after);
    for k in keys {
        let b = before.sites.get(k);
        let a = after.sites.get(k);
        let name = a.or(b).map(|e| e.name.clone()).unwrap_or_default();
        let held = a.or(b).and_then(|e| e.held);
        let tells_apart = apart.get(k).cloned();
        let label = row_label(&name, held, tells_apart.as_deref());
        let (bs, as_) = (
            b.map(|e| e.stats.clone()).unwrap_or_default(),
            a.map(|e| e.stats.clone()).unwrap_or_default(),
        );
        let in_unmatched = b
            .into_iter()
            .chain(a)
            .any(|e| !e.modules.is_disjoint(&unmatched));
        let regression = !in_unmatched
            && (grew(bs.peak_bytes, as_.peak_bytes, peaks_compared)
                || grew(bs.live_at_exit_bytes, as_.live_at_exit_bytes, live_compared));
        if regression {
            regressions.push(format!(
                "{label} on {}: peak {} -> {}, live at exit {} -> {}",
                device_name(k.1),
                fmt_bytes(bs.peak_bytes),
                fmt_bytes(as_.peak_bytes),
                fmt_bytes(bs.live_at_exit_bytes),
                fmt_bytes(as_.live_at_exit_bytes)
            ));
        }
        let status = match (b, a) {
            _ if in_unmatched => "unmatched",
            (None, _) => "new",
            (_, None) => "gone",
            _ if bs.peak_bytes == as_.peak_bytes
                && bs.live_at_exit_bytes == as_.live_at_exit_bytes
                && bs.allocations == as_.allocations =>
            {
                "same"
            }
            _ => "changed",
        };
        sites.push(SiteDiff {
            key: k.0.clone(),
            name,
            held,
            tells_apart,
            device: k.1,
            status,
            peak_delta_bytes: delta(bs.peak_bytes, as_.peak_bytes),
            live_at_exit_delta_bytes: delta(bs.live_at_exit_bytes, as_.live_at_exit_bytes),
            growth_per_step_delta: as_.growth_per_step - bs.growth_per_step,
            before: b.map(|_| bs),
            after: a.map(|_| as_),
            regression,
        });
    }
    let sites_compared = sites.len();
    let change = |s: &SiteDiff| {
        s.peak_delta_bytes.unsigned_abs() as u128
            + s.live_at_exit_delta_bytes.unsigned_abs() as u128
    };
    sites.sort_by(|x, y| {
        y.regression
            .cmp(&x.regression)
            .then(change(y).cmp(&change(x)))
            .then(x.key.cmp(&y.key))
    });
    sites.truncate(opts.top);
    let mut devices = Vec::new();
    let dev_keys: BTreeSet<i16> = before
        .devices
        .keys()
        .chain(after.devices.keys())
        .copied()
        .collect();
    for d in dev_keys {
        let b = before.devices.get(&d).copied().unwrap_or_default();
        let a = after.devices.get(&d).copied().unwrap_or_default();
        let regression = grew(b.0, a.0, peaks_compared) || grew(b.1, a.1, live_compared);
        if regression {
            regressions.push(format!(
                "{}: peak {} -> {}, live at exit {} -> {}",
                device_name(d),
                fmt_bytes(b.0),
                fmt_bytes(a.0),
                fmt_bytes(b.1),
                fmt_bytes(a.1)
            ));
        }
        devices.push(DeviceDiff {
            device: d,
            before_peak_bytes: b.0,
            after_peak_bytes: a.0,
            before_live_at_exit_bytes: b.1,
            after_live_at_exit_bytes: a.1,
            regression,
        });
    }
    // In one trace only: appeared or disappeared, unless an unmatched module hides its partner.
    let mut unmatched_findings = Vec::new();
    let mut only_in = |this: &Side, other: &Side| -> Vec<FindingKey> {
        let mut out = Vec::new();
        for (f, modules) in this
            .findings
            .iter()
            .filter(|(f, _)| !other.findings.contains_key(f))
        {
            if modules.is_disjoint(&unmatched) {
                out.push(f.clone());
            } else {
                unmatched_findings.push(f.clone());
            }
        }
        out
    };
    let appeared = only_in(after, before);
    let disappeared = only_in(before, after);
    let leak_or_oom = |f: &&FindingKey| f.kind == Kind::Leak.name() || f.kind == Kind::Oom.name();
    for f in appeared.iter().filter(leak_or_oom) {
        regressions.push(if f.key == NO_STACK {
            format!("new {} finding on {}", f.kind, device_name(f.device))
        } else {
            format!(
                "new {} finding at {} on {}",
                f.kind,
                f.name,
                device_name(f.device)
            )
        });
    }
    let improvements = disappeared
        .iter()
        .filter(leak_or_oom)
        .map(|f| format!("{} {} is gone", f.kind, f.place()))
        .collect();
    Diff {
        version: DIFF_VERSION,
        before: opts.before.clone(),
        after: opts.after.clone(),
        threshold: opts.threshold,
        devices,
        sites,
        sites_compared,
        findings: FindingsDiff {
            appeared,
            disappeared,
            unmatched: unmatched_findings,
        },
        regression: !regressions.is_empty(),
        regressions,
        before_work: before.work.clone(),
        after_work: after.work.clone(),
        peaks_compared,
        live_at_exit_compared: live_compared,
        not_compared,
        improvements,
        stale_modules: stale_modules(before, after, opts),
        unmatched_modules: unmatched.into_iter().collect(),
    }
}

/// The changed modules of both traces, each (trace, module) once.
fn stale_modules(before: &Side, after: &Side, opts: &DiffOptions) -> Vec<DiffStaleModule> {
    let mut out: Vec<DiffStaleModule> = Vec::new();
    for (side, path) in [(before, &opts.before), (after, &opts.after)] {
        for m in &side.stale {
            let s = DiffStaleModule {
                trace: path.clone(),
                module: m.clone(),
            };
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::module_file::Change;

    fn stale(path: &str, traced: &str) -> StaleModule {
        StaleModule {
            path: path.into(),
            reason: Change::BuildIdChanged,
            traced: traced.into(),
            now: "build id 99".into(),
        }
    }

    /// A side with one site in `modules` and the given stale modules.
    fn side(modules: &[&str], stale: Vec<StaleModule>) -> Side {
        let mut sites = BTreeMap::new();
        sites.insert(
            (format!("{}+0x10", modules[0]), 0),
            SiteEntry {
                name: String::new(),
                held: None,
                stack: Vec::new(),
                stats: SideSite::default(),
                modules: modules.iter().map(|m| m.to_string()).collect(),
            },
        );
        Side {
            sites,
            devices: BTreeMap::new(),
            findings: BTreeMap::new(),
            stale,
            work: Work::default(),
        }
    }

    /// A run of `steps` steps that ran out of memory at the call sites `at` (none: it did not).
    fn work(steps: u64, at: &[&str]) -> Work {
        Work {
            simulated: None,
            steps,
            out_of_memory: at.len() as u64,
            out_of_memory_at: at
                .iter()
                .map(|k| FindingKey {
                    kind: "oom",
                    device: 0,
                    key: k.to_string(),
                    name: k.to_string(),
                })
                .collect(),
            stopped_early: None,
        }
    }

    /// Two runs that ran out of memory at the same call site did the same work up to there:
    /// their sizes compare (one that then keeps its memory at exit regressed). A fix that lets
    /// BEFORE's run finish keeps both apart; a change that makes AFTER run out of memory keeps
    /// the peaks apart only (its new OOM finding is the regression, and what it holds at exit
    /// is still compared); other places, or a run that stopped early, keep both apart.
    #[test]
    fn sizes_compare_between_runs_that_did_the_same_work() {
        let cases = [
            (work(60, &[]), work(60, &[]), (true, true)),
            (work(60, &[]), work(50, &[]), (false, true)),
            (work(52, &["keep"]), work(52, &["keep"]), (true, true)),
            (work(52, &["keep"]), work(40, &["keep"]), (false, true)),
            (work(60, &["eval"]), work(60, &[]), (false, false)),
            (work(60, &[]), work(60, &["eval"]), (false, true)),
            (work(60, &["eval"]), work(60, &["keep"]), (false, false)),
        ];
        for (before, after, (peaks, live)) in cases {
            let (p, l, why) = comparable(&before, &after);
            assert_eq!((p, l), (peaks, live), "{before:?} -> {after:?}: {why:?}");
            assert_eq!(why.is_none(), p && l, "{why:?}");
        }
        let killed = Work {
            stopped_early: Some("pid 1 ended without goodbye (killed or crashed)".into()),
            ..work(52, &["keep"])
        };
        let (peaks, live, why) = comparable(&work(52, &["keep"]), &killed);
        assert!(!peaks && !live, "{why:?}");
        let (_, _, why) = comparable(&work(60, &["eval"]), &work(60, &["keep"]));
        assert_eq!(
            why.as_deref(),
            Some(
                "peaks and live-at-exit bytes not compared: BEFORE ran out of memory (1 failed \
                 allocation); AFTER ran out of memory (1 failed allocation); the runs did not do \
                 the same work (a fix that lets a run finish raises its peak)"
            )
        );
        let (_, _, why) = comparable(&work(60, &[]), &work(60, &["eval"]));
        assert_eq!(
            why.as_deref(),
            Some(
                "peaks not compared: AFTER ran out of memory (1 failed allocation); the runs did \
                 not do the same work (a fix that lets a run finish raises its peak)"
            )
        );
    }

    /// Offsets compare only between traces of the same build of a module: another build (or
    /// a build that could be named on one side only) makes the module unmatched, unless the
    /// other trace never had a frame in it.
    #[test]
    fn a_changed_module_is_unmatched_unless_both_traces_ran_the_same_build() {
        let a = |traced: &str| vec![stale("/src/app", traced)];
        let same = unmatched_modules(
            &side(&["app", "libc.so.6"], a("build id 01")),
            &side(&["app"], a("build id 01")),
        );
        assert!(same.is_empty(), "{same:?}");
        let other = unmatched_modules(
            &side(&["app"], a("build id 01")),
            &side(&["app"], a("build id 02")),
        );
        assert_eq!(other, BTreeSet::from(["app".to_string()]));
        let named_after =
            unmatched_modules(&side(&["app"], a("build id 01")), &side(&["app"], vec![]));
        assert_eq!(named_after, BTreeSet::from(["app".to_string()]));
        let named_before =
            unmatched_modules(&side(&["app"], vec![]), &side(&["app"], a("build id 01")));
        assert_eq!(named_before, BTreeSet::from(["app".to_string()]));
        // Nothing recorded to tell the builds apart: not the same build.
        let unknown = unmatched_modules(&side(&["app"], a("")), &side(&["app"], a("")));
        assert_eq!(unknown, BTreeSet::from(["app".to_string()]));
        let not_there =
            unmatched_modules(&side(&["app"], a("build id 01")), &side(&["other"], vec![]));
        assert!(not_there.is_empty(), "{not_there:?}");
    }
}
