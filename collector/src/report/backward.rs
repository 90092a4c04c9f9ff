//! PyTorch's backward pass in the user's words. Its allocations are made on the autograd
//! engine's threads, which have no Python frames: the stack alone names a C++ node
//! (`torch::autograd::generated::AddmmBackward0::apply`), or only the engine. What a user can
//! change is the forward line whose op made the node, so every place that names a call site
//! names such a site `backward of addmm at train.py:25` ([`Backward`]'s text), through
//! [`super::names::site_name`].
//!
//! The forward lines come from the other call sites of the same process: those whose native
//! stack runs the op's dispatcher entry (`at::_ops::addmm::call`), by their user line (an
//! inference, see docs/sites.md, "Backward pass"). Allocations the engine makes outside any
//! node are named by the lines that ran the backward pass (`loss.backward()`). A [`Lookup`]
//! reads every Python call site of its process once, the first time it meets a backward-pass
//! site, and keeps only what naming needs (the ops, the user line, the Python frames).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use oomtrace_proto::python::PyFrame;

use super::roles::{self, backward_node, dispatched_ops, forward_op, is_autograd_engine};
use super::symbolize::{python_culprit, runs_python};
use crate::analysis::{BackwardNode, PythonLine};
use crate::model::{FrameInfo, Process, SiteId};

/// Forward lines kept per backward site, most allocations first.
pub const FORWARD_LINES: usize = 5;

/// Forward lines a name shows; the rest are counted (`and 2 more`).
const NAMED_LINES: usize = 2;

/// A line that made a backward-pass site: the forward line of its node, or a line that ran the
/// backward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardLine {
    /// The user line (innermost user Python frame) and what its call sites allocated over the
    /// run.
    pub line: PythonLine,
    /// The Python frames of its call site that allocated most, outermost first (the flame
    /// graph puts the backward site under them).
    pub path: Vec<FrameInfo>,
}

/// A call site in PyTorch's backward pass (no Python frames but oomtrace's own), as far as the
/// stacks tell.
#[derive(Clone, Debug, PartialEq)]
pub enum Backward {
    /// In autograd node `node` (`AddmmBackward0`, exact: it is a frame), which differentiates
    /// forward op `op` (`addmm`; empty when the node's name does not follow PyTorch's naming),
    /// made at the lines `forward` (an inference; empty when no call site ran the op).
    Node {
        node: String,
        op: String,
        forward: Vec<ForwardLine>,
    },
    /// In the autograd engine outside any node (a gradient summed to its input's shape): the
    /// node is not on the stack; `calls` are the lines that ran the backward pass.
    Engine { calls: Vec<ForwardLine> },
}

impl Backward {
    /// The lines it is named by (forward lines, or the lines that ran the backward pass).
    pub fn lines(&self) -> &[ForwardLine] {
        match self {
            Backward::Node { forward, .. } => forward,
            Backward::Engine { calls } => calls,
        }
    }

    /// The report's `backward_node` (a node only).
    pub fn node(&self) -> Option<BackwardNode> {
        match self {
            Backward::Node { node, op, forward } => Some(BackwardNode {
                name: node.clone(),
                forward_op: op.clone(),
                forward_lines: forward.iter().map(|l| l.line.clone()).collect(),
            }),
            Backward::Engine { .. } => None,
        }
    }

    /// The Python frames the flame graph puts it under, outermost first: those its lines'
    /// call sites share (all of them with one line), none without a line.
    pub fn forward_path(&self) -> Vec<FrameInfo> {
        let mut lines = self.lines().iter();
        let Some(first) = lines.next() else {
            return Vec::new();
        };
        let mut path = first.path.clone();
        for l in lines {
            let same = path
                .iter()
                .zip(&l.path)
                .take_while(|(a, b)| {
                    a.file == b.file && a.line == b.line && a.function == b.function
                })
                .count();
            path.truncate(same);
        }
        path
    }

    /// What it is, without its lines: `backward of addmm`, `backward (autograd engine)`,
    /// `AccumulateGrad (backward pass)` (a node whose op its name does not say).
    pub fn what(&self) -> String {
        match self {
            Backward::Node { node, op, .. } if op.is_empty() => format!("{node} (backward pass)"),
            Backward::Node { op, .. } => format!("backward of {op}"),
            Backward::Engine { .. } => "backward (autograd engine)".to_string(),
        }
    }

    /// What it is under [`Backward::forward_path`] in a flame graph: [`Backward::what`] when
    /// that path holds its lines' frames, its whole name when the lines share none.
    pub fn leaf(&self) -> String {
        if self.forward_path().is_empty() {
            self.to_string()
        } else {
            self.what()
        }
    }

