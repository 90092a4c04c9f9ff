//! The event history of a trace file, for exporters (`oomtrace export`): replays the file
//! record by record, like [`Trace::load`], and shows every event and step marker to a visitor
//! together with its process *as it was just before the event applied* (so a free still finds
//! the allocation it frees in `Process::live`, an unmap its mapping) and the call site of the
//! event's stack (symbolize it with `StackSymbolizer::site`).
//!
//! Events the model leaves out as naming an implausible device (`Process::implausible_device`)
//! are not shown. Memory stays that of the replay (O(live + sites)); what the visitor keeps is
//! its business.
//! Only the model runs (no observer): exporters need the accounting, not the findings, and
//! replaying is then several times faster.

use std::path::Path;

use super::trace::Trace;
use super::{Error, Process, SiteId};
use oomtrace_proto::wire::{Frame, TorchMemory};
use oomtrace_proto::Event;

/// What a visitor is shown, in stream order per process (processes interleave as in the file).
#[derive(Clone, Copy, Debug)]
pub enum Seen<'a> {
    /// One event, not yet applied; `site` is its stack's call site (0: none).
    Event { event: &'a Event, site: SiteId },
    /// A step marker (`oomtrace_mark`), not yet applied.
    Marker {
        seq: u64,
        ts_ns: u64,
        tid: u32,
        site: SiteId,
        label: &'a str,
    },
    /// PyTorch's own statistics of one device, read by the step hook after a marker; not yet
    /// applied (see [`Process::torch_memory`] for the last of each device).
    TorchMemory(&'a TorchMemory),
}

/// Replays the trace file at `path`, showing each event and marker to `visit`; returns the
/// trace as it stands at the end (final process states, warnings, truncation).
pub fn replay(path: &Path, visit: impl FnMut(&Process, Seen<'_>)) -> Result<Trace, Error> {
    replay_with_progress(path, &mut |_, _| {}, visit)
}

/// [`replay`], telling `progress(bytes read, file size)` as it goes (see
/// [`Trace::load_with_progress`]).
pub fn replay_with_progress(
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
    mut visit: impl FnMut(&Process, Seen<'_>),
) -> Result<Trace, Error> {
    let mut apply = |p: &mut Process, _: &mut (), frame: &Frame<'_>| match frame {
        Frame::Events(batch) => {
            for ev in batch.iter() {
                // An event the model leaves out (a device no process has) is not shown
                // either: exporters key tables by device too.
                if Process::implausible_device(&ev).is_some() {
                    p.apply_event(&ev, &mut ());
                    continue;
                }
                let site = p.stack_site(ev.stack);
                visit(
                    p,
                    Seen::Event {
                        event: &ev,
                        site: if ev.stack.is_none() { SiteId(0) } else { site },
                    },
                );
                p.apply_event(&ev, &mut ());
            }
        }
        Frame::Marker {
            seq,
            ts_ns,
            tid,
            stack,
            label,
        } => {
            let site = p.stack_site(*stack);
            visit(
                p,
                Seen::Marker {
                    seq: *seq,
                    ts_ns: *ts_ns,
                    tid: *tid,
                    site,
                    label,
                },
            );
            p.apply(frame, &mut ());
        }
        Frame::TorchMemory(m) => {
            // One a process can have: the model leaves the others out, and so does this.
            if (0..oomtrace_proto::MAX_DEVICES).contains(&m.device) {
                visit(p, Seen::TorchMemory(m));
            }
            p.apply(frame, &mut ());
        }
        other => p.apply(other, &mut ()),
    };
    Trace::load_with(path, &mut apply, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oomtrace_proto::trace_file as tf;
    use oomtrace_proto::wire::{encode, Hello};
    use oomtrace_proto::{Api, EventKind, StackId};

    #[test]
    fn visitor_sees_each_event_before_it_applies() {
        let mut f = Vec::new();
        tf::write_header(&mut f, 1, "test").unwrap();
        tf::write_conn_open(&mut f, 3, 1, 1).unwrap();
        let mut frames = Vec::new();
        encode::hello(
            &mut frames,
            &Hello {
                pid: 77,
                ..Default::default()
            },
        );
        encode::stack_def(&mut frames, StackId(5), &[0x1000, 0x2000]);
        let mut a = Event::new(EventKind::Alloc, Api::cudaMalloc);
        a.ptr = 0x10;
        a.size = 4096;
        a.device = 0;
        a.stack = StackId(5);
        let mut b = Event::new(EventKind::Free, Api::cudaFree);
        b.ptr = 0x10;
        encode::events(&mut frames, &[a, b]);
        encode::marker(&mut frames, 3, 9, 1, StackId::NONE, "step");
        for device in [0, oomtrace_proto::MAX_DEVICES] {
            encode::torch_memory(
                &mut frames,
                &TorchMemory {
                    ts_ns: 10,
                    device,
                    allocated: 1024,
                    max_allocated: 4096,
                    reserved: 8192,
                },
            );
        }
        tf::write_chunk(&mut f, 3, &frames, true).unwrap();
        tf::write_end(&mut f, 3, 1).unwrap();
        let path = std::env::temp_dir().join(format!("oomt-history-{}.oomt", std::process::id()));
        std::fs::write(&path, &f).unwrap();

        let mut seen = Vec::new();
        let t = replay(&path, |p, s| match s {
            Seen::Event { event, site } => seen.push(format!(
                "{:?} site {} live {}",
                event.kind().unwrap(),
                site.0,
                p.live.get(&event.ptr).map_or(0, |l| l.size)
            )),
            Seen::Marker { label, .. } => seen.push(format!("marker {label}")),
            Seen::TorchMemory(m) => seen.push(format!(
                "torch {} reserved {} known {}",
                m.device,
                m.reserved,
                p.torch_memory.contains_key(&m.device)
            )),
        })
        .unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            seen,
            [
                "Alloc site 1 live 0",
                "Free site 0 live 4096",
                "marker step",
                // Shown before it applies; the one naming no possible device, not at all.
                "torch 0 reserved 8192 known false"
            ]
        );
        assert_eq!(t.processes[0].torch_memory[&0].reserved, 8192);
        assert_eq!(t.processes[0].devices[&0].peak_bytes, 4096);
        assert_eq!(t.processes[0].markers, 1);
    }
}
