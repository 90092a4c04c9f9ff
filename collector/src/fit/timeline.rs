//! A trace's PyTorch tensors as `fit` replays them: per process and device, every tensor
//! request, free and out-of-memory in order, each tensor with what it was made as and its role
//! (the anatomy's rule, docs/anatomy.md), and what the device held outside PyTorch's caching
//! allocator at each request (the room the allocator had).
//!
//! Built in one pass over the file by [`Recorder`], the model's observer, which runs the
//! anatomy itself: a tensor's role is known at its free (or, alive at the end, as the report
//! settles it). O(tensor events) memory: about 40 bytes a tensor and 16 an event, kept because
//! every lever replays the whole sequence, many times.

use oomtrace_proto::wire::Frame;
use oomtrace_proto::{Api, EventKind, MemoryClass};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::analysis::anatomy::{Anatomy, Made, Role};
use crate::model::{Alloc, DeviceMap, Free, MemInfo, Observer, OutOfMemory, Process, SiteId};

/// One tensor of the trace.
#[derive(Clone, Copy, Debug)]
pub struct Tensor {
    /// Bytes requested (PyTorch rounds them itself; so does the model).
    pub size: u64,
    pub stream: u64,
    pub site: SiteId,
    pub made: Made,
    pub role: Role,
}

/// One step of a device's sequence. `t` indexes [`DeviceTimeline::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A tensor requested; `outside`: the device's bytes outside PyTorch's reserve then (the
    /// process's other CUDA allocations, and what the driver last said others held).
    Alloc {
        t: u32,
        outside: u64,
    },
    Free {
        t: u32,
    },
    /// PyTorch raised OutOfMemoryError for `size` bytes (rounded); `made`: what that tensor
    /// would have been made as.
    Oom {
        size: u64,
        stream: u64,
        outside: u64,
        made: Made,
    },
    /// A step marker.
    Step,
}

/// One device of one process.
#[derive(Clone, Debug, Default)]
pub struct DeviceTimeline {
    pub ops: Vec<Op>,
    pub tensors: Vec<Tensor>,
    /// The device's total memory as the driver last reported it.
    pub total: Option<u64>,
    /// The largest reserve PyTorch really held (its segment events).
    pub recorded_peak_reserved: u64,
    /// The memory cap the program set itself, as its out-of-memory observer said.
    pub program_cap: Option<u64>,
}

impl DeviceTimeline {
    /// The tensors alive at the largest total of tensors (its first moment), and that total.
    pub fn alive_at_tensor_peak(&self) -> (FxHashSet<u32>, u64) {
        self.alive_at_peak_of(|_| true)
    }

    /// The tensors alive when those `counted` add up to the most (its first moment), and that
    /// most.
    pub fn alive_at_peak_of(&self, counted: impl Fn(&Tensor) -> bool) -> (FxHashSet<u32>, u64) {
        let mut live = 0u64;
        let mut peak = (0u64, None);
        for (i, op) in self.ops.iter().enumerate() {
            match *op {
                Op::Alloc { t, .. } if counted(&self.tensors[t as usize]) => {
                    live = live.saturating_add(self.tensors[t as usize].size);
                    if live > peak.0 {
                        peak = (live, Some(i));
                    }
                }
                Op::Free { t } if counted(&self.tensors[t as usize]) => {
                    live = live.saturating_sub(self.tensors[t as usize].size)
                }
                _ => {}
            }
        }
        let mut alive = FxHashSet::default();
        let Some(at) = peak.1 else {
            return (alive, 0);
        };
        for op in &self.ops[..=at] {
            match *op {
                Op::Alloc { t, .. } => {
                    alive.insert(t);
                }
                Op::Free { t } => {
                    alive.remove(&t);
                }
                _ => {}
            }
        }
        (alive, peak.0)
    }
}

/// The observer that builds a process's timelines (see the module doc).
#[derive(Debug, Default)]
pub struct Recorder {
    anatomy: Anatomy,
    /// The event being applied: its `aux` (a tensor's stream) and kind.
    aux: u64,
    pub devices: DeviceMap<DeviceTimeline>,
    /// Live tensors: (device, address) -> tensor index.
    live: FxHashMap<(i16, u64), u32>,
    /// Per device, bytes in use that nobody in the process allocated (the context, other
    /// processes), from the last `MemInfo`.
    unseen: FxHashMap<i16, u64>,
    /// Step markers seen.
    pub steps: u64,
}

impl Recorder {
    /// The device's bytes outside PyTorch's reserve now.
    fn outside(&self, p: &Process, device: i16) -> u64 {
        let d = p.devices.get(&device);
        let live = d.map_or(0, |d| d.live_bytes);
        let torch = d.and_then(|d| d.torch_reserved_bytes).unwrap_or(0);
        live.saturating_sub(torch)
            .saturating_add(self.unseen.get(&device).copied().unwrap_or(0))
    }

