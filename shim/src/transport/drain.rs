//! The drain thread's loop: takes messages from the outbox, has them encoded into wire frames
//! (`frame.rs`) and delivered to the collector's socket, or to the shim's own trace file when
//! no collector can run (`delivery.rs`, which alone decides when the collector is stalled: see
//! the transport module doc), and answers flushes and the shutdown. The stream opens with the
//! Hello (`hello.rs`).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oomtrace_proto::trace_file;
use oomtrace_proto::wire::GoodbyeReason;
use oomtrace_proto::Event;

use super::delivery::{socket_to_try, Delivery, WRITE_CHUNK};
use super::frame::Frames;
use super::hello::hello;
use super::msg::{Done, Msg};
use super::outbox::{Outbox, ON_DRAIN_THREAD};
use super::ring::Receiver;
use super::sink::Sink;
use super::socket::UnixSink;
use crate::clock::Calibration;
use crate::config::Config;
use crate::log;

/// What the drain thread needs to know of the process besides its outbox.
pub struct DrainSetup {
    pub config: Config,
    /// The collector this process started at init (plain LD_PRELOAD): its socket, or why not.
    pub own_collector: Option<Result<PathBuf, String>>,
    /// The clock origin, taken before this process's first event was stamped.
    pub clock_origin: Calibration,
}

/// How long the drain thread sleeps after emptying the queue (and the step of its back-off
/// when idle): about 1,000 rounds a second at most, each taking a batch, encoding it into one
/// buffer and sending it in one `send`. The queue absorbs what comes meanwhile (65,536
/// messages by default: 13 ms at 5 M events/s); a quarter full, a hook wakes the drain thread.
const BATCH_WAIT: Duration = Duration::from_millis(1);
/// The drain thread tells waiting hooks about room every this many messages taken.
const ROOM_EVERY: usize = 1024;

/// Starts the drain thread with all signals blocked, so signals meant for the program are
/// never delivered to it.
pub fn spawn_drainer(ob: &'static Outbox, rx: Receiver, setup: DrainSetup) -> bool {
    // SAFETY: sigset_t is a plain bit array; all-zero is a valid (empty) set.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal-mask calls on the current thread with valid sets; the old mask is
    // restored right after the spawn.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // Before the thread exists: hooks may wait from the first event on.
    ob.shared.draining.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("oomtrace-drain".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let _ = ON_DRAIN_THREAD.try_with(|f| f.set(true));
            crate::guard::catch(|| Drainer::<UnixSink>::new(ob, setup, Instant::now).run(rx));
            // Ended (or failed): nobody waits for room any more; waiting hooks re-check.
            ob.shared.draining.store(false, Ordering::Release);
            ob.shared.progressed();
        });
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    match spawned {
        Ok(handle) => {
            let _ = ob.shared.drainer.set(handle.thread().clone());
            true
        }
        Err(_) => {
            ob.shared.draining.store(false, Ordering::Release);
            false
        }
    }
}

/// The drain loop's state: the frames being encoded, where they go, and the loop's own
/// bookkeeping (flushes waiting, idle rounds, when losses were last looked at).
struct Drainer<S: Sink> {
    ob: &'static Outbox,
    /// The time source (`Instant::now`; a fake clock in tests).
    now: fn() -> Instant,
    frames: Frames,
    delivery: Delivery<S>,
    lost_checked: Instant,
    idle_rounds: u32,
    /// Flush requests, each with the stream position it waits for.
    flushes: Vec<(u64, Arc<Done>)>,
}

/// What one round of the drain loop did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// Shut down: the stream has ended.
    Finished,
    /// Took nothing from the queue: sleep a little.
    Idle,
    /// Took messages and emptied the queue: sleep `BATCH_WAIT` while the next batch
    /// gathers.
    CaughtUp,
    /// Took a full round's worth, or held back at the cap: go on at once.
    Busy,
}

impl<S: Sink> Drainer<S> {
    fn new(ob: &'static Outbox, setup: DrainSetup, now_fn: fn() -> Instant) -> Drainer<S> {
        let DrainSetup {
            config,
            own_collector,
            clock_origin,
        } = setup;
        let socket = socket_to_try(&config, &own_collector);
        let now = now_fn();
        let hello = hello(ob.pid, config.stacks);
        Drainer {
            ob,
            now: now_fn,
            frames: Frames::new(WRITE_CHUNK + 4096, clock_origin),
            delivery: Delivery::new(ob, config, hello, socket, now, now_fn),
            lost_checked: now,
            idle_rounds: 0,
            flushes: Vec::new(),
        }
    }

    /// Drains `rx` (the outbox's one receiver) until the shutdown.
    fn run(mut self, mut rx: Receiver) {
        loop {
            let sleep = match self.round(&mut rx) {
                Round::Finished => return,
                Round::Busy => {
                    self.idle_rounds = 0;
                    continue;
                }
                // Caught up: let the next batch gather instead of chasing the producers one
                // message at a time (each message would then cost a cache-line transfer per
                // slot, and each round a `send` of a few hundred bytes and a collector wake-up).
                Round::CaughtUp => {
                    self.idle_rounds = 0;
                    BATCH_WAIT
                }
                Round::Idle => {
                    self.idle_rounds = self.idle_rounds.saturating_add(1);
                    // Backing off to 5 ms when idle.
                    BATCH_WAIT * self.idle_rounds.min(5)
                }
            };
            // Producers wake us early: a hook that finds the queue a quarter full (`nudge`),
            // one waiting for room, a flush, the shutdown.
            self.ob.shared.drainer_sleeps_at(rx.position());
            if rx.len() * 4 < self.ob.shared.capacity {
                std::thread::park_timeout(sleep);
            }
            self.ob.shared.drainer_woke();
        }
    }

