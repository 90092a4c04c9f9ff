//! Leaks kept by one object are one bug, one finding. `history.append(model(x))` keeps each
//! step's output, and through its autograd graph the activations its forward saved for the
//! backward pass and its input: three call sites, each of which the leak detector finds on its
//! own, and one line to change. The analysis ([`super::Analysis::findings`], and its live
//! lines) reads them together here: this file names no detector.
//!
//! The rule (docs/detection.md, "Leaks kept together"), per process and device, among the sites
//! reported as leaks by the per-site detector (not a buffer replaced by larger ones):
//! - **lockstep**: their live allocations, read at the same step boundary over the last 16
//!   steps before it (warm-up excluded, the youngest `LAG` steps not yet counted), were born in
//!   exactly the same steps, at least [`ByStep::MIN_STEPS`], in the same proportion at every
//!   step ([`ByStep::lockstep`]): what one object keeps is made in the same steps and survives
//!   together. Two leaks that began at different steps, or one that skipped a step, are two.
//! - **a graph can hold them**: each is a PyTorch tensor the anatomy saw made in a forward
//!   pass or before it in its step (an input); at least one was made in a forward pass. The
//!   keeper is the one made in a forward pass that came last in the loop: an output is made
//!   after every tensor its graph saves (its inputs, the activations). Which came last is read
//!   from the Python frames first: at the outermost frame where two sites' stacks part, a
//!   later line of the same function runs later in the loop (`total_loss += model(out)` at
//!   line 11 keeps `out` made at line 10); where they part into different functions (two
//!   layers of one forward) or not at all, the site whose latest tensor came later. A step
//!   boundary cuts the loop anywhere (after the optimizer step), so the latest tensor alone
//!   would name whichever part the cut put last. The others are its parts: `activation`
//!   (made in a forward pass: saved for backward), `input`. Parameters,
//!   gradients, optimizer state and memory outside PyTorch are never parts (no graph keeps
//!   them per step), nor is anything where the anatomy has no Python frames to go by.
//!
//! The keeper's finding stays, named at its line (the user's line that keeps the output); its
//! bytes, allocations and rates become the group's sums, its evidence's amounts too
//! (`at_detection`, `at_end`, `samples`, `peak_bytes`, `live_count`; `trend` stays the
//! keeper's own test), and `parts` lists every member (the keeper first) by role; the others'
//! findings are dropped. Limit: two independent lists appended in the same steps, one of
//! outputs and one of their inputs (`outs.append(model(x).detach())` and `xs.append(x)`), read
//! the same in allocations; they are then one finding too.

use serde::Serialize;

use super::anatomy::{Made, SiteMade};
use super::births::ByStep;
use super::evidence::{end_clause, held_in, AtEnd};
use super::{Evidence, Finding, Kind, Level};
use crate::model::{is_oomtrace_python_file, FrameInfo, Process, SiteId};
use crate::units::{fmt_bytes, fmt_duration, fmt_rate};
use oomtrace_proto::python::PyFrame;

/// What a part is to the object that keeps it. Pinned order: parts are listed this way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartRole {
    /// The object kept: the forward's output (made last).
    Output,
    /// Made in a forward pass and kept with the output: saved for backward by its graph.
    Activation,
    /// Made before the forward pass in its step: the data it ran on.
    Input,
}

impl PartRole {
    /// As a message names its bytes.
    pub fn words(self) -> &'static str {
        match self {
            PartRole::Output => "output",
            PartRole::Activation => "saved activations",
            PartRole::Input => "input",
        }
    }
}

/// One call site of a leak kept with others (`parts` of a leak finding).
#[derive(Clone, Debug, Serialize)]
pub struct Part {
    pub role: PartRole,
    /// Its own rate (the part's trend) and its allocations kept a step.
    pub bytes_per_step: f64,
    pub tensors_per_step: f64,
    /// Live at the end.
    pub bytes: u64,
    pub count: u64,
    /// Its culprit frame (the user's line; set by the report, `""`/0 until then).
    pub file: String,
    pub line: u32,
    pub function: String,
    /// Its call site's frames, innermost first (set by the report).
    pub stack: Vec<FrameInfo>,
    #[serde(skip)]
    pub site: SiteId,
}