    /// Settles the tensors still alive at the end (as the report does), and the forward
    /// pass's tensors that an out-of-memory's exception freed: what the step would have kept
    /// for its backward pass, had it gone on, is an activation.
    pub fn finish(&mut self) {
        for d in self.devices.values_mut() {
            let mut made_at: Vec<usize> = vec![usize::MAX; d.tensors.len()];
            let mut last_oom: Option<usize> = None;
            for (i, op) in d.ops.iter().enumerate() {
                match *op {
                    Op::Alloc { t, .. } => made_at[t as usize] = i,
                    Op::Oom { .. } => last_oom = Some(i),
                    Op::Free { t } => {
                        let tensor = &mut d.tensors[t as usize];
                        if tensor.made == Made::Forward
                            && tensor.role == Role::Temporary
                            && last_oom.is_some_and(|o| o > made_at[t as usize])
                        {
                            tensor.role = Role::Activation;
                        }
                    }
                    Op::Step => last_oom = None,
                }
            }
        }
        for (&(device, ptr), &t) in &self.live {
            let Some(d) = self.devices.get_mut(&device) else {
                continue;
            };
            if let Some((made, role)) = self.anatomy.alive(device, ptr) {
                let tensor = &mut d.tensors[t as usize];
                tensor.made = made;
                tensor.role = role;
            }
        }
    }
}

impl Observer for Recorder {
    fn alloc(&mut self, p: &Process, a: &Alloc) -> u32 {
        self.anatomy.on_alloc(p, a);
        if a.api.memory_class() == MemoryClass::Tensor {
            let outside = self.outside(p, a.device);
            let d = self.devices.entry(a.device).or_default();
            let t = d.tensors.len() as u32;
            d.tensors.push(Tensor {
                size: a.size,
                stream: self.aux,
                site: a.site,
                made: Made::Unknown,
                role: Role::Other,
            });
            d.ops.push(Op::Alloc { t, outside });
            self.live.insert((a.device, a.ptr), t);
        }
        0
    }

    fn free(&mut self, p: &Process, f: &Free) {
        let decided = self.anatomy.on_free(p, f);
        if f.api.memory_class() != MemoryClass::Tensor {
            return;
        }
        let Some(t) = self.live.remove(&(f.device, f.ptr)) else {
            return;
        };
        let d = self.devices.entry(f.device).or_default();
        if let Some((made, role)) = decided {
            let tensor = &mut d.tensors[t as usize];
            tensor.made = made;
            tensor.role = role;
        }
        d.ops.push(Op::Free { t });
    }

    fn step(&mut self, _p: &Process, ts_ns: u64) {
        self.anatomy.on_step(ts_ns);
        self.steps += 1;
        for d in self.devices.values_mut() {
            d.ops.push(Op::Step);
        }
    }

    fn out_of_memory(&mut self, p: &Process, o: &OutOfMemory) {
        self.anatomy.on_out_of_memory(p, o);
        if o.api != Api::oomtrace_torch_alloc {
            return;
        }
        let made = self.anatomy.would_make(p, o.site);
        let outside = self.outside(p, o.device);
        let stream = self.aux;
        let d = self.devices.entry(o.device).or_default();
        if let Some(allowed) = o.allowed_bytes {
            if d.total.is_some_and(|t| allowed < t) {
                d.program_cap = Some(d.program_cap.map_or(allowed, |c| c.min(allowed)));
            }
        }
        d.ops.push(Op::Oom {
            size: o.size,
            stream,
            outside,
            made,
        });
    }

    fn mem_info(&mut self, p: &Process, m: &MemInfo) {
        let live = p.devices.get(&m.device).map_or(0, |d| d.live_bytes);
        self.unseen.insert(
            m.device,
            m.total.saturating_sub(m.free).saturating_sub(live),
        );
        if m.total != 0 {
            self.devices.entry(m.device).or_default().total = Some(m.total);
        }
    }

    fn apply_frame(&mut self, p: &mut Process, frame: &Frame<'_>) {
        let Frame::Events(batch) = frame else {
            p.apply(frame, self);
            return;
        };
        for ev in batch.iter() {
            self.aux = ev.aux;
            p.apply_event(&ev, self);
            if ev.kind() == Some(EventKind::Segment) && ev.api() == Api::oomtrace_torch_segment {
                if let Some(r) = p
                    .devices
                    .get(&ev.device)
                    .and_then(|d| d.torch_reserved_bytes)
                {
                    let d = self.devices.entry(ev.device).or_default();
                    d.recorded_peak_reserved = d.recorded_peak_reserved.max(r);
                }
            }
        }
    }
}