    /// One turn of the drain loop: take what the queue holds (up to the cap), write, decide
    /// the stall, answer flushes. Never sleeps (`run` does, between idle rounds).
    fn round(&mut self, rx: &mut Receiver) -> Round {
        let mut flushes = std::mem::take(&mut self.flushes);
        self.ob.shared.heartbeat.fetch_add(1, Ordering::Relaxed);
        self.frames.cal.refresh();
        self.delivery.mirror_counts();
        let mut got = 0usize;
        let mut shutdown = None;
        let mut held_back = false;
        let mut emptied = false;
        while got < 200_000 {
            // At the cap, while the collector still reads: leave the rest in the queue
            // (hooks wait for room) instead of dropping it.
            if self.delivery.holding_back(&self.frames) {
                held_back = true;
                break;
            }
            let Some(head) = rx.head() else {
                emptied = true;
                break;
            };
            got += 1;
            // Events (nearly every message) are encoded where they lie in the queue.
            if let Msg::Event(ev) = head.msg() {
                self.encode_event(ev);
                drop(head);
            } else {
                match head.take() {
                    Msg::Flush(done) => {
                        flushes.push((self.delivery.stream_end(&mut self.frames), done))
                    }
                    Msg::Shutdown(reason, done) => {
                        shutdown = Some((reason, done));
                        break;
                    }
                    other => self.encode(other),
                }
            }
            if got.is_multiple_of(ROOM_EVERY) {
                self.ob.shared.progressed();
            }
            if self.frames.out.len() >= WRITE_CHUNK {
                self.delivery.write_chunk(&mut self.frames);
            }
        }
        if got > 0 {
            self.ob.shared.progressed();
        }
        if let Some((reason, done)) = shutdown {
            // Whatever other threads queued before the goodbye still goes out (past the
            // cap if need be: the queue bounds it).
            while let Some(msg) = rx.try_recv() {
                match msg {
                    Msg::Flush(d) => flushes.push((u64::MAX, d)),
                    Msg::Shutdown(_, d) => d.set(),
                    other => self.encode(other),
                }
            }
            self.finish(reason);
            for (_, d) in flushes.drain(..) {
                d.set();
            }
            done.set();
            return Round::Finished;
        }
        self.delivery.progress_connection(false, &mut self.frames);
        self.maybe_send_lost();
        self.delivery.write_out(&mut self.frames);
        self.delivery.update_stall(&self.frames);
        // A flush is done when its data left the process, not when a write was tried: a
        // collector that reads slowly keeps flushes waiting (their callers give up only
        // when nothing moves).
        if !self.delivery.is_stream() {
            for (_, d) in flushes.drain(..) {
                d.set();
            }
        } else if !flushes.is_empty() {
            let sent = self.delivery.sent_total();
            let drained = self.delivery.drained(&self.frames);
            flushes.retain(|(mark, d)| {
                let done = sent >= *mark || drained;
                if done {
                    d.set();
                }
                !done
            });
        }
        self.flushes = flushes;
        if got == 0 && !held_back {
            Round::Idle
        } else if emptied && self.ob.shared.waiters.load(Ordering::Relaxed) == 0 {
            Round::CaughtUp
        } else {
            Round::Busy
        }
    }

    /// One event into the open Events frame, or counted lost (the hot path: nearly every
    /// message).
    #[inline]
    fn encode_event(&mut self, ev: &Event) {
        if self.delivery.dropping(&self.frames).0 {
            self.ob.shared.count_lost(ev);
            return;
        }
        self.frames.push_event(ev);
    }

    fn encode(&mut self, msg: Msg) {
        let (drop_events, drop_defs) = self.delivery.dropping(&self.frames);
        if drop_events {
            match msg {
                Msg::Event(ev) => return self.ob.shared.count_lost(&ev),
                Msg::Marker { ev, .. } => return self.ob.shared.count_lost(&ev),
                _ => {}
            }
            if drop_defs {
                return;
            }
        }
        match msg {
            Msg::Event(ev) => self.encode_event(&ev),
            other => self.frames.push(other),
        }
    }

    fn maybe_send_lost(&mut self) {
        let now = (self.now)();
        if now.duration_since(self.lost_checked) < Duration::from_millis(500) {
            return;
        }
        self.lost_checked = now;
        self.push_lost_if_changed();
    }

    fn push_lost_if_changed(&mut self) {
        self.frames.lost_if_changed(self.ob.shared.snapshot());
    }

    fn finish(&mut self, reason: GoodbyeReason) {
        // Twice: an inherited socket that fails turns into starting our own collector.
        self.delivery.progress_connection(true, &mut self.frames);
        self.delivery.progress_connection(true, &mut self.frames);
        self.push_lost_if_changed();
        // What this process made, delivered or not: the reader counts as lost what it did
        // not receive of it, whatever happened on the way.
        self.frames.end(self.ob.made(), reason);
        if !self.delivery.finish_stream(&mut self.frames) {
            return;
        }
        let waits = self.ob.shared.waits.load(Ordering::Relaxed);
        if waits > 0 {
            log::info(&format!(
                "hooks found the queue full {waits} times and waited {} ms in all for the \
                 collector",
                self.ob.shared.waited_ns.load(Ordering::Relaxed) / 1_000_000
            ));
        }
        let lost = self.ob.shared.total_lost();
        let made = trace_file::ConnMade {
            conn: 0,
            events: self.ob.made(),
            ending: reason as u8,
        };
        self.delivery.say_lost(lost, made);
    }
}

#[cfg(test)]
mod tests;