/// A leaking call site as the grouping reads it.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub site: SiteId,
    /// Its live allocations by birth step at the last step boundary.
    pub by_step: &'a ByStep,
    /// What its latest tensor was made as (None: no tensor).
    pub made: Option<SiteMade>,
    /// Its Python frames, outermost first ([`python_path`]).
    pub path: Vec<(u32, u32)>,
}

/// A call site's Python frames, outermost first: (code object, line); oomtrace's own frames
/// left out.
pub fn python_path(p: &Process, site: SiteId) -> Vec<(u32, u32)> {
    let Some(frames) = p.sites.get(site.0 as usize) else {
        return Vec::new();
    };
    let mut path: Vec<(u32, u32)> = frames
        .iter()
        .filter_map(|f| PyFrame::decode(f.addr))
        .filter_map(|py| {
            let code = p.codes.get(&py.code)?;
            (!is_oomtrace_python_file(&code.filename))
                .then(|| (py.code, code.line_at(py.offset).unwrap_or(0)))
        })
        .collect();
    path.reverse();
    path
}

/// Whether `a`'s tensors come after `b`'s in the loop that makes both (the module comment):
/// by the line where their Python stacks part in one function, else by their latest tensors.
fn later(a: &Member<'_>, a_made: SiteMade, b: &Member<'_>, b_made: SiteMade) -> bool {
    if let Some((x, y)) = a.path.iter().zip(&b.path).find(|(x, y)| x != y) {
        if x.0 == y.0 && x.1 != y.1 && x.1 > 0 && y.1 > 0 {
            return x.1 > y.1;
        }
    }
    a_made.order > b_made.order
}

/// Leaks kept by one object: every member with its role and allocations a step, the keeper
/// first.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub keeper: SiteId,
    pub members: Vec<(SiteId, PartRole, f64)>,
}

impl Group {
    /// Whether `site` is one of its members other than the keeper.
    pub fn is_part(&self, site: SiteId) -> bool {
        site != self.keeper && self.members.iter().any(|m| m.0 == site)
    }
}

/// Leaking sites a device may have for the grouping to run: it compares them two by two at
/// every step boundary, and a program with more leaks than this has other problems first.
pub const MAX_MEMBERS: usize = 256;

