//! Fit: the levers a PyTorch user pulls when a job does not fit (a smaller or larger batch,
//! activation checkpointing of a module, an allocator setting), each predicted from one trace
//! by replaying the program's tensor requests, changed as the lever would change them, through
//! the model of PyTorch's caching allocator (`whatif`). docs/fit.md states the rules for users.
//!
//! - [`timeline`]: the trace's tensors per process and device, each with its role (the
//!   anatomy's rule), in one pass;
//! - [`calls`]: module calls, from the Python frames, which checkpointing wraps;
//! - [`plan`]: a lever applied to a timeline, and its replay.
//!
//! Imports the model, the analysis (roles, the fragmentation remedies), whatif and units; the
//! report may import this (its lever lines).

pub mod calls;
pub mod plan;
pub mod timeline;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::analysis::anatomy::{Made, Role, ROLES};
use crate::analysis::fragmentation;
use crate::model::trace::Trace;
use crate::model::Process;
use crate::units::fmt_bytes;
use crate::whatif::replay::recorded_conf;
use crate::whatif::AllocConf;
use calls::{CallKey, CallName, Calls};
use plan::{Lever, Outcome, Plan};
use timeline::{DeviceTimeline, Op, Recorder};

/// Checkpointing candidates tried per device when none is asked for.
pub const CANDIDATES: usize = 3;
/// A call whose saved activations a call inside it holds at least this share of is not a
/// candidate: checkpointing the inner one does as much, recomputing less.
const NESTED_SHARE: f64 = 0.95;
/// Where tensors whose role nothing decides hold more than this share of the tensors at the
/// peak, no batch prediction is made.
const UNKNOWN_SHARE: f64 = 0.10;
/// Without `--batch`, the largest batch is searched in steps of 1/64 of the traced one.
const FACTOR_UNITS: u64 = 64;
/// The largest batch searched: this many times the traced one.
const MAX_FACTOR: u64 = 1024;
/// The grid the largest batch is searched down on, in steps between the guess and a batch
/// that cannot fit.
const GRID: u64 = 16;
/// The grid of a report's search (brief): coarser, for fewer replays (`oomtrace fit` searches
/// on [`GRID`]).
const BRIEF_GRID: u64 = 4;
/// Call sites of tensors this large or larger are asked whether they allocate a library's
/// workspace (smaller ones are not worth symbolizing).
const WORKSPACE_MIN: u64 = 1 << 20;
/// A setting "serves a lever better" when its peak reserve is at least this much lower.
const BETTER: f64 = 0.02;

/// What the user asked.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The memory to fit in (None: each device's own size, as the trace recorded it).
    pub memory: Option<u64>,
    /// The batch size the trace ran with, to say batches in samples rather than multiples.
    pub batch: Option<u64>,
    /// Module calls to checkpoint (a class, `file:line`, `Class@file:line`); empty: the
    /// calls holding the most saved activations.
    pub checkpoint: Vec<String>,
    /// Only what the report's lines show, for fewer replays: the run's own setting (no
    /// other), the first checkpointing candidate and the largest batch on a coarser grid (not
    /// the batch halved or doubled, nor the largest batch with checkpointing).
    pub brief: bool,
}

