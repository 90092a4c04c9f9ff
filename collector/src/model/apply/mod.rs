//! Applying a stream to a process: each frame (`Process::apply`), and each event
//! (`Process::apply_event`), which checks the event's device and hands it to its family:
//! `alloc.rs` (allocations, frees, failures), `vmm.rs` (physical handles, mappings, address
//! reservations), `torch.rs` (PyTorch's segments and statistics), `steps.rs` (step markers,
//! the driver's memory readings).

use oomtrace_proto::wire::{Frame, GoodbyeReason};
use oomtrace_proto::{plausible_device, Event, EventKind};

use super::{EndState, Observer, Process};

mod alloc;
mod steps;
mod torch;
mod vmm;

pub use alloc::OUT_OF_MEMORY;

impl Process {
    /// Applies one frame of this process's stream, telling `obs` what happened.
    pub fn apply<O: Observer + ?Sized>(&mut self, frame: &Frame<'_>, obs: &mut O) {
        match frame {
            Frame::Events(batch) => {
                for ev in batch.iter() {
                    self.apply_event(&ev, obs);
                }
            }
            Frame::StackDef { id, frames } => self.define_stack(*id, frames),
            Frame::ModuleDef(def) => self.define_module(def.clone()),
            Frame::CodeDef(def) => {
                self.codes.insert(def.id, def.clone());
            }
            Frame::ModuleGone { id } => {
                if let Some(&i) = self.module_index.get(id) {
                    self.modules[i].gone = true;
                    self.module_index.remove(id);
                }
            }
            Frame::Marker {
                seq, ts_ns, label, ..
            } => {
                self.last_marker = Some(label.clone());
                self.marker_frames += 1;
                self.touch(*seq, *ts_ns);
                self.on_marker(*ts_ns, obs);
            }
            Frame::Lost(l) => self.lost = l.clone(),
            Frame::Goodbye { reason, last_seq } => {
                self.end = EndState::Exited(GoodbyeReason::from_u8(*reason));
                self.last_seq = self.last_seq.max(*last_seq);
            }
            Frame::Launch(vars) => self.learn_launch(vars),
            Frame::Made { events, ending } => self.learn_made(*events, *ending),
            Frame::TorchMemory(m) => self.on_torch_memory(m, obs),
            Frame::FrameName {
                addr,
                module,
                function,
            } => {
                self.named_frames
                    .insert(*addr, (module.clone(), function.clone()));
            }
            Frame::Hello(_) | Frame::Unknown { .. } => {}
        }
    }

    /// The device `ev` names when that device is implausible (see
    /// `oomtrace_proto::MAX_DEVICES`): such an event is counted, never accounted. Only the
    /// kinds whose device the model reads are checked (a free finds its allocation's).
    pub fn implausible_device(ev: &Event) -> Option<i16> {
        let device = match ev.kind()? {
            EventKind::Alloc | EventKind::AllocFailed => {
                Self::device_for_class(ev.api(), ev.device)
            }
            EventKind::PhysCreate
            | EventKind::Segment
            | EventKind::SegmentFree
            | EventKind::VaReserve
            | EventKind::MemInfo => ev.device,
            _ => return None,
        };
        (!plausible_device(device)).then_some(device)
    }

    /// The warning for a process whose events named devices it cannot have, if any did.
    pub fn implausible_device_warning(&self) -> Option<String> {
        (self.implausible_device_events > 0).then(|| {
            format!(
                "process {}: {} events name a device no process has (the first: device {}; \
                 ordinals run from 0 to {}): left out of the accounting",
                self.pid(),
                self.implausible_device_events,
                self.implausible_device_first,
                oomtrace_proto::MAX_DEVICES - 1
            )
        })
    }

    /// Applies one event, telling `obs` what happened.
    pub fn apply_event<O: Observer + ?Sized>(&mut self, ev: &Event, obs: &mut O) {
        self.events += 1;
        self.touch(ev.seq, ev.ts_ns);
        let Some(kind) = ev.kind() else { return };
        if let Some(device) = Self::implausible_device(ev) {
            if self.implausible_device_events == 0 {
                self.implausible_device_first = device;
            }
            self.implausible_device_events += 1;
            return;
        }
        let api = ev.api();
        match kind {
            EventKind::Alloc => self.on_alloc(ev, api, obs),
            EventKind::Free => self.on_free(ev, api, obs),
            EventKind::FreeFailed => self.failed_frees += 1,
            EventKind::Segment | EventKind::SegmentFree => self.on_segment(ev, kind, obs),
            EventKind::AllocFailed => self.on_alloc_failed(ev, api, obs),
            EventKind::PhysCreate => self.on_phys_create(ev, api, obs),
            EventKind::PhysRetain => self.on_phys_retain(ev),
            EventKind::PhysRelease => self.on_phys_release(ev, obs),
            EventKind::Map => self.on_map(ev),
            EventKind::Unmap => self.on_unmap(ev, obs),
            EventKind::VaReserve => self.on_va_reserve(ev),
            EventKind::VaFree => self.on_va_free(ev),
            EventKind::MemInfo => self.on_mem_info(ev, obs),
            EventKind::Marker => self.on_marker(ev.ts_ns, obs),
            EventKind::Init => self.cuda_initialized |= ev.result == 0,
        }
    }
}