    /// The file and line of its first line (most allocations), if any.
    pub fn first_line(&self) -> Option<(&str, u32)> {
        self.lines()
            .first()
            .map(|l| (l.line.file.as_str(), l.line.line))
    }
}

/// `a.py:1`, `a.py:1 and a.py:2`, `a.py:1, a.py:2 and 3 more`.
fn named_lines(lines: &[ForwardLine]) -> String {
    let names: Vec<&str> = lines.iter().map(|l| l.line.description.as_str()).collect();
    if names.len() <= NAMED_LINES {
        return names.join(" and ");
    }
    format!(
        "{} and {} more",
        names[..NAMED_LINES].join(", "),
        names.len() - NAMED_LINES
    )
}

/// How every place names it: `backward of addmm at train.py:25` (a node and its forward line),
/// `backward of addmm (forward line not seen)`, `AccumulateGrad (backward pass)` (a node whose
/// op its name does not say), `backward at train.py:27 (autograd engine)` (the engine outside
/// any node, and the line that ran the backward pass), `backward pass (autograd engine)`.
impl fmt::Display for Backward {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backward::Node { node, op, .. } if op.is_empty() => {
                write!(out, "{node} (backward pass)")
            }
            Backward::Node { op, forward, .. } if forward.is_empty() => {
                write!(out, "backward of {op} (forward line not seen)")
            }
            Backward::Node { op, forward, .. } => {
                write!(out, "backward of {op} at {}", named_lines(forward))
            }
            Backward::Engine { calls } if calls.is_empty() => {
                write!(out, "backward pass (autograd engine)")
            }
            Backward::Engine { calls } => {
                write!(out, "backward at {} (autograd engine)", named_lines(calls))
            }
        }
    }
}

/// Whether a stack is PyTorch's backward pass: no Python frames (but oomtrace's own), and an
/// autograd node or the autograd engine among its native frames. Needs no other site.
pub fn in_backward(frames: &[FrameInfo]) -> bool {
    !runs_python(frames)
        && (backward_node(frames).is_some() || frames.iter().any(is_autograd_engine))
}

/// Whether a Python frame is PyTorch's entry to the backward pass (`Tensor.backward`,
/// `torch.autograd.backward`, `torch.autograd.grad`).
fn runs_backward(f: &FrameInfo) -> bool {
    let function = f.function.rsplit('.').next().unwrap_or(&f.function);
    f.python
        && (f.file.ends_with("/torch/_tensor.py")
            || f.file.ends_with("/torch/autograd/__init__.py"))
        && matches!(function, "backward" | "grad")
}

/// What naming needs of one Python call site.
struct PySite {
    /// Its dispatcher entries (`addmm`, `pow_Tensor_Scalar`).
    ops: Vec<String>,
    /// It ran in `Tensor.backward()` or `torch.autograd.grad`.
    backward_call: bool,
    /// Its user line.
    line: (String, u32, String),
    /// Its Python frames, outermost first.
    path: Vec<FrameInfo>,
    bytes: u64,
    count: u64,
}

/// The forward lines of one process's backward-pass sites, built from its Python call sites
/// the first time one is asked for, then kept (per op).
#[derive(Default)]
pub struct Lookup {
    sites: Option<Vec<PySite>>,
    by_op: HashMap<String, Vec<ForwardLine>>,
    calls: Option<Vec<ForwardLine>>,
}

impl Lookup {
    pub fn new() -> Lookup {
        Lookup::default()
    }

    /// The backward-pass place of `frames`, a call site of `p` (`stack_of` gives any site's
    /// frames, symbolized); `None` outside the backward pass. The first call reads every Python
    /// call site of `p`: pass the same process to one lookup.
    pub fn backward(
        &mut self,
        p: &Process,
        frames: &[FrameInfo],
        stack_of: &mut dyn FnMut(SiteId) -> Vec<FrameInfo>,
    ) -> Option<Backward> {
        if !in_backward(frames) {
            return None;
        }
        if let Some(node) = backward_node(frames) {
            let op = forward_op(node).unwrap_or_default();
            let forward = if op.is_empty() {
                Vec::new()
            } else {
                self.forward_lines(p, &op, stack_of)
            };
            return Some(Backward::Node {
                node: node.to_string(),
                op,
                forward,
            });
        }
        if self.calls.is_none() {
            let lines = lines_of(self.sites(p, stack_of), |s| s.backward_call);
            self.calls = Some(lines);
        }
        Some(Backward::Engine {
            calls: self.calls.clone().unwrap_or_default(),
        })
    }

