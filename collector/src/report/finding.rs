//! The completion of one detector's finding for the report: the process it belongs to, the
//! state at an OOM with its top sites' stacks, its own stack and what the stacks add (the
//! culprit frame, the backward pass's node and forward lines, PyTorch's segments, the lines
//! that made the device grow). What the finding means was decided by the analysis; what
//! depends on the stacks is decided here and in [`super::hints`].

use super::backward::Lookup;
use super::hints::{
    device_growth_hint, in_torch, python_lines, resolve_device_growth, without_tensor_advice,
};
use super::names::site_name;
use super::symbolize::culprit;
use super::{Cause, Finding, Kind, OomDetail, SiteShare};
use crate::analysis::{fragmentation, growth, together, Evidence};
use crate::model::{FrameInfo, Process, SiteId};

/// Completes `f`, a finding of `p`'s analysis. `tensors_traced`: the run traced PyTorch's
/// tensors (advice to trace them is then left out).
pub(super) fn complete_finding(
    f: &mut Finding,
    p: &Process,
    tensors_traced: bool,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    backward: &mut Lookup,
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
            .map(|&(site, bytes, count)| {
                let stack = stack_of(p, site);
                let place = backward.backward(p, &stack, &mut |s| stack_of(p, s));
                SiteShare {
                    bytes,
                    count,
                    name: site_name(&stack, place.as_ref()),
                    stack,
                }
            })
            .collect(),
        reserved_bytes: o.torch_reserved_bytes,
        allocated_bytes: o.tensor_bytes,
        memory_cap_bytes: o.cap(),
        memory_fraction: o.cap_fraction(),
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
    complete_site(f, p, stack_of, backward);
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
            resolve_device_growth(p.stacks(), e, |site| {
                native_place(p, site, stack_of, backward)
            });
        }
        // The lines whose requests made the cache take segments.
        Some(Evidence::Fragmentation(e)) => {
            e.python_lines = python_lines(p.stacks(), &e.grew_at, |site| {
                native_place(p, site, stack_of, backward)
            });
        }
        // A leak of PyTorch's segments: the lines that made the device's cache grow
        // over the same steps say more than the one call that found it exhausted.
        Some(Evidence::Leak(e)) if segments => {
            e.python_lines = python_lines(p.stacks(), &e.cache_grew_at, |site| {
                native_place(p, site, stack_of, backward)
            });
        }
        _ => {}
    }
    if tensors_traced {
        f.hint = without_tensor_advice(&f.hint);
    }
}

/// How a list of lines names `site` of `p` when it has no Python frames (`cache grew at`):
/// its backward-pass place, else its kind of thread.
fn native_place(
    p: &Process,
    site: SiteId,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    backward: &mut Lookup,
) -> String {
    let frames = stack_of(p, site);
    backward.native_place(p, &frames, &mut |s| stack_of(p, s))
}

/// Whether a finding's allocations are PyTorch's caching-allocator segments: its site runs in
/// PyTorch's CUDA library and its events are not tensors (the trace tracker's and the
/// pluggable allocator's stacks pass through that library too).
fn segments_of_torch(p: &Process, f: &Finding) -> bool {
    f.api.is_none_or(|api| !fragmentation::is_tensor_level(api)) && in_torch(p.stacks(), f.site)
}

/// What a finding says once its stack is symbolized: the frame that names it, its name and,
/// in PyTorch's backward pass, the autograd node and the forward lines behind it
/// ([`super::backward`]).
pub(super) fn complete_site(
    f: &mut Finding,
    p: &Process,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    backward: &mut Lookup,
) {
    f.culprit = culprit(&f.stack).cloned();
    if f.stack.is_empty() {
        return;
    }
    let place = backward.backward(p, &f.stack, &mut |s| stack_of(p, s));
    f.site_name = site_name(&f.stack, place.as_ref());
    f.backward_node = place.and_then(|b| b.node());
}
