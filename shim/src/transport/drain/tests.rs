//! The drain loop against an in-memory sink and a fake clock: no collector, no socket,
//! no sleeping.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::OnceLock;

use std::path::Path;

use oomtrace_proto::wire;
use oomtrace_proto::{Api, EventKind};

use super::*;
use crate::transport::delivery::{Conn, HUNG_WAIT, STALL_WAIT};

static BASE: OnceLock<Instant> = OnceLock::new();
thread_local! {
    static ELAPSED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

fn fake_now() -> Instant {
    *BASE.get_or_init(Instant::now) + ELAPSED.with(Cell::get)
}

fn advance(d: Duration) {
    ELAPSED.with(|e| e.set(e.get() + d));
}

/// A reader that takes at most `room` more bytes, and may be "stopped".
struct MemSink {
    got: Rc<RefCell<Vec<u8>>>,
    room: Rc<Cell<usize>>,
    stopped: bool,
}

impl Sink for MemSink {
    fn connect(_: &Path) -> std::io::Result<MemSink> {
        Err(std::io::ErrorKind::NotFound.into())
    }
    fn start(&mut self, head: &[u8], _page: Option<i32>) -> std::io::Result<()> {
        self.got.borrow_mut().extend_from_slice(head);
        Ok(())
    }
    fn send(
        &mut self,
        buf: &[u8],
        _now_only: bool,
        taken: &mut dyn FnMut(usize),
    ) -> std::io::Result<usize> {
        let n = buf.len().min(self.room.get());
        if n > 0 {
            self.room.set(self.room.get() - n);
            self.got.borrow_mut().extend_from_slice(&buf[..n]);
            taken(n);
        }
        Ok(n)
    }
    fn reader_stopped(&mut self, _now: Instant) -> bool {
        self.stopped
    }
    fn close(self) -> String {
        String::new()
    }
}

struct Rig {
    d: Drainer<MemSink>,
    rx: Receiver,
    ob: &'static Outbox,
    got: Rc<RefCell<Vec<u8>>>,
    room: Rc<Cell<usize>>,
}

/// A drainer connected to a `MemSink` that takes nothing yet, with a 4 KiB cap.
fn rig(stopped: bool) -> Rig {
    let (ob, rx) = Outbox::create(1 << 16, std::process::id());
    let mut config = Config::from_env();
    config.socket = Some("/nonexistent/oomtrace-test.sock".into());
    let setup = DrainSetup {
        config,
        own_collector: None,
        clock_origin: Calibration::new(),
    };
    let mut d = Drainer::<MemSink>::new(ob, setup, fake_now);
    let got = Rc::new(RefCell::new(Vec::new()));
    let room = Rc::new(Cell::new(0));
    d.delivery.sink = Conn::Stream(MemSink {
        got: got.clone(),
        room: room.clone(),
        stopped,
    });
    d.delivery.stalled_limit = 4096;
    Rig {
        d,
        rx,
        ob,
        got,
        room,
    }
}

impl Rig {
    fn round(&mut self) -> Round {
        self.d.round(&mut self.rx)
    }
}

fn alloc(device: i16) -> Event {
    let mut ev = Event::new(EventKind::Alloc, Api::cuMemAlloc_v2);
    ev.device = device;
    ev.size = 4096;
    ev
}

fn free(device: i16) -> Event {
    let mut ev = Event::new(EventKind::Free, Api::cuMemFree_v2);
    ev.device = device;
    ev
}

fn stalled(ob: &Outbox) -> bool {
    ob.shared.stalled.load(Ordering::SeqCst)
}

#[test]
fn a_stopped_collector_costs_events_only_after_the_stall_time() {
    let mut r = rig(true);
    for _ in 0..1000 {
        r.ob.send_event(alloc(0));
    }
    // At the cap the drain thread holds back: the rest waits in the queue, nothing lost.
    assert_eq!(r.round(), Round::Busy);
    assert!(!r.ob.ring.is_empty());
    advance(STALL_WAIT / 2);
    r.round();
    assert_eq!(r.ob.total_lost(), 0);
    assert!(!stalled(r.ob));
    // Nothing taken for the stall time: stalled; from the next round on, events that do
    // not fit are counted lost (each one), instead of waiting.
    advance(STALL_WAIT);
    r.round();
    assert!(stalled(r.ob));
    assert_eq!(r.ob.total_lost(), 0);
    let queued = r.ob.ring.len() as u64;
    r.round();
    assert!(r.ob.ring.is_empty());
    assert_eq!(r.ob.total_lost(), queued);
    // The collector reads again: the stall ends, hooks wait again.
    r.room.set(usize::MAX);
    r.round();
    assert!(!stalled(r.ob));
    assert!(!r.got.borrow().is_empty());
}

#[test]
fn a_running_collector_that_reads_nothing_is_stalled_only_after_the_hung_time() {
    let mut r = rig(false);
    for _ in 0..200 {
        r.ob.send_event(alloc(1));
    }
    r.round();
    advance(STALL_WAIT * 4);
    r.round();
    assert!(
        !stalled(r.ob),
        "a busy collector is not stalled after STALL_WAIT"
    );
    advance(HUNG_WAIT);
    r.round();
    assert!(stalled(r.ob));
    r.round();
    assert!(r.ob.total_lost() > 0);
}

#[test]
fn losses_are_counted_by_kind_and_device() {
    let mut r = rig(false);
    r.d.delivery.sink = Conn::Detached;
    r.ob.send_event(alloc(0));
    r.ob.send_event(free(3));
    r.ob.send_event(free(3));
    r.ob.send_event(alloc(40)); // beyond the per-device slots: "other"
    r.round();
    let lost = r.ob.shared.snapshot();
    assert_eq!(lost.events, 4);
    assert_eq!(lost.frees, 2);
    assert_eq!(lost.stacks, 0);
    assert_eq!(lost.by_device, vec![(0, 1), (3, 2), (-1, 1)]);
    r.ob.count_lost_stack();
    assert_eq!(r.ob.shared.snapshot().stacks, 1);
    assert_eq!(r.ob.total_lost(), 4);
}

#[test]
fn a_flush_is_done_when_the_sink_took_everything_before_it() {
    let mut r = rig(false);
    for _ in 0..10 {
        r.ob.send_event(alloc(0));
    }
    let done = Done::new();
    assert!(r.ob.ring.push(Msg::Flush(done.clone())).is_ok());
    r.round();
    assert!(!done.wait(Duration::ZERO), "nothing was taken yet");
    // The sink takes part of it: still not done.
    r.room.set(100);
    r.round();
    assert!(!done.wait(Duration::ZERO));
    r.room.set(usize::MAX);
    r.round();
    assert!(done.wait(Duration::ZERO));
    assert!(r.got.borrow().len() >= 10 * oomtrace_proto::EVENT_SIZE);
    assert_eq!(r.ob.total_lost(), 0);
}

#[test]
fn a_flush_without_a_stream_is_answered_at_once() {
    let mut r = rig(false);
    r.d.delivery.sink = Conn::Detached;
    let done = Done::new();
    assert!(r.ob.ring.push(Msg::Flush(done.clone())).is_ok());
    r.round();
    assert!(done.wait(Duration::ZERO));
}

#[test]
fn shutdown_writes_everything_queued_before_it_then_ends() {
    let mut r = rig(false);
    r.room.set(usize::MAX);
    for _ in 0..5 {
        r.ob.send_event(free(0));
    }
    let done = Done::new();
    assert!(r
        .ob
        .ring
        .push(Msg::Shutdown(GoodbyeReason::Exit, done.clone()))
        .is_ok());
    assert_eq!(r.round(), Round::Finished);
    assert!(done.wait(Duration::ZERO));
    assert!(r.got.borrow().len() >= 5 * oomtrace_proto::EVENT_SIZE);
    assert_eq!(r.ob.total_lost(), 0);
    // Just before the goodbye: what the process made, and that it is exiting.
    let got = r.got.borrow();
    let frames: Vec<_> = wire::frames(&got).collect::<Result<_, _>>().unwrap();
    assert!(
        matches!(
            frames[frames.len() - 2..],
            [
                wire::Frame::Made {
                    events: 5,
                    ending: 1
                },
                wire::Frame::Goodbye { .. }
            ]
        ),
        "{frames:?}"
    );
}

#[test]
fn a_torch_reading_follows_its_marker_on_the_events_clock_and_is_no_event() {
    let mut r = rig(false);
    r.room.set(usize::MAX);
    let mut mark = Event::new(EventKind::Marker, Api::oomtrace_mark);
    mark.ts_ns = crate::clock::ticks();
    r.ob.send_marker(mark, "step");
    let reading = wire::TorchMemory {
        ts_ns: crate::clock::ticks(),
        device: 2,
        allocated: 10 << 20,
        max_allocated: 30 << 20,
        reserved: 64 << 20,
    };
    assert!(r.ob.send_reliable(Msg::TorchMemory(reading)));
    let done = Done::new();
    assert!(r
        .ob
        .ring
        .push(Msg::Shutdown(GoodbyeReason::Exit, done.clone()))
        .is_ok());
    assert_eq!(r.round(), Round::Finished);
    let got = r.got.borrow();
    let frames: Vec<_> = wire::frames(&got).collect::<Result<_, _>>().unwrap();
    let at = frames
        .iter()
        .position(|f| matches!(f, wire::Frame::Marker { .. }))
        .expect("the marker");
    let (wire::Frame::Marker { ts_ns: mark_ts, .. }, wire::Frame::TorchMemory(m)) =
        (&frames[at], &frames[at + 1])
    else {
        panic!("the reading does not follow its marker: {frames:?}");
    };
    assert_eq!(
        (m.device, m.allocated, m.max_allocated, m.reserved),
        (2, 10 << 20, 30 << 20, 64 << 20)
    );
    assert!(m.ts_ns >= *mark_ts, "{} < {mark_ts}", m.ts_ns);
    // Made counts the marker only: a reading is not an event a reader could miss.
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, wire::Frame::Made { events: 1, .. })),
        "{frames:?}"
    );
}
