//! The call sites that still held memory when each process ended (`live_at_exit` findings):
//! the largest per device, what each holds (tensors, PyTorch's reserve, memory outside its
//! allocator) and why it may still be live.

use oomtrace_proto::wire::GoodbyeReason;

use super::backward::Lookup;
use super::finding::complete_site;
use super::{Cause, Finding, Held, Kind};
use crate::analysis::{Analysis, Severity};
use crate::model::{EndState, FrameInfo, Process, SiteId, HOST_DEVICE};
use crate::units::fmt_bytes;

/// `p`'s call sites live at exit, the `top` largest per device: PyTorch's segments among
/// them when `segments`, its tensors and the memory outside its allocator otherwise.
pub(super) fn live_at_exit(
    p: &Process,
    a: &Analysis,
    segments: bool,
    top: usize,
    stack_of: &mut impl FnMut(&Process, SiteId) -> Vec<FrameInfo>,
    backward: &mut Lookup,
) -> Vec<Finding> {
    let mut live = Vec::new();
    for &device in p.devices.keys() {
        let sites = if segments {
            p.top_sites(device, top)
        } else {
            p.top_holders(device, top)
        };
        for (site, bytes, count) in sites {
            let api = p.site_stats.get(&(site, device)).and_then(|s| s.api);
            let api_name = api.map_or("?", |a| a.name());
            let place = if device == HOST_DEVICE {
                "in pinned host memory".to_string()
            } else {
                format!("on device {device}")
            };
            let held = held_at(p, device, site);
            let (cause, hint) = live_hint(p, a, device, site, held);
            let plural = if count == 1 { "" } else { "s" };
            let what = match held {
                Some(Held::Tensors) => format!("{count} tensor{plural}"),
                Some(Held::TorchReserve) => {
                    format!("{count} segment{plural} of PyTorch's cache ({api_name})")
                }
                Some(Held::OutsideTorch) => {
                    format!("{count} allocation{plural} ({api_name}, outside PyTorch's allocator)")
                }
                None => format!("{count} allocation{plural} ({api_name})"),
            };
            let mut f = Finding {
                pid: p.pid(),
                rank: p.launch.rank,
                bytes,
                stack: stack_of(p, site),
                held,
                message: format!(
                    "{} in {what} still live {place} when the process ended",
                    fmt_bytes(bytes),
                ),
                count,
                api,
                hint,
                site,
                cause,
                ..Finding::new(Kind::LiveAtExit, Severity::Info, device)
            };
            complete_site(&mut f, p, stack_of, backward);
            live.push(f);
        }
    }
    live
}

/// Why memory might still be live at exit, from what the trace can tell.
fn live_hint(
    p: &Process,
    a: &Analysis,
    device: i16,
    site: SiteId,
    held: Option<Held>,
) -> (Cause, String) {
    let leaking = a.is_leak(site, device);
    if held == Some(Held::TorchReserve) {
        (
            Cause::NeverFreed,
            "Segments PyTorch's caching allocator keeps for reuse until torch.cuda.empty_cache() \
             or exit: its reserve, not memory a line holds. The tensors inside them are listed \
             by the lines that made them (without --segments)."
                .into(),
        )
    } else if leaking {
        (
            Cause::LiveAndLeaking,
            "This call site is also reported as a leak: its memory grew step by step.".into(),
        )
    } else if p.end != EndState::Exited(Some(GoodbyeReason::Exit))
        && p.end != EndState::Exited(None)
    {
        (
            Cause::EndedAbnormally,
            "The process did not exit normally, so memory it would have freed may be listed."
                .into(),
        )
    } else {
        (
            Cause::NeverFreed,
            "Never freed before exit. Harmless if it was meant to live until the end (weights, \
             caches); the driver reclaims it at exit. A leak shows as growth across steps \
             instead."
                .into(),
        )
    }
}

/// What a call site's memory is on `device`, when PyTorch's tensors are traced there.
pub fn held_at(p: &Process, device: i16, site: SiteId) -> Option<Held> {
    if !p.tensors_traced(device) {
        return None;
    }
    let s = p.site_stats.get(&(site, device))?;
    Some(if s.reserve_allocations > 0 {
        Held::TorchReserve
    } else if s
        .api
        .is_some_and(|a| a.memory_class() == oomtrace_proto::MemoryClass::Tensor)
    {
        Held::Tensors
    } else {
        Held::OutsideTorch
    })
}