    /// The lines whose call sites ran operator `op` (`at::_ops::addmm`), most allocations
    /// first, at most [`FORWARD_LINES`].
    pub fn forward_lines(
        &mut self,
        p: &Process,
        op: &str,
        stack_of: &mut dyn FnMut(SiteId) -> Vec<FrameInfo>,
    ) -> Vec<ForwardLine> {
        if let Some(lines) = self.by_op.get(op) {
            return lines.clone();
        }
        let lines = lines_of(self.sites(p, stack_of), |s| {
            s.ops.iter().any(|e| roles::is_op_entry(e, op))
        });
        self.by_op.insert(op.to_string(), lines.clone());
        lines
    }

    /// How a site of `p` without Python frames is named in a list of lines (`cache grew at`):
    /// its backward-pass place, else the kind of thread it ran on.
    pub fn native_place(
        &mut self,
        p: &Process,
        frames: &[FrameInfo],
        stack_of: &mut dyn FnMut(SiteId) -> Vec<FrameInfo>,
    ) -> String {
        match self.backward(p, frames, stack_of) {
            Some(b) => b.to_string(),
            None => super::hints::thread_kind(frames),
        }
    }

    fn sites(
        &mut self,
        p: &Process,
        stack_of: &mut dyn FnMut(SiteId) -> Vec<FrameInfo>,
    ) -> &[PySite] {
        self.sites.get_or_insert_with(|| python_sites(p, stack_of))
    }
}

/// The Python call sites of `p` that ran a dispatcher entry or the backward pass, each read
/// once (its native frames symbolized by `stack_of`).
fn python_sites(p: &Process, stack_of: &mut dyn FnMut(SiteId) -> Vec<FrameInfo>) -> Vec<PySite> {
    let mut out = Vec::new();
    for (i, raw) in p.sites.iter().enumerate().skip(1) {
        if !raw.iter().any(|f| PyFrame::decode(f.addr).is_some()) {
            continue;
        }
        let site = SiteId(i as u32);
        let frames = stack_of(site);
        let mut ops: Vec<String> = Vec::new();
        for f in frames.iter().filter(|f| !f.python) {
            for entry in dispatched_ops(f) {
                if !ops.iter().any(|o| o == entry) {
                    ops.push(entry.to_string());
                }
            }
        }
        let backward_call = frames.iter().any(runs_backward);
        if ops.is_empty() && !backward_call {
            continue;
        }
        let Some(line) = python_culprit(&frames) else {
            continue;
        };
        // By device (a few), not by scanning every site of every device for this one.
        let (bytes, count) = p
            .devices
            .keys()
            .filter_map(|&d| p.site_stats.get(&(site, d)))
            .fold((0u64, 0u64), |(b, c), st| {
                (b.saturating_add(st.total_bytes), c + st.allocations)
            });
        out.push(PySite {
            ops,
            backward_call,
            line: (line.file.clone(), line.line, line.function.clone()),
            // What a label reads of a frame; addresses would only cost memory per site.
            path: frames
                .iter()
                .rev()
                .filter(|f| f.python)
                .map(|f| FrameInfo {
                    function: f.function.clone(),
                    file: f.file.clone(),
                    line: f.line,
                    module: f.module.clone(),
                    python: true,
                    ..FrameInfo::default()
                })
                .collect(),
            bytes,
            count,
        });
    }
    out
}

/// The user lines of the sites `wanted` picks, with what their sites allocated, most
/// allocations first (then by name), at most [`FORWARD_LINES`]; each with the Python frames of
/// its site that allocated most.
fn lines_of(sites: &[PySite], wanted: impl Fn(&PySite) -> bool) -> Vec<ForwardLine> {
    let mut by_line: BTreeMap<&(String, u32, String), (u64, u64, &PySite)> = BTreeMap::new();
    for s in sites.iter().filter(|s| wanted(s)) {
        let e = by_line.entry(&s.line).or_insert((0, 0, s));
        e.0 = e.0.saturating_add(s.bytes);
        e.1 += s.count;
        if s.count > e.2.count {
            e.2 = s;
        }
    }
    let mut lines: Vec<ForwardLine> = by_line
        .into_iter()
        .map(|((file, line, function), (bytes, count, s))| ForwardLine {
            line: PythonLine {
                description: format!("{}:{line}", file.rsplit('/').next().unwrap_or(file)),
                file: file.clone(),
                line: *line,
                function: function.clone(),
                bytes,
                count,
            },
            path: s.path.clone(),
        })
        .collect();
    lines.sort_by(|a, b| {
        b.line
            .count
            .cmp(&a.line.count)
            .then(a.line.description.cmp(&b.line.description))
    });
    lines.truncate(FORWARD_LINES);
    lines
}

#[cfg(test)]
mod tests;
