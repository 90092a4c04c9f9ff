//! CUDA's virtual memory management: physical handles live while referenced or mapped
//! (PyTorch and NCCL release while mapped), mappings by address, reserved address space.

use oomtrace_proto::{Api, Event};

use crate::model::process::{Mapping, PhysHandle};
use crate::model::{Observer, Process};

impl Process {
    /// Physical memory made (`cuMemCreate`): live, with one reference.
    #[inline]
    pub(super) fn on_phys_create<O: Observer + ?Sized>(
        &mut self,
        ev: &Event,
        api: Api,
        obs: &mut O,
    ) {
        let site = self.site_of(ev.stack);
        self.device(ev.device).events += 1;
        if let Some(old) = self.handles.remove(&ev.ptr) {
            let gone = (
                old.device,
                old.site,
                old.size,
                api,
                old.birth,
                ev.ts_ns,
                old.reserve,
            );
            self.remove_live(obs, ev.ptr, gone, old.ts_ns, false);
        }
        let birth = self.add_live(
            obs,
            ev.ptr,
            (ev.device, site, ev.size, ev.ts_ns, api, ev.tid),
            false,
        );
        self.handles.insert(
            ev.ptr,
            PhysHandle {
                size: ev.size,
                device: ev.device,
                site,
                birth,
                ts_ns: ev.ts_ns,
                refs: 1,
                mappings: 0,
                reserve: false,
            },
        );
    }

    /// One more reference to a handle.
    #[inline]
    pub(super) fn on_phys_retain(&mut self, ev: &Event) {
        match self.handles.get_mut(&ev.ptr) {
            Some(h) => h.refs += 1,
            None => self.unmatched_frees += 1,
        }
    }

    /// One reference fewer; the memory goes once nothing holds it.
    #[inline]
    pub(super) fn on_phys_release<O: Observer + ?Sized>(&mut self, ev: &Event, obs: &mut O) {
        match self.handles.get_mut(&ev.ptr) {
            Some(h) => {
                h.refs = h.refs.saturating_sub(1);
                let d = h.device;
                self.device(d).events += 1;
            }
            None => self.unmatched_frees += 1,
        }
        self.maybe_release_handle(ev.ptr, ev.ts_ns, obs);
    }

    /// A handle mapped at a virtual address.
    #[inline]
    pub(super) fn on_map(&mut self, ev: &Event) {
        if let Some(h) = self.handles.get_mut(&ev.aux) {
            h.mappings += 1;
            let d = h.device;
            let dev = self.device(d);
            dev.events += 1;
            dev.mapped_bytes = dev.mapped_bytes.saturating_add(ev.size);
        }
        self.mappings.insert(
            ev.ptr,
            Mapping {
                size: ev.size,
                handle: ev.aux,
                offset: ev.extra,
            },
        );
    }

    /// Every mapping in a range unmapped; their handles go once nothing holds them.
    #[inline]
    pub(super) fn on_unmap<O: Observer + ?Sized>(&mut self, ev: &Event, obs: &mut O) {
        let end = ev.ptr.saturating_add(ev.size.max(1));
        let gone: Vec<u64> = self
            .mappings
            .range(ev.ptr..end)
            .map(|(&va, _)| va)
            .collect();
        for va in gone {
            if let Some(m) = self.mappings.remove(&va) {
                if let Some(h) = self.handles.get_mut(&m.handle) {
                    h.mappings = h.mappings.saturating_sub(1);
                    let d = h.device;
                    let dev = self.device(d);
                    dev.events += 1;
                    dev.mapped_bytes = dev.mapped_bytes.saturating_sub(m.size);
                }
                self.maybe_release_handle(m.handle, ev.ts_ns, obs);
            }
        }
    }

    /// Address space reserved (not memory).
    #[inline]
    pub(super) fn on_va_reserve(&mut self, ev: &Event) {
        self.reservations.insert(ev.ptr, (ev.size, ev.device));
        let dev = self.device(ev.device);
        dev.reserved_va_bytes = dev.reserved_va_bytes.saturating_add(ev.size);
    }

    /// Reserved address space given back.
    #[inline]
    pub(super) fn on_va_free(&mut self, ev: &Event) {
        if let Some((size, d)) = self.reservations.remove(&ev.ptr) {
            let dev = self.device(d);
            dev.reserved_va_bytes = dev.reserved_va_bytes.saturating_sub(size);
        }
    }

    /// Frees a VMM handle's physical memory once nothing holds it.
    fn maybe_release_handle<O: Observer + ?Sized>(&mut self, handle: u64, ts: u64, obs: &mut O) {
        let done = matches!(self.handles.get(&handle), Some(h) if h.refs == 0 && h.mappings == 0);
        if done {
            if let Some(h) = self.handles.remove(&handle) {
                let gone = (
                    h.device,
                    h.site,
                    h.size,
                    Api::cuMemCreate,
                    h.birth,
                    ts,
                    h.reserve,
                );
                self.remove_live(obs, handle, gone, h.ts_ns, false);
            }
        }
    }
}
