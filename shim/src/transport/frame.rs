//! Frame encoding: the drain thread's messages into wire frames (`proto/src/wire.rs`) in one
//! buffer, events numbered in queue order and encoded where they lie, their timestamps never
//! going back. Knows nothing of where the bytes go (`delivery.rs`).

use oomtrace_proto::wire::{encode, GoodbyeReason, Lost};
use oomtrace_proto::{Event, StackId};

use super::msg::Msg;
use crate::clock::Calibration;

/// Events per Events frame, at most.
const EVENTS_PER_FRAME: u32 = 8192;

/// The encoded stream not yet written, and the numbering and clock of what is in it.
pub(super) struct Frames {
    /// Encoded frames not yet written.
    pub(super) out: Vec<u8>,
    /// Events in `out`, to count them if `out` is dropped.
    pub(super) out_events: u64,
    /// Offset of the open Events frame in `out`.
    events_at: Option<usize>,
    events_in_frame: u32,
    seq: u64,
    pub(super) cal: Calibration,
    /// Timestamps go out non-decreasing in queue order (the order events happened in):
    /// refining the tick rate must not make a later event look earlier.
    last_ts: u64,
    last_lost: Lost,
}

impl Frames {
    pub(super) fn new(capacity: usize, cal: Calibration) -> Frames {
        Frames {
            out: Vec::with_capacity(capacity),
            out_events: 0,
            events_at: None,
            events_in_frame: 0,
            seq: 0,
            cal,
            last_ts: 0,
            last_lost: Lost::default(),
        }
    }

    pub(super) fn close_events(&mut self) {
        if let Some(at) = self.events_at.take() {
            encode::end_events(&mut self.out, at);
            self.events_in_frame = 0;
        }
    }

    /// One event into the open Events frame of `out` (the hot path: nearly every message).
    #[inline]
    pub(super) fn push_event(&mut self, ev: &Event) {
        if self.events_at.is_none() {
            self.events_at = Some(encode::begin_events(&mut self.out));
        }
        self.seq += 1;
        let mut ev = *ev;
        ev.seq = self.seq;
        ev.ts_ns = self.monotonic(ev.ts_ns);
        encode::push_event(&mut self.out, &ev);
        self.out_events += 1;
        self.events_in_frame += 1;
        if self.events_in_frame >= EVENTS_PER_FRAME {
            self.close_events();
        }
    }

    /// Any message but a flush or the shutdown (which are no frames).
    pub(super) fn push(&mut self, msg: Msg) {
        match msg {
            Msg::Event(ev) => self.push_event(&ev),
            Msg::Stack { id, frames } => {
                self.close_events();
                encode::stack_def(&mut self.out, StackId(id), &frames);
            }
            Msg::Module(def) => {
                self.close_events();
                encode::module_def(&mut self.out, &def);
            }
            Msg::ModuleGone(id) => {
                self.close_events();
                encode::module_gone(&mut self.out, id);
            }
            Msg::Code(def) => {
                self.close_events();
                encode::code_def(&mut self.out, &def);
            }
            Msg::Marker { ev, label } => {
                self.close_events();
                self.seq += 1;
                let ts = self.monotonic(ev.ts_ns);
                encode::marker(&mut self.out, self.seq, ts, ev.tid, ev.stack, &label);
                self.out_events += 1;
            }
            Msg::Launch(vars) => {
                self.close_events();
                encode::launch(&mut self.out, &vars);
            }
            Msg::TorchMemory(mut m) => {
                self.close_events();
                m.ts_ns = self.monotonic(m.ts_ns);
                encode::torch_memory(&mut self.out, &m);
            }
            Msg::Flush(_) | Msg::Shutdown(..) => {}
        }
    }

    fn monotonic(&mut self, ticks: u64) -> u64 {
        self.last_ts = self.last_ts.max(self.cal.to_ns(ticks));
        self.last_ts
    }

    /// The loss counters, when they changed since the last ones sent.
    pub(super) fn lost_if_changed(&mut self, lost: Lost) {
        if lost != self.last_lost {
            self.close_events();
            encode::lost(&mut self.out, &lost);
            self.last_lost = lost;
        }
    }

    /// The stream's end: what this process made (`made` events), then the goodbye.
    pub(super) fn end(&mut self, made: u64, reason: GoodbyeReason) {
        self.close_events();
        encode::made(&mut self.out, made, reason as u8);
        encode::goodbye(&mut self.out, reason, self.seq);
    }

    /// `out` was written.
    pub(super) fn written(&mut self) {
        self.out.clear();
        self.out_events = 0;
    }

    /// `out` is dropped unwritten (its events are counted lost by the caller).
    pub(super) fn clear(&mut self) {
        self.out.clear();
        self.out_events = 0;
        self.events_at = None;
        self.events_in_frame = 0;
    }
}