/// Why there is no fit. One sentence per variant.
#[derive(Debug)]
pub enum Error {
    Trace(crate::model::Error),
    /// No PyTorch tensor events.
    NoTensors(PathBuf),
    /// Tensors, but no training or inference step to scale.
    NoSteps(PathBuf),
    /// `--checkpoint` named no module call of the trace.
    NoSuchModule {
        asked: String,
        known: Vec<String>,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Trace(e) => write!(f, "{e}"),
            // The same words as whatif's: the same trace lacks the same thing.
            Error::NoTensors(path) => {
                write!(f, "{}", crate::whatif::Error::NoTensors(path.clone()))
            }
            Error::NoSteps(path) => write!(
                f,
                "{}: the trace has tensors but no steps (no step marker and no forward pass of \
                 a torch.nn module), so nothing tells what follows the batch; trace a training \
                 or inference loop, or mark its steps with oomtrace.step()",
                path.display()
            ),
            Error::NoSuchModule { asked, known } => {
                write!(
                    f,
                    "--checkpoint {asked:?} names no module call of the trace"
                )?;
                if known.is_empty() {
                    write!(f, " (it has none with saved activations)")
                } else {
                    write!(f, "; its module calls: {}", known.join(", "))
                }
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::model::Error> for Error {
    fn from(e: crate::model::Error) -> Error {
        Error::Trace(e)
    }
}

/// The `fit` object (`oomtrace fit --json`, and the report's `fit`): docs/json-report.md.
#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    /// `--memory` (null: each device's own size).
    pub memory_bytes: Option<u64>,
    /// `--batch`: the traced batch (null: batches are said as multiples of it).
    pub batch: Option<u64>,
    pub processes: Vec<ProcessFit>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessFit {
    pub pid: u32,
    /// The setting the run had ("" = PyTorch's defaults): every lever is replayed with it,
    /// and with each remedy added to it.
    pub alloc_conf: String,
    pub devices: Vec<DeviceFit>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceFit {
    pub device: i16,
    /// What must hold the job: `--memory`, or the device's size (null: unknown; then nothing
    /// is said to fit or not).
    pub capacity_bytes: Option<u64>,
    /// "given" or "device".
    pub capacity_source: Option<&'static str>,
    /// The memory cap the program set itself (`set_per_process_memory_fraction`), which the
    /// replays without `--memory` run under.
    pub program_cap_bytes: Option<u64>,
    /// PyTorch's own peak reserve in the run, and the model's replay of the run.
    pub recorded_peak_reserved_bytes: u64,
    pub replayed_peak_reserved_bytes: u64,
    /// The device's most bytes outside PyTorch's reserve (context, libraries' own memory):
    /// what a capacity must hold besides the reserve.
    pub outside_bytes: u64,
    /// The run ended in the step that ran out of memory: what the rest of that step needs is
    /// not in the trace, so every peak is a lower bound (and a largest batch an upper one).
    pub complete: bool,
    /// The tensors at the tensor peak, by role, and how many of their bytes follow the batch.
    pub at_peak: PeakRoles,
    pub levers: Vec<LeverFit>,
    /// The module calls holding the most saved activations (checkpointing candidates).
    pub checkpoint_candidates: Vec<Candidate>,
    /// Levers not predicted, and why.
    pub withheld: Vec<Withheld>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PeakRoles {
    pub tensor_bytes: u64,
    /// Bytes by role name.
    pub roles: std::collections::BTreeMap<&'static str, u64>,
    pub follows_batch_bytes: u64,
    pub fixed_bytes: u64,
    /// Tensors whose role nothing decides (no Python frames): not scaled.
    pub unknown_bytes: u64,
}

/// A lever's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeverKind {
    /// The batch scaled by `batch_factor`.
    Batch,
    /// The largest batch that fits the capacity.
    LargestBatch,
    /// Module calls checkpointed.
    Checkpoint,
    /// The largest batch that fits with the best checkpointing candidate.
    CheckpointLargestBatch,
}

impl LeverKind {
    /// Its name in the JSON contract (as serialized).
    pub fn name(self) -> &'static str {
        match self {
            LeverKind::Batch => "batch",
            LeverKind::LargestBatch => "largest_batch",
            LeverKind::Checkpoint => "checkpoint",
            LeverKind::CheckpointLargestBatch => "checkpoint_largest_batch",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LeverFit {
    pub kind: LeverKind,
    /// One line naming it (`batch x0.5 (32)`).
    pub name: String,
    pub batch_factor: f64,
    /// The batch in samples (null without `--batch`).
    pub batch: Option<u64>,
    /// The module calls checkpointed (`Block at model.py:30`).
    pub checkpoint: Vec<String>,
    /// `max_memory_reserved()` and `max_memory_allocated()` under the run's own setting.
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// It fits the capacity under the run's own setting (null: no capacity known).
    pub fits: Option<bool>,
    /// The peak is at least this (the run ended in the step that ran out of memory).
    pub lower_bound: bool,
    /// What the prediction assumed.
    pub assumed: String,
    /// The allocator setting that serves it best, when one does better than the run's own.
    pub best_setting: Option<SettingFit>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SettingFit {
    /// As PYTORCH_CUDA_ALLOC_CONF takes it (the run's own setting with the remedy added).
    pub alloc_conf: String,
    pub peak_reserved_bytes: u64,
    pub fits: Option<bool>,
    /// For a largest batch: the largest under this setting.
    pub batch_factor: Option<f64>,
    pub batch: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// The module's class.
    pub module: String,
    /// `file:line` of the call.
    pub call: String,
    /// Saved activations made under the call, alive when all saved activations add up to the
    /// most (the end of a forward pass).
    pub saved_activation_bytes: u64,
    /// Times the call ran in the trace (instances, e.g. blocks in a loop, steps).
    pub calls: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Withheld {
    /// `batch`, `largest_batch` or `checkpoint`.
    pub lever: &'static str,
    pub reason: String,
}

/// Fits the trace at `path`.
/// Reads the trace at `path` for [`fit_trace`].
pub fn load(path: &Path) -> Result<Trace<Recorder>, Error> {
    let mut trace: Trace<Recorder> = Trace::load(path)?;
    for r in &mut trace.observers {
        r.finish();
    }
    Ok(trace)
}

/// Fits a loaded trace. `workspace` says whether a call site of a process allocates a
/// library's workspace (its native frames say; the report's symbolizer knows): such tensors
/// keep their size whatever the batch.
pub fn fit_trace(
    path: &Path,
    trace: &Trace<Recorder>,
    opts: &Options,
    workspace: &mut dyn FnMut(&Process, crate::model::SiteId) -> bool,
) -> Result<Fit, Error> {
    let any_tensor = trace
        .observers
        .iter()
        .any(|r| r.devices.values().any(|d| !d.tensors.is_empty()));
    if !any_tensor {
        return Err(Error::NoTensors(path.to_path_buf()));
    }
    let any_step = trace.observers.iter().any(|r| {
        r.steps > 0
            || r.devices
                .values()
                .any(|d| d.tensors.iter().any(|t| t.made == Made::Forward))
    });
    if !any_step {
        return Err(Error::NoSteps(path.to_path_buf()));
    }
    let mut processes = Vec::new();
    let mut asked_matched = vec![false; opts.checkpoint.len()];
    let mut known_names = Vec::new();
    for (p, r) in trace.processes.iter().zip(&trace.observers) {
        let (conf, shown) = recorded_conf(p);
        let own = conf.unwrap_or_default();
        let mut settings = Vec::new();
        if !opts.brief {
            for remedy in fragmentation::every_remedy() {
                if let Ok(c) = own.with(&remedy.alloc_conf) {
                    settings.push(c);
                }
            }
        }
        let mut devices = Vec::new();
        for (&device, d) in &r.devices {
            if d.tensors.is_empty() {
                continue;
            }
            let mut calls = Calls::default();
            for t in &d.tensors {
                if t.made == Made::Forward {
                    calls.chain(p, t.site);
                }
            }
            // Workspaces hide among the temporaries of the forward and backward passes.
            let mut sites: rustc_hash::FxHashMap<crate::model::SiteId, bool> =
                rustc_hash::FxHashMap::default();
            for t in &d.tensors {
                if matches!(t.made, Made::Forward | Made::Backward) && t.size >= WORKSPACE_MIN {
                    sites.entry(t.site).or_insert_with(|| workspace(p, t.site));
                }
            }
            let follows = plan::following(d, &|site| sites.get(&site).copied().unwrap_or(false));
            let ctx = DeviceCtx {
                p,
                d,
                calls: &calls,
                follows: &follows,
                outside_max: d
                    .ops
                    .iter()
                    .filter_map(|op| match *op {
                        Op::Alloc { outside, .. } | Op::Oom { outside, .. } => Some(outside),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0),
                own: &own,
                settings: &settings,
                opts,
            };
            let (df, names) = ctx.fit(device, &mut asked_matched);
            known_names.extend(names);
            devices.push(df);
        }
        if !devices.is_empty() {
            processes.push(ProcessFit {
                pid: p.pid(),
                alloc_conf: shown,
                devices,
            });
        }
    }
    if let Some(i) = asked_matched.iter().position(|m| !m) {
        known_names.sort();
        known_names.dedup();
        return Err(Error::NoSuchModule {
            asked: opts.checkpoint[i].clone(),
            known: known_names,
        });
    }
    Ok(Fit {
        memory_bytes: opts.memory,
        batch: opts.batch,
        processes,
    })
}

/// One device's fit: what every lever needs.
struct DeviceCtx<'a> {
    p: &'a Process,
    d: &'a DeviceTimeline,
    calls: &'a Calls,
    follows: &'a [bool],
    /// The most the device held outside PyTorch's reserve at a request.
    outside_max: u64,
    own: &'a AllocConf,
    settings: &'a [AllocConf],
    opts: &'a Options,
}

/// A lever's replays: its plan and what it came to under the run's own setting.
struct Tried {
    outcome: Outcome,
    fits: Option<bool>,
    best: Option<SettingFit>,
}

impl DeviceCtx<'_> {
    fn capacity(&self) -> (Option<u64>, Option<&'static str>) {
        match (self.opts.memory, self.d.total) {
            (Some(m), _) => (Some(m), Some("given")),
            (None, Some(t)) => (Some(t), Some("device")),
            (None, None) => (None, None),
        }
    }

    fn cap(&self) -> Option<u64> {
        self.opts
            .memory
            .is_none()
            .then_some(self.d.program_cap)
            .flatten()
    }

    /// Whether `plan` fits under `conf` (None: no capacity known), and its unlimited outcome.
    fn judge(&self, plan: &Plan, conf: &AllocConf) -> (Outcome, Option<bool>) {
        let (capacity, _) = self.capacity();
        let total = self.d.total;
        let free = plan.replay(conf, None, total, None);
        let Some(c) = capacity else {
            return (free, None);
        };
        if free.refused == 0 && free.peak_with_outside <= c && self.cap().is_none() {
            return (free, Some(true));
        }
        // Under pressure the allocator empties its cache and retries: what it then reaches
        // is the peak, when it fits; when it does not, what it would need.
        if !plan.fits(conf, Some(c), total, self.cap()) {
            return (free, Some(false));
        }
        (plan.replay(conf, Some(c), total, self.cap()), Some(true))
    }

    fn fits(&self, plan: &Plan, conf: &AllocConf) -> bool {
        let (capacity, _) = self.capacity();
        match capacity {
            Some(c) => plan.fits(conf, Some(c), self.d.total, self.cap()),
            None => plan.fits(conf, None, self.d.total, None),
        }
    }

    fn try_lever(&self, lever: &Lever) -> Tried {
        let plan = Plan::build(self.d, self.calls, self.follows, lever);
        let (outcome, fits) = self.judge(&plan, self.own);
        let mut best: Option<SettingFit> = None;
        for conf in self.settings {
            let (o, f) = self.judge(&plan, conf);
            let better_fit = f == Some(true) && fits == Some(false);
            let lower = (o.peak_reserved as f64) < outcome.peak_reserved as f64 * (1.0 - BETTER);
            // Better: it fits where the run's own does not, or it is lower and fits as well.
            if better_fit || (lower && f != Some(false)) {
                let beats = best
                    .as_ref()
                    .is_none_or(|b| o.peak_reserved < b.peak_reserved_bytes);
                if beats {
                    best = Some(SettingFit {
                        alloc_conf: conf.source.clone(),
                        peak_reserved_bytes: o.peak_reserved,
                        fits: f,
                        batch_factor: None,
                        batch: None,
                    });
                }
            }
        }
        Tried {
            outcome,
            fits,
            best,
        }
    }

    /// The largest batch (in `units` of the traced one) that fits under `conf`, with
    /// `checkpoint`; None when even one unit does not. Whether a batch fits is not monotone
    /// in the batch (the allocator's rounding and caching make a slightly larger batch fit
    /// where a smaller did not), so a bisection would stop at whichever edge it met first.
    /// Instead: up from `guess` (a linear estimate) by a quarter at a time until the tensors
    /// alone could not fit (a batch no cache can save), then down from there on a grid of
    /// [`GRID`] steps to the first batch that fits, then a bisection inside that step.
    fn largest(
        &self,
        conf: &AllocConf,
        checkpoint: &[CallKey],
        units: u64,
        guess: u64,
    ) -> Option<u64> {
        let (capacity, _) = self.capacity();
        let capacity = capacity?;
        let most = units.saturating_mul(MAX_FACTOR);
        let plan = |u: u64| {
            Plan::build(
                self.d,
                self.calls,
                self.follows,
                &Lever {
                    factor: u as f64 / units as f64,
                    checkpoint: checkpoint.to_vec(),
                },
            )
        };
        let fits = |u: u64| self.fits(&plan(u), conf);
        // A batch whose tensors alone (rounded, with what is outside the reserve) pass the
        // capacity never fits.
        let hopeless = |u: u64| {
            let o = plan(u).replay(conf, None, self.d.total, None);
            o.peak_allocated.saturating_add(self.outside_max) > capacity
        };
        let mut hi = guess.clamp(1, most);
        while !hopeless(hi) {
            if hi >= most {
                return Some(most)
                    .filter(|&m| fits(m))
                    .or_else(|| self.down(&fits, 1, most));
            }
            hi = (hi + hi.div_ceil(4)).min(most);
        }
        self.down(&fits, 1, hi)
    }

    /// The largest `u` in `lo..hi` with `fits(u)`, searched down from `hi` on a grid, then
    /// bisected inside the grid step (see [`DeviceCtx::largest`]).
    fn down(&self, fits: &dyn Fn(u64) -> bool, lo: u64, hi: u64) -> Option<u64> {
        let grid = if self.opts.brief { BRIEF_GRID } else { GRID };
        let step = (hi.saturating_sub(lo) / grid).max(1);
        let mut top = hi;
        let found = loop {
            let u = top.saturating_sub(step).max(lo);
            if fits(u) {
                break u;
            }
            if u == lo {
                return None;
            }
            top = u;
        };
        let (mut lo, mut hi) = (found, top);
        // A report's line is said to two digits: a step of 1/64 of the batch found is enough.
        let enough = if self.opts.brief { (lo / 64).max(1) } else { 1 };
        while hi - lo > enough {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// A first guess at the largest batch, in `units`: the peak reserve grows from its value
    /// at the traced batch as it did to twice that batch (None: it did not grow).
    fn guess(&self, units: u64, checkpoint: &[CallKey]) -> u64 {
        let (capacity, _) = self.capacity();
        let peak = |factor: f64| {
            let lever = Lever {
                factor,
                checkpoint: checkpoint.to_vec(),
            };
            Plan::build(self.d, self.calls, self.follows, &lever).replay(
                self.own,
                None,
                self.d.total,
                None,
            )
        };
        let (one, two) = (peak(1.0), peak(2.0));
        let room = capacity.unwrap_or(0).saturating_sub(one.peak_with_outside) as f64;
        let per_batch = two.peak_with_outside.saturating_sub(one.peak_with_outside) as f64;
        if per_batch <= 0.0 {
            return units.saturating_mul(MAX_FACTOR);
        }
        let factor = if one.peak_with_outside > capacity.unwrap_or(0) {
            1.0 - (one.peak_with_outside - capacity.unwrap_or(0)) as f64 / per_batch
        } else {
            1.0 + room / per_batch
        };
        (factor.max(0.0) * units as f64) as u64
    }

    fn fit(&self, device: i16, asked_matched: &mut [bool]) -> (DeviceFit, Vec<String>) {
        let d = self.d;
        let (capacity, capacity_source) = self.capacity();
        // The run itself, replayed on its own device: the check of the model (a recorded
        // out-of-memory is refused here as it was in the run).
        let base = {
            let plan = Plan::build(d, self.calls, self.follows, &Lever::default());
            match d.total {
                Some(total) => plan.replay(self.own, Some(total), Some(total), d.program_cap),
                None => plan.replay(self.own, None, None, None),
            }
        };
        let outside_bytes = self.outside_max;
        let last_oom = d.ops.iter().rposition(|op| matches!(op, Op::Oom { .. }));
        let last_step = d.ops.iter().rposition(|op| matches!(op, Op::Step));
        let complete = match (last_oom, last_step) {
            (None, _) => true,
            (Some(o), Some(s)) => s > o,
            (Some(_), None) => false,
        };
        let at_peak = peak_roles(d, self.follows);
        let mut withheld = Vec::new();
        let mut levers = Vec::new();
        let assumed = assumption(&at_peak, complete);
        let batch_ok = if at_peak.tensor_bytes > 0
            && at_peak.unknown_bytes as f64 > UNKNOWN_SHARE * at_peak.tensor_bytes as f64
        {
            withheld.push(Withheld {
                lever: "batch",
                reason: format!(
                    "no rule decides the role of {} of the {} of tensors at the peak (their \
                     call sites have no Python frames: traced with stacks off, or made by C++), \
                     so what follows the batch is unknown",
                    fmt_bytes(at_peak.unknown_bytes),
                    fmt_bytes(at_peak.tensor_bytes)
                ),
            });
            false
        } else if at_peak.follows_batch_bytes == 0 {
            withheld.push(Withheld {
                lever: "batch",
                reason: "none of the tensors at the peak follows the batch (no activations, \
                         temporaries or inputs)"
                    .to_string(),
            });
            false
        } else {
            true
        };
        let batch_of = |factor: f64| self.opts.batch.map(|n| (n as f64 * factor).round() as u64);
        let lever_fit = |kind, name: String, factor: f64, ckpt: Vec<String>, t: Tried| LeverFit {
            kind,
            name,
            batch_factor: factor,
            batch: batch_of(factor),
            checkpoint: ckpt,
            peak_reserved_bytes: t.outcome.peak_reserved,
            peak_allocated_bytes: t.outcome.peak_allocated,
            fits: t.fits,
            lower_bound: !complete,
            assumed: assumed.clone(),
            best_setting: t.best,
        };
        if batch_ok && !self.opts.brief {
            for factor in [0.5, 2.0] {
                let t = self.try_lever(&Lever {
                    factor,
                    checkpoint: Vec::new(),
                });
                levers.push(lever_fit(
                    LeverKind::Batch,
                    batch_name(factor, batch_of(factor)),
                    factor,
                    Vec::new(),
                    t,
                ));
            }
        }
        // Checkpointing candidates.
        let candidates = candidates(self.p, d, self.calls);
        let names: Vec<String> = candidates
            .iter()
            .map(|c| format!("{}@{}", c.name.module, c.name.call))
            .collect();
        let chosen: Vec<(Vec<CallKey>, String)> = if self.opts.checkpoint.is_empty() {
            candidates
                .iter()
                .take(if self.opts.brief { 1 } else { CANDIDATES })
                .map(|c| (vec![c.key], call_label(&c.name)))
                .collect()
        } else {
            let mut v = Vec::new();
            for (i, asked) in self.opts.checkpoint.iter().enumerate() {
                let matched: Vec<&CallHeld> = candidates
                    .iter()
                    .filter(|c| calls::matches(&c.name, asked))
                    .collect();
                if !matched.is_empty() {
                    asked_matched[i] = true;
                    let labels: Vec<String> = matched.iter().map(|c| call_label(&c.name)).collect();
                    v.push((
                        matched.iter().map(|c| c.key).collect(),
                        labels.join(" and "),
                    ));
                }
            }
            v
        };
        if chosen.is_empty() && self.opts.checkpoint.is_empty() {
            withheld.push(Withheld {
                lever: "checkpoint",
                reason: "no module call holds saved activations (no forward pass of a torch.nn \
                         module with Python frames, or none whose tensors live into a backward \
                         pass)"
                    .to_string(),
            });
        }
        let mut best_ckpt: Option<(Vec<CallKey>, String, u64)> = None;
        for (keys, label) in &chosen {
            let t = self.try_lever(&Lever {
                factor: 1.0,
                checkpoint: keys.clone(),
            });
            if best_ckpt
                .as_ref()
                .is_none_or(|b| t.outcome.peak_reserved < b.2)
            {
                best_ckpt = Some((keys.clone(), label.clone(), t.outcome.peak_reserved));
            }
            levers.push(lever_fit(
                LeverKind::Checkpoint,
                format!("checkpoint {label}"),
                1.0,
                vec![label.clone()],
                t,
            ));
        }
        // The largest batch that fits: with the run's own setting, the best setting, and the
        // best checkpointing.
        if batch_ok {
            if capacity.is_none() {
                withheld.push(Withheld {
                    lever: "largest_batch",
                    reason: "the trace does not say the device's size; give one with --memory"
                        .to_string(),
                });
            } else {
                let units = self.opts.batch.unwrap_or(FACTOR_UNITS).max(1);
                let mut found = |ckpt: &[CallKey], label: Option<&str>| -> Option<LeverFit> {
                    let guess = self.guess(units, ckpt);
                    let Some(u) = self.largest(self.own, ckpt, units, guess) else {
                        withheld.push(Withheld {
                            lever: "largest_batch",
                            reason: format!(
                                "not even 1/{units} of the traced batch fits {}{}: the memory that \
                                 does not follow the batch ({}) and the allocator's rounding \
                                 leave no room",
                                fmt_bytes(capacity.unwrap_or(0)),
                                label.map(|l| format!(" with {l} checkpointed")).unwrap_or_default(),
                                fmt_bytes(at_peak.fixed_bytes + at_peak.unknown_bytes)
                            ),
                        });
                        return None;
                    };
                    let factor = u as f64 / units as f64;
                    let mut t = self.try_lever(&Lever {
                        factor,
                        checkpoint: ckpt.to_vec(),
                    });
                    // A setting that fits a larger batch.
                    let mut best: Option<SettingFit> = None;
                    for conf in self.settings {
                        if let Some(v) = self.largest(conf, ckpt, units, u).filter(|&v| v > u) {
                            if best.as_ref().is_none_or(|b| {
                                b.batch_factor.is_some_and(|f| f < v as f64 / units as f64)
                            }) {
                                let f = v as f64 / units as f64;
                                let plan = Plan::build(
                                    self.d,
                                    self.calls,
                                    self.follows,
                                    &Lever {
                                        factor: f,
                                        checkpoint: ckpt.to_vec(),
                                    },
                                );
                                let (o, fits) = self.judge(&plan, conf);
                                best = Some(SettingFit {
                                    alloc_conf: conf.source.clone(),
                                    peak_reserved_bytes: o.peak_reserved,
                                    fits,
                                    batch_factor: Some(f),
                                    batch: batch_of(f),
                                });
                            }
                        }
                    }
                    t.best = best;
                    let (kind, name) = match label {
                        None => (
                            LeverKind::LargestBatch,
                            format!(
                                "largest batch that fits: {}{}",
                                if complete { "" } else { "at most " },
                                batch_name(factor, batch_of(factor))
                            ),
                        ),
                        Some(l) => (
                            LeverKind::CheckpointLargestBatch,
                            format!(
                                "largest batch that fits with {l} checkpointed: {}",
                                batch_name(factor, batch_of(factor))
                            ),
                        ),
                    };
                    Some(lever_fit(
                        kind,
                        name,
                        factor,
                        label.map(|l| vec![l.to_string()]).unwrap_or_default(),
                        t,
                    ))
                };
                if let Some(l) = found(&[], None) {
                    levers.push(l);
                }
                if let Some((keys, label, _)) = best_ckpt.as_ref().filter(|_| !self.opts.brief) {
                    if let Some(l) = found(keys, Some(label)) {
                        levers.push(l);
                    }
                }
            }
        }
        let checkpoint_candidates = candidates
            .iter()
            .map(|c| Candidate {
                module: c.name.module.clone(),
                call: c.name.call.clone(),
                saved_activation_bytes: c.saved,
                calls: c.count,
            })
            .collect();
        (
            DeviceFit {
                device,
                capacity_bytes: capacity,
                capacity_source,
                program_cap_bytes: self.cap(),
                recorded_peak_reserved_bytes: d.recorded_peak_reserved,
                replayed_peak_reserved_bytes: base.peak_reserved,
                outside_bytes,
                complete,
                at_peak,
                levers,
                checkpoint_candidates,
                withheld,
            },
            names,
        )
    }
}

fn batch_name(factor: f64, batch: Option<u64>) -> String {
    let f = if (factor - factor.round()).abs() < 1e-9 {
        format!("x{}", factor.round() as u64)
    } else {
        format!("x{:.2}", factor).trim_end_matches('0').to_string()
    };
    match batch {
        Some(b) => format!("batch {b} ({f})"),
        None => format!("batch {f}"),
    }
}

fn call_label(n: &CallName) -> String {
    format!("{} at {}", n.module, n.call)
}

/// What every prediction assumes, in one sentence.
fn assumption(at_peak: &PeakRoles, complete: bool) -> String {
    let mut s = format!(
        "activations, temporaries and inputs follow the batch ({} at the peak); parameters, \
         gradients, optimizer state and what the program keeps from before its loop do not ({})",
        fmt_bytes(at_peak.follows_batch_bytes),
        fmt_bytes(at_peak.fixed_bytes)
    );
    if at_peak.unknown_bytes > 0 {
        s += &format!(
            "; {} whose role nothing decides are left as they are",
            fmt_bytes(at_peak.unknown_bytes)
        );
    }
    if !complete {
        s += "; the run ended in the step that ran out of memory, so what the rest of that step \
              needs is not in the trace: peaks are lower bounds";
    }
    s
}

/// The roles of the tensors at the device's tensor peak.
fn peak_roles(d: &DeviceTimeline, follows: &[bool]) -> PeakRoles {
    let (alive, total) = d.alive_at_tensor_peak();
    let mut roles = [0u64; ROLES.len()];
    let (mut follow, mut fixed, mut unknown) = (0u64, 0u64, 0u64);
    for &t in &alive {
        let tensor = &d.tensors[t as usize];
        roles[tensor.role as usize] += tensor.size;
        if tensor.made == Made::Unknown {
            unknown += tensor.size;
        } else if follows[t as usize] {
            follow += tensor.size;
        } else {
            fixed += tensor.size;
        }
    }
    PeakRoles {
        tensor_bytes: total,
        roles: ROLES
            .iter()
            .filter(|r| roles[**r as usize] > 0)
            .map(|r| (r.name(), roles[*r as usize]))
            .collect(),
        follows_batch_bytes: follow,
        fixed_bytes: fixed,
        unknown_bytes: unknown,
    }
}

fn saved_activation(t: &timeline::Tensor) -> bool {
    t.role == Role::Activation && t.made == Made::Forward
}

/// A module call with the saved activations made under it that are alive at their peak,
/// and how often it ran.
struct CallHeld {
    key: CallKey,
    name: CallName,
    saved: u64,
    count: u64,
}

/// Every module call holding saved activations when they add up to the most, most first; a
/// call that holds hardly more than one call inside it (the whole model around its one
/// body, a block around its one layer) is left out: checkpointing the inner one does the same
/// with less recomputation (see [`NESTED_SHARE`]).
fn candidates(p: &Process, d: &DeviceTimeline, calls: &Calls) -> Vec<CallHeld> {
    use std::collections::HashMap;
    let (alive, _) = d.alive_at_peak_of(saved_activation);
    let mut saved: HashMap<CallKey, u64> = HashMap::new();
    // Bytes made under both an outer call and a call inside it.
    let mut nested: HashMap<(CallKey, CallKey), u64> = HashMap::new();
    for &t in &alive {
        let tensor = &d.tensors[t as usize];
        if !saved_activation(tensor) {
            continue;
        }
        let mut chain: Vec<CallKey> = Vec::new();
        for &k in calls.known(tensor.site) {
            if !chain.contains(&k) {
                chain.push(k);
            }
        }
        for (j, &k) in chain.iter().enumerate() {
            *saved.entry(k).or_default() += tensor.size;
            for &o in &chain[..j] {
                *nested.entry((o, k)).or_default() += tensor.size;
            }
        }
    }
    let kept: Vec<(CallKey, u64)> = saved
        .iter()
        .filter(|&(&k, &b)| {
            b > 0
                && !nested
                    .iter()
                    .any(|(&(o, _), &both)| o == k && both as f64 >= NESTED_SHARE * b as f64)
        })
        .map(|(&k, &b)| (k, b))
        .collect();
    let mut out: Vec<CallHeld> = kept
        .into_iter()
        .map(|(key, saved)| CallHeld {
            key,
            name: calls::name(p, key),
            saved,
            count: plan::instance_count(d, calls, key),
        })
        .collect();
    rank(&mut out);
    out
}

/// Most saved activations first; ties (a `Linear` and a `ReLU` called from the same line of a
/// `Sequential`, holding the same bytes) by where they were called, the module, then the call's
/// codes: the same trace gives the same candidates in the same order whatever the order of
/// the maps they were added up in (it was the order of a randomly seeded hash map: two reports
/// of one trace could name different candidates first).
fn rank(held: &mut [CallHeld]) {
    held.sort_by(|a, b| {
        b.saved
            .cmp(&a.saved)
            .then_with(|| a.name.call.cmp(&b.name.call))
            .then_with(|| a.name.module.cmp(&b.name.module))
            .then_with(|| a.key.cmp(&b.key))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tied_candidates_come_in_one_order() {
        let held = |module: &str, callee_code: u32, saved: u64| CallHeld {
            key: CallKey {
                caller_code: 1,
                caller_line: 259,
                callee_code,
            },
            name: CallName {
                module: module.into(),
                call_path: "/torch/nn/container.py:259".into(),
                call: "container.py:259".into(),
                user_code: false,
            },
            saved,
            count: 16,
        };
        let order = |mut v: Vec<CallHeld>| {
            rank(&mut v);
            v.iter()
                .map(|c| (c.name.module.clone(), c.key.callee_code))
                .collect::<Vec<_>>()
        };
        let a = || {
            vec![
                held("ReLU", 7, 1 << 20),
                held("Linear", 5, 1 << 20),
                held("Sequential", 3, 2 << 20),
                held("Linear", 4, 1 << 20),
            ]
        };
        let mut b = a();
        b.reverse();
        let want = vec![
            ("Sequential".to_string(), 3),
            ("Linear".to_string(), 4),
            ("Linear".to_string(), 5),
            ("ReLU".to_string(), 7),
        ];
        assert_eq!(order(a()), want);
        assert_eq!(order(b), want);
    }

    #[test]
    fn a_lever_kind_is_named_as_it_serializes() {
        for k in [
            LeverKind::Batch,
            LeverKind::LargestBatch,
            LeverKind::Checkpoint,
            LeverKind::CheckpointLargestBatch,
        ] {
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::Value::from(k.name())
            );
        }
    }
}