/// The groups among one device's leaking sites (the module comment's rule); none beyond
/// [`MAX_MEMBERS`] sites.
pub fn groups(members: &[Member<'_>]) -> Vec<Group> {
    if members.len() > MAX_MEMBERS {
        return Vec::new();
    }
    let graph: Vec<(&Member<'_>, SiteMade)> = members
        .iter()
        .filter_map(|m| m.made.map(|made| (m, made)))
        .filter(|(_, made)| matches!(made.made, Made::Forward | Made::Idle))
        .collect();
    let mut used = vec![false; graph.len()];
    let mut out = Vec::new();
    for i in 0..graph.len() {
        if used[i] {
            continue;
        }
        let together: Vec<usize> = (i..graph.len())
            .filter(|&j| !used[j] && (j == i || graph[i].0.by_step.lockstep(graph[j].0.by_step)))
            .collect();
        if together.len() < 2 {
            continue;
        }
        let mut forward = together
            .iter()
            .copied()
            .filter(|&j| graph[j].1.made == Made::Forward);
        let Some(mut keeper) = forward.next() else {
            continue;
        };
        for j in forward {
            if later(graph[j].0, graph[j].1, graph[keeper].0, graph[keeper].1) {
                keeper = j;
            }
        }
        let mut parts: Vec<(SiteId, PartRole, f64)> = together
            .iter()
            .filter(|&&j| j != keeper)
            .map(|&j| {
                let role = if graph[j].1.made == Made::Forward {
                    PartRole::Activation
                } else {
                    PartRole::Input
                };
                (graph[j].0.site, role, graph[j].0.by_step.per_step())
            })
            .collect();
        parts.sort_by_key(|p| (p.1, p.0));
        let mut members = vec![(
            graph[keeper].0.site,
            PartRole::Output,
            graph[keeper].0.by_step.per_step(),
        )];
        members.extend(parts);
        for &j in &together {
            used[j] = true;
        }
        out.push(Group {
            keeper: graph[keeper].0.site,
            members,
        });
    }
    out
}

/// The leak finding of `site` on `device` in `v`, if it is one of the per-site detector's
/// (not a buffer replaced by larger ones).
fn leak_at(v: &[Finding], device: i16, site: SiteId) -> Option<usize> {
    v.iter().position(|f| {
        f.kind == Kind::Leak
            && f.device == device
            && f.site == site
            && matches!(&f.evidence, Some(Evidence::Leak(e)) if e.replaced.is_none())
    })
}

/// Makes `g`'s members on `device` one finding in `v`: the keeper's, with the group's sums and
/// its `parts`; the others' findings are removed. False (and `v` unchanged) unless every
/// member has its leak finding there.
pub fn merge(v: &mut Vec<Finding>, device: i16, g: &Group) -> bool {
    let Some(at) = g
        .members
        .iter()
        .map(|m| leak_at(v, device, m.0))
        .collect::<Option<Vec<usize>>>()
    else {
        return false;
    };
    let parts: Vec<Part> = g
        .members
        .iter()
        .zip(&at)
        .map(|(&(site, role, tensors_per_step), &i)| Part {
            role,
            bytes_per_step: v[i].growth_bytes_per_step.unwrap_or(0.0),
            tensors_per_step,
            bytes: v[i].bytes,
            count: v[i].count,
            file: String::new(),
            line: 0,
            function: String::new(),
            stack: Vec::new(),
            site,
        })
        .collect();
    let members: Vec<Finding> = at.iter().skip(1).map(|&i| v[i].clone()).collect();
    let keeper = &mut v[at[0]];
    let own_rate = keeper.growth_bytes_per_step.unwrap_or(0.0);
    for m in &members {
        keeper.bytes = keeper.bytes.saturating_add(m.bytes);
        keeper.count += m.count;
        keeper.growth_bytes_per_step = Some(
            keeper.growth_bytes_per_step.unwrap_or(0.0) + m.growth_bytes_per_step.unwrap_or(0.0),
        );
        keeper.growth_bytes_per_s = keeper
            .growth_bytes_per_s
            .zip(m.growth_bytes_per_s)
            .map(|(a, b)| a + b);
        if let (Level::Confidence(a), Level::Confidence(b)) = (keeper.level, m.level) {
            keeper.level = Level::Confidence(a.max(b));
        }
    }
    let rate = keeper.growth_bytes_per_step.unwrap_or(0.0);
    if let Some(Evidence::Leak(e)) = keeper.evidence.as_mut() {
        let others = members.iter().filter_map(|m| match &m.evidence {
            Some(Evidence::Leak(o)) => Some(o),
            _ => None,
        });
        let mut last_step_bytes = e.at_end.last_step_bytes;
        for o in others {
            e.live_count += o.live_count;
            e.peak_bytes = e.peak_bytes.saturating_add(o.peak_bytes);
            last_step_bytes = last_step_bytes.saturating_add(o.at_end.last_step_bytes);
            if let (Some(d), Some(od)) = (e.at_detection.as_mut(), o.at_detection) {
                d.bytes = d.bytes.saturating_add(od.bytes);
                d.count += od.count;
                d.slope_bytes_per_step += od.slope_bytes_per_step;
                d.slope_bytes_per_s = d
                    .slope_bytes_per_s
                    .zip(od.slope_bytes_per_s)
                    .map(|(a, b)| a + b);
            }
            // Samples of every boundary, newest last: summed from the newest.
            let n = e.samples.len().min(o.samples.len());
            let (skip_e, skip_o) = (e.samples.len() - n, o.samples.len() - n);
            e.samples.drain(..skip_e);
            for (s, x) in e.samples.iter_mut().zip(&o.samples[skip_o..]) {
                *s = s.saturating_add(*x);
            }
        }
        e.slope_bytes_per_s = keeper.growth_bytes_per_s;
        e.at_end = AtEnd::new(
            keeper.bytes,
            keeper.count,
            Some((e.at_end.last_step, last_step_bytes)),
            e.at_end.process_ended,
        );
        // The device fills at the group's rate, not the keeper's alone.
        if rate > 0.0 {
            let faster = own_rate.max(0.0) / rate;
            e.steps_to_oom = e.steps_to_oom.map(|s| s * faster);
            e.time_to_oom_s = e.time_to_oom_s.map(|s| s * faster);
        }
    }
    keeper.parts = parts;
    keeper.message = describe(keeper);
    let mut drop: Vec<usize> = at[1..].to_vec();
    drop.sort_unstable_by(|a, b| b.cmp(a));
    for i in drop {
        v.remove(i);
    }
    true
}

/// How a part's place reads: `train.py:12` (none before the report names it).
fn place(p: &Part) -> Option<String> {
    (p.line > 0).then(|| {
        let file = p.file.rsplit('/').next().unwrap_or(&p.file);
        format!("{file}:{}", p.line)
    })
}

/// "output 1.00 MiB at train.py:12, saved activations 2.00 MiB (at train.py:12), input 1.00
/// MiB from train.py:7": the parts by role, bytes a step, where each was made (when known).
/// `bytes`: with the bytes a step; `output`: with the output itself.
pub fn parts_clause(parts: &[Part], bytes: bool, output: bool) -> String {
    let mut said = Vec::new();
    for role in [PartRole::Output, PartRole::Activation, PartRole::Input] {
        if role == PartRole::Output && !output {
            continue;
        }
        let of: Vec<&Part> = parts.iter().filter(|p| p.role == role).collect();
        if of.is_empty() {
            continue;
        }
        let mut places: Vec<String> = Vec::new();
        for p in &of {
            if let Some(at) = place(p) {
                if !places.contains(&at) {
                    places.push(at);
                }
            }
        }
        let mut text = role.words().to_string();
        if bytes {
            let b: f64 = of.iter().map(|p| p.bytes_per_step.max(0.0)).sum();
            text.push_str(&format!(" {}", fmt_bytes(b.round() as u64)));
        }
        if !places.is_empty() {
            let places = places.join(", ");
            text.push_str(&match role {
                PartRole::Output => format!(" at {places}"),
                PartRole::Activation => format!(" (at {places})"),
                PartRole::Input => format!(" from {places}"),
            });
        }
        said.push(text);
    }
    said.join(", ")
}

/// A kept-together finding's message, from its parts and its (summed) evidence: "keeps each
/// step's output with its graph: +3.00 MiB/step in 3 tensors a step: output 1.00 MiB at
/// train.py:12, saved activations 1.00 MiB (at train.py:12), input 1.00 MiB from train.py:7;
/// when detected at step 9 (...): ...; by the end ...". The report says it again once the
/// parts' lines are known.
pub fn describe(f: &Finding) -> String {
    let Some(Evidence::Leak(e)) = &f.evidence else {
        return f.message.clone();
    };
    let tensors: f64 = f.parts.iter().map(|p| p.tensors_per_step).sum();
    let tensors = if (tensors - tensors.round()).abs() < 0.05 {
        format!("{}", tensors.round() as u64)
    } else {
        format!("{tensors:.1}")
    };
    let mut text = format!(
        "keeps each step's output with its graph: {} in {tensors} tensors a step: {}",
        fmt_rate(f.growth_bytes_per_step.unwrap_or(0.0), f.growth_bytes_per_s),
        parts_clause(&f.parts, true, true)
    );
    if let Some(d) = e.at_detection {
        text.push_str(&format!(
            "; when detected at step {} ({} into the run): {}",
            d.step,
            fmt_duration(d.time_s),
            held_in(d.bytes, d.count, d.surviving_epochs)
        ));
    }
    text.push_str("; ");
    text.push_str(&end_clause(&e.at_end));
    text
}
