//! The completion of one detector's finding for the report: the process it belongs to, the
//! state at an OOM with its top sites' stacks, its own stack and what the stacks add (the
//! culprit frame, the backward pass's node and forward lines, PyTorch's segments, the lines
//! that made the device grow). What the finding means was decided by the analysis; what
//! depends on the stacks is decided here and in [`super::hints`].

use std::collections::{BTreeMap, HashMap};

use super::hints::{
    device_growth_hint, in_torch, python_lines, resolve_device_growth, without_tensor_advice,
};
use super::symbolize::{self, culprit};
use super::{roles, BackwardNode, Cause, Finding, Kind, OomDetail, PythonLine, SiteShare};
use crate::analysis::{fragmentation, growth, together, Evidence};
use crate::model::{FrameInfo, Process, SiteId};

/// Completes `f`, a finding of `p`'s analysis. `tensors_traced`: the run traced PyTorch's
/// tensors (advice to trace them is then left out).
pub(super) fn complete_finding(
    f: &mut Finding,
    p: &Process,
    tensors_traced: bool,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    forward: &mut ForwardLines,
) {
    f.pid = p.pid();
    f.rank = p.launch.rank;
    let record = f.record.as_deref();
    f.oom = record.map(|o| OomDetail {
        requested_bytes: o.size,
        result: o.result,
        free_bytes: o.free_bytes,
        total_bytes: o.total_bytes,
        live_bytes: o.live_bytes,
        time_s: o.ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
        unix_s: (p.hello.start_mono_ns != 0).then(|| {
            (p.hello.start_unix_ns as f64 + o.ts_ns as f64 - p.hello.start_mono_ns as f64) / 1e9
        }),
        top_sites: o
            .top_sites
            .iter()
            .map(|&(site, bytes, count)| SiteShare {
                bytes,
                count,
                stack: stack_of(p, site),
            })
            .collect(),
        reserved_bytes: o.torch_reserved_bytes,
        allocated_bytes: o.tensor_bytes,
        reserved_unallocated_bytes: o.in_pieces(),
        remedies: if o.in_pieces().is_some() {
            fragmentation::remedies(&Default::default())
        } else {
            Vec::new()
        },
    });
    if f.site.0 != 0 {
        f.stack = stack_of(p, f.site);
    }
    complete_site(f, p, stack_of, forward);
    // Leaks kept by one object: each part named by its line, and the message says them.
    if !f.parts.is_empty() {
        for part in &mut f.parts {
            part.stack = stack_of(p, part.site);
            if let Some(c) = culprit(&part.stack) {
                (part.file, part.line, part.function) =
                    (c.file.clone(), c.line, c.function.clone());
            }
        }
        f.message = together::describe(f);
    }
    // Decided from the stacks, hence here: a native leak whose site runs in PyTorch's CUDA
    // library is its cache's segments.
    if f.kind == Kind::Leak && f.cause == Cause::NativeLeak && segments_of_torch(p, f) {
        f.cause = Cause::TorchCacheLeak;
        f.hint = growth::TORCH_CACHE_HINT.to_string();
    }
    let segments = segments_of_torch(p, f);
    match f.evidence.as_mut() {
        Some(Evidence::DeviceGrowth(e)) => {
            let hint = std::mem::take(&mut f.hint);
            // A device growth the analysis found fragmented keeps its cause and hint.
            (f.cause, f.hint) = device_growth_hint(p.stacks(), e, f.cause, hint);
            resolve_device_growth(p.stacks(), e, |site| stack_of(p, site));
        }
        // The lines whose requests made the cache take segments.
        Some(Evidence::Fragmentation(e)) => {
            e.python_lines = python_lines(p.stacks(), &e.grew_at, |site| stack_of(p, site));
        }
        // A leak of PyTorch's segments: the lines that made the device's cache grow
        // over the same steps say more than the one call that found it exhausted.
        Some(Evidence::Leak(e)) if segments => {
            e.python_lines = python_lines(p.stacks(), &e.cache_grew_at, |site| stack_of(p, site));
        }
        _ => {}
    }
    if tensors_traced {
        f.hint = without_tensor_advice(&f.hint);
    }
}

/// Whether a finding's allocations are PyTorch's caching-allocator segments: its site runs in
/// PyTorch's CUDA library and its events are not tensors (the trace tracker's and the
/// pluggable allocator's stacks pass through that library too).
fn segments_of_torch(p: &Process, f: &Finding) -> bool {
    f.api.is_none_or(|api| !fragmentation::is_tensor_level(api)) && in_torch(p.stacks(), f.site)
}

/// The forward lines of each operator in one process (see [`forward_lines`]).
pub(super) type ForwardLines = HashMap<String, Vec<PythonLine>>;

/// What a finding says once its stack is symbolized: the frame that names it and, in
/// PyTorch's backward pass, the autograd node and the forward lines behind it.
pub(super) fn complete_site(
    f: &mut Finding,
    p: &Process,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    forward: &mut ForwardLines,
) {
    f.culprit = culprit(&f.stack).cloned();
    if symbolize::runs_python(&f.stack) {
        return;
    }
    let Some(name) = roles::backward_node(&f.stack) else {
        return;
    };
    let forward_op = roles::forward_op(name).unwrap_or_default();
    let forward_lines = if forward_op.is_empty() {
        Vec::new()
    } else {
        forward
            .entry(forward_op.clone())
            .or_insert_with(|| forward_lines(p, &forward_op, stack_of))
            .clone()
    };
    f.backward_node = Some(BackwardNode {
        name: name.to_string(),
        forward_op,
        forward_lines,
    });
}

/// Forward lines kept per backward node, most allocations first.
const FORWARD_LINES: usize = 5;

/// The Python lines (innermost user frame) of every call site of `p` that allocated inside
/// the dispatcher entry of operator `op` (`at::_ops::addmm::call`): where the forward op ran
/// whose autograd node a backward-pass allocation belongs to. Each line counts the
/// allocations of its sites over the whole run; a line that runs the same op on other
/// tensors is among them too (see docs/sites.md, "Backward pass").
fn forward_lines(
    p: &Process,
    op: &str,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
) -> Vec<PythonLine> {
    let mut by_line: BTreeMap<(String, u32, String), (u64, u64)> = BTreeMap::new();
    for (i, raw) in p.sites.iter().enumerate().skip(1) {
        let has_python = raw
            .iter()
            .any(|f| oomtrace_proto::python::PyFrame::decode(f.addr).is_some());
        if !has_python {
            continue;
        }
        let site = SiteId(i as u32);
        let frames = stack_of(p, site);
        if !frames.iter().any(|f| roles::runs_op(f, op)) {
            continue;
        }
        let Some(line) = symbolize::python_culprit(&frames) else {
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
        let e = by_line
            .entry((line.file.clone(), line.line, line.function.clone()))
            .or_default();
        e.0 = e.0.saturating_add(bytes);
        e.1 += count;
    }
    let mut lines: Vec<PythonLine> = by_line
        .into_iter()
        .map(|((file, line, function), (bytes, count))| PythonLine {
            description: format!("{}:{line}", file.rsplit('/').next().unwrap_or(&file)),
            file,
            line,
            function,
            bytes,
            count,
        })
        .collect();
    lines.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(a.description.cmp(&b.description))
    });
    lines.truncate(FORWARD_LINES);
    lines
}
