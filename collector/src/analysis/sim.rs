//! A process fed synthetic events, for the detectors' unit tests: stacks 1..=8 of one native
//! frame each, allocations at fresh addresses, step markers (as the optimizer hook makes them),
//! Python code objects and stacks. Each test module adds its own queries (a trait on [`Sim`]).

use super::Analysis;
use crate::model::Process;
use oomtrace_proto::python::{CodeDef, LineTableFormat, PyFrame};
use oomtrace_proto::wire::{Frame, Hello};
use oomtrace_proto::{Api, Event, EventKind, StackId};

pub struct Sim {
    pub p: Process,
    /// The process's analysis, fed as the live collector feeds it.
    pub a: Analysis,
    pub ts: u64,
    next: u64,
    /// Time between two events: what a rate per second is measured against.
    tick_ns: u64,
}

impl Sim {
    pub fn new(tick_ns: u64) -> Sim {
        let mut p = Process::new(1, Hello::default());
        let mut a = Analysis::default();
        for s in 1..=8u32 {
            let def = Frame::StackDef {
                id: StackId(s),
                frames: vec![0x1000 * u64::from(s)],
            };
            p.apply(&def, &mut a);
        }
        Sim {
            p,
            a,
            ts: 1,
            next: 0x1_0000_0000,
            tick_ns,
        }
    }

    /// Allocates `size` bytes at stack `stack`; returns the address (4 GiB apart, never reused).
    pub fn alloc(&mut self, stack: u32, size: u64) -> u64 {
        self.ts += self.tick_ns;
        self.next += 1 << 32;
        let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
        e.ptr = self.next;
        e.size = size;
        e.device = 0;
        e.stack = StackId(stack);
        e.ts_ns = self.ts;
        self.p.apply_event(&e, &mut self.a);
        self.next
    }

    /// An allocation through `api` at `ptr` (a PyTorch tensor with `oomtrace_torch_alloc`).
    pub fn alloc_at(&mut self, api: Api, stack: u32, ptr: u64, size: u64) {
        self.ts += self.tick_ns;
        let mut e = Event::new(EventKind::Alloc, api);
        e.ptr = ptr;
        e.size = size;
        e.device = 0;
        e.stack = StackId(stack);
        e.ts_ns = self.ts;
        self.p.apply_event(&e, &mut self.a);
    }

    /// A free through `api` of `ptr`.
    pub fn free_at(&mut self, api: Api, ptr: u64) {
        self.ts += self.tick_ns;
        let mut e = Event::new(EventKind::Free, api);
        e.ptr = ptr;
        e.device = 0;
        e.ts_ns = self.ts;
        self.p.apply_event(&e, &mut self.a);
    }

    /// PyTorch's allocator says the allocation at `ptr` is one of its segments.
    pub fn segment(&mut self, ptr: u64, size: u64) {
        self.ts += self.tick_ns;
        let mut e = Event::new(EventKind::Segment, Api::oomtrace_torch_segment);
        e.ptr = ptr;
        e.size = size;
        e.device = 0;
        e.ts_ns = self.ts;
        self.p.apply_event(&e, &mut self.a);
    }

    pub fn free(&mut self, ptr: u64) {
        self.ts += self.tick_ns;
        let mut e = Event::new(EventKind::Free, Api::cudaFree);
        e.ptr = ptr;
        e.device = 0;
        e.ts_ns = self.ts;
        self.p.apply_event(&e, &mut self.a);
    }

    /// A step marker.
    pub fn mark(&mut self) {
        self.ts += self.tick_ns;
        self.p.apply(
            &Frame::Marker {
                seq: 0,
                ts_ns: self.ts,
                tid: 0,
                stack: StackId(0),
                label: "step".into(),
            },
            &mut self.a,
        );
    }

    /// The process says goodbye (a normal exit).
    pub fn exit(&mut self) {
        self.p.apply(
            &Frame::Goodbye {
                reason: 1,
                last_seq: 0,
            },
            &mut self.a,
        );
    }

    /// Defines Python code object `id`.
    pub fn code(&mut self, id: u32, file: &str, name: &str, line: u32) {
        self.p.apply(
            &Frame::CodeDef(CodeDef {
                id,
                format: LineTableFormat::Lnotab as u8,
                first_line: line,
                filename: file.into(),
                name: name.into(),
                line_table: Vec::new(),
            }),
            &mut self.a,
        );
    }

    /// A stack of one native frame, then Python frames of these codes, innermost first.
    pub fn stack(&mut self, id: u32, native: u64, codes: &[u32]) {
        let mut frames = vec![native];
        frames.extend(codes.iter().enumerate().map(|(i, &code)| {
            PyFrame {
                code,
                offset: 0,
                group_end: i + 1 == codes.len(),
            }
            .encode()
        }));
        self.p.apply(
            &Frame::StackDef {
                id: StackId(id),
                frames,
            },
            &mut self.a,
        );
    }
}

/// The situation of the device-growth issue: PyTorch's cache grows by one 4 MiB segment a step
/// for a tensor kept in a list, and the call that reserves it is whichever finds the cache
/// exhausted: each step another native stack (no site grows on its own), under one of two
/// Python lines or on the autograd thread without Python frames. Stack 1 allocates and frees
/// 8 MiB each step; stack 2 holds 64 MiB of weights.
pub fn cache_growth(steps: u32) -> Sim {
    const MIB: u64 = 1 << 20;
    let mut sim = Sim::new(1_000_000);
    sim.code(
        1,
        "/venv/lib/python3.12/site-packages/torch/_tensor.py",
        "empty",
        7,
    );
    sim.code(2, "/home/u/train.py", "forward", 42);
    sim.code(3, "/home/u/train.py", "<module>", 60);
    sim.code(4, "/home/u/train.py", "backward", 50);
    sim.code(5, "/usr/lib/python3.12/contextlib.py", "__exit__", 141);
    sim.alloc(2, 64 * MIB); // weights
    for i in 0..steps {
        let t = sim.alloc(1, 8 * MIB);
        sim.free(t);
        let stack = 100 + i;
        let native = 0x10_0000 + u64::from(i) * 0x100;
        match i % 4 {
            // forward's line: through the library, or through the stdlib too.
            0 => sim.stack(stack, native, &[1, 2, 3]),
            1 => sim.stack(stack, native, &[1, 5, 2, 3]),
            2 => sim.stack(stack, native, &[1, 4, 3]),
            _ => sim.stack(stack, native, &[]),
        }
        sim.alloc(stack, 4 * MIB);
        sim.mark();
    }
    sim
}
