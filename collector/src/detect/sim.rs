//! A process fed synthetic events, for the detectors' unit tests: stacks 1..=8 of one native
//! frame each, allocations at fresh addresses, step markers (as the optimizer hook makes them),
//! Python code objects and stacks. Each test module adds its own queries (a trait on [`Sim`]).

use crate::state::Process;
use oomtrace_proto::python::{CodeDef, LineTableFormat, PyFrame};
use oomtrace_proto::wire::{Frame, Hello};
use oomtrace_proto::{Api, Event, EventKind, StackId};

pub struct Sim {
    pub p: Process,
    pub ts: u64,
    next: u64,
    /// Time between two events: what a rate per second is measured against.
    tick_ns: u64,
}

impl Sim {
    pub fn new(tick_ns: u64) -> Sim {
        let mut p = Process::new(1, Hello::default());
        for s in 1..=8u32 {
            p.apply(&Frame::StackDef {
                id: StackId(s),
                frames: vec![0x1000 * u64::from(s)],
            });
        }
        Sim {
            p,
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
        self.p.apply_event(&e);
        self.next
    }

    pub fn free(&mut self, ptr: u64) {
        self.ts += self.tick_ns;
        let mut e = Event::new(EventKind::Free, Api::cudaFree);
        e.ptr = ptr;
        e.device = 0;
        e.ts_ns = self.ts;
        self.p.apply_event(&e);
    }

    /// A step marker.
    pub fn mark(&mut self) {
        self.ts += self.tick_ns;
        self.p.apply(&Frame::Marker {
            seq: 0,
            ts_ns: self.ts,
            tid: 0,
            stack: StackId(0),
            label: "step".into(),
        });
    }

    /// The process says goodbye (a normal exit).
    pub fn exit(&mut self) {
        self.p.apply(&Frame::Goodbye {
            reason: 1,
            last_seq: 0,
        });
    }

    /// Defines Python code object `id`.
    pub fn code(&mut self, id: u32, file: &str, name: &str, line: u32) {
        self.p.apply(&Frame::CodeDef(CodeDef {
            id,
            format: LineTableFormat::Lnotab as u8,
            first_line: line,
            filename: file.into(),
            name: name.into(),
            line_table: Vec::new(),
        }));
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
        self.p.apply(&Frame::StackDef {
            id: StackId(id),
            frames,
        });
    }
}
