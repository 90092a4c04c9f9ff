//! The hooks' side of the transport: the bounded queue and the counters it shares with the
//! drain thread (sent, lost by kind and device, progress, stall). Hooks, stacks and Python
//! frames get an [`Outbox`] and nothing else of the process state, so data flows one way:
//! hook -> event -> outbox -> drain thread.
//!
//! Waiting for room (lossless while the collector reads, bounded when it stalls) is decided
//! here; when the drain thread calls the collector stalled is decided in `delivery.rs`.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use super::msg::{Done, Msg};
use super::ring::{PushError, Receiver, Refused, Ring};
use crate::cache_line::CacheLine;
use oomtrace_proto::counter_page::{CounterPage, PageFd};
use oomtrace_proto::wire::{GoodbyeReason, Lost};
use oomtrace_proto::{Event, EventKind, StackId};

/// The queue and counters of one process image (a fork child makes its own).
pub struct Outbox {
    /// The queue (`ring.rs`); the drain thread holds its one `Receiver`.
    pub(super) ring: Ring,
    /// The process this outbox belongs to: a (v)fork child that still sees it never waits.
    pub(super) pid: u32,
    pub(super) shared: Shared,
    /// Every event and step marker this process made, delivered or not (one relaxed add per
    /// event): the counter page's word, which the collector reads when the stream ends (see
    /// `oomtrace_proto::counter_page`), or a word of our own when no page could be made.
    made: &'static AtomicU64,
    /// The page's `ending` word: the `GoodbyeReason` once the end of stream has begun.
    ending: &'static AtomicU64,
}

/// The counter page's descriptor until the drain thread hands it to the collector (then it
/// is closed). A fork child closes its copy (`take_page_fd`); `try_lock` never waits on a
/// lock a fork copied while held.
static PAGE_FD: Mutex<Option<PageFd>> = Mutex::new(None);

/// The counter page's descriptor, if it was not handed over yet (and is still ours).
pub(super) fn take_page_fd() -> Option<PageFd> {
    PAGE_FD.try_lock().ok()?.take()
}

static CURRENT: AtomicPtr<Outbox> = AtomicPtr::new(std::ptr::null_mut());

/// The outbox of this process, once tracing started (None before, and in a fork child until
/// its own start).
#[inline]
pub fn current() -> Option<&'static Outbox> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: only `publish` stores a non-null pointer, and it comes from a leaked
    // `&'static Outbox` that is never freed.
    unsafe { p.as_ref() }
}

impl Outbox {
    /// A queue of `capacity` messages (rounded up to a power of two) for process `pid`, and
    /// the receiving end for the drain thread. The outbox is leaked: hooks on any thread may
    /// hold it until the process ends.
    pub fn create(capacity: usize, pid: u32) -> (&'static Outbox, Receiver) {
        let ring = Ring::new(capacity);
        let capacity = ring.capacity();
        let (made, ending) = match CounterPage::create() {
            Ok((page, fd)) => {
                if let Some(old) = PAGE_FD.try_lock().ok().and_then(|mut g| g.replace(fd)) {
                    old.close();
                }
                let page: &'static CounterPage = Box::leak(Box::new(page));
                (page.made(), page.ending())
            }
            // No memfd (an old kernel, a sandbox): the count still goes out in the `Made`
            // frame before the goodbye, only not when the stream is cut.
            Err(_) => {
                let words: &'static [AtomicU64; 2] =
                    Box::leak(Box::new([const { AtomicU64::new(0) }; 2]));
                (&words[0], &words[1])
            }
        };
        let ob: &'static Outbox = Box::leak(Box::new(Outbox {
            ring,
            pid,
            shared: Shared::new(capacity),
            made,
            ending,
        }));
        (ob, Receiver::new(&ob.ring))
    }

    /// Makes `ob` what [`current`] returns.
    pub fn publish(ob: &'static Outbox) {
        CURRENT.store(ob as *const Outbox as *mut Outbox, Ordering::Release);
    }

    /// In a fork child: forget the parent's outbox (leaked with what it held).
    pub fn forget() {
        CURRENT.store(std::ptr::null_mut(), Ordering::Release);
    }

    /// [`send_event`] through this outbox, `ev` stamped already (the drain thread's tests).
    #[cfg(test)]
    pub fn send_event(&self, ev: Event) {
        push_event(self, ev)
    }

    /// Queues `msg` (a stack, module or code definition), waiting for room while the
    /// collector reads; false if it could not go.
    pub fn send_reliable(&self, msg: Msg) -> bool {
        send_reliable(self, msg)
    }

    pub fn send_marker(&self, ev: Event, label: &str) {
        send_marker(self, ev, label)
    }

    /// A stack that could not be queued.
    pub fn count_lost_stack(&self) {
        self.shared.count_lost_stack()
    }

    /// Events counted lost so far.
    pub fn total_lost(&self) -> u64 {
        self.shared.total_lost()
    }

    /// Whether the end of the stream (goodbye included) has left the process: a shutdown
    /// that timed out after that lost nothing.
    pub fn end_delivered(&self) -> bool {
        self.shared.end_delivered.load(Ordering::Acquire)
    }

    /// Events and markers made so far, delivered or not.
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Acquire)
    }

    /// The `ending` word: the `GoodbyeReason` once the end of stream has begun, else 0.
    pub(super) fn ending(&self) -> u64 {
        self.ending.load(Ordering::Acquire)
    }

    /// Everything queued so far leaves the process (bounded wait; see `flush`).
    pub fn flush(&self, timeout: Duration) -> bool {
        flush(self, timeout)
    }

    /// The end of the stream (bounded wait; see `shutdown`).
    pub fn shutdown(&self, reason: GoodbyeReason, timeout: Duration) -> bool {
        shutdown(self, reason, timeout)
    }
}

/// Lost-event slots: devices 0..15, then one for unknown/other devices.
const LOST_SLOTS: usize = 17;

/// A waiting hook gives up after this long without the drain thread running its loop or
/// making progress: a drain thread blocked somewhere other than a socket write (a slow disk),
/// which the stall rule does not cover.
const WAIT_BACKSTOP: Duration = Duration::from_millis(2000);
/// A waiting hook re-checks stall, shutdown and the backstop this often.
const WAIT_SLICE: Duration = Duration::from_millis(10);

thread_local! {
    /// Set on the drain thread: it must never wait for room in its own queue.
    pub(super) static ON_DRAIN_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Touched by a thread the first time it waits; once the thread's thread-local
    /// destructors have dropped it, `try_with` fails: the thread is exiting, never wait.
    static THREAD_LIVE: Live = const { Live };
}

struct Live;

impl Drop for Live {
    fn drop(&mut self) {}
}

/// Counters and signals shared by hooks and the drain thread.
pub(super) struct Shared {
    pub(super) lost_events: AtomicU64,
    pub(super) lost_frees: AtomicU64,
    pub(super) lost_stacks: AtomicU64,
    pub(super) lost_by_device: [AtomicU64; LOST_SLOTS],
    /// Bumped by the drain thread whenever it makes progress (room in the queue, bytes
    /// written) or its state changes; waiting hooks sleep on it (a futex word).
    pub(super) progress: AtomicU32,
    /// Hooks currently waiting on `progress`.
    pub(super) waiters: AtomicU32,
    /// Sends that found the queue full and waited (or tried to), and the nanoseconds they
    /// spent there: the program felt the collector (said at exit with `OOMTRACE_LOG=1`).
    pub(super) waits: AtomicU64,
    pub(super) waited_ns: AtomicU64,
    /// Bumped by the drain thread once per loop: it is alive (no wake-up).
    pub(super) heartbeat: AtomicU32,
    /// The collector took nothing for `STALL_WAIT` while data waited, or is gone: hooks do not
    /// wait for room (set and cleared by the drain thread).
    pub(super) stalled: AtomicBool,
    /// The drain thread runs (set before it starts, cleared when it ends).
    pub(super) draining: AtomicBool,
    /// `shutdown` has begun: the process is finishing; hooks do not wait any more.
    pub(super) closing: AtomicBool,
    /// The whole stream, goodbye included, has left the process (only the collector's
    /// acknowledgement may still be awaited).
    pub(super) end_delivered: AtomicBool,
    pub(super) drainer: OnceLock<std::thread::Thread>,
    /// The tail at which a push wakes the drain thread (`nudge`): a quarter of the ring past
    /// the head while it sleeps, never (`usize::MAX`) while it works. Read by every event's
    /// push: on a line of its own, away from `progress` and `heartbeat`, which the drain thread
    /// writes every round.
    pub(super) wake_at: CacheLine<AtomicUsize>,
    pub(super) capacity: usize,
}

impl Shared {
    fn new(capacity: usize) -> Shared {
        Shared {
            lost_events: AtomicU64::new(0),
            lost_frees: AtomicU64::new(0),
            lost_stacks: AtomicU64::new(0),
            lost_by_device: std::array::from_fn(|_| AtomicU64::new(0)),
            progress: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            waits: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
            heartbeat: AtomicU32::new(0),
            stalled: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            end_delivered: AtomicBool::new(false),
            drainer: OnceLock::new(),
            wake_at: CacheLine(AtomicUsize::new(usize::MAX)),
            capacity,
        }
    }

    pub fn count_lost(&self, ev: &Event) {
        self.lost_events.fetch_add(1, Ordering::Relaxed);
        if ev.kind() == Some(EventKind::Free) {
            self.lost_frees.fetch_add(1, Ordering::Relaxed);
        }
        let slot = if (0..16).contains(&ev.device) {
            ev.device as usize
        } else {
            LOST_SLOTS - 1
        };
        self.lost_by_device[slot].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_lost_stack(&self) {
        self.lost_stacks.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Lost {
        let by_device = self
            .lost_by_device
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let n = c.load(Ordering::Relaxed);
                let dev = if i == LOST_SLOTS - 1 { -1 } else { i as i16 };
                (n > 0).then_some((dev, n))
            })
            .collect();
        Lost {
            events: self.lost_events.load(Ordering::Relaxed),
            frees: self.lost_frees.load(Ordering::Relaxed),
            stacks: self.lost_stacks.load(Ordering::Relaxed),
            by_device,
        }
    }

    pub fn total_lost(&self) -> u64 {
        self.lost_events.load(Ordering::Relaxed)
    }

    pub(super) fn wake(&self) {
        if let Some(t) = self.drainer.get() {
            t.unpark();
        }
    }

    /// Wakes an idle drain thread once the queue is a quarter full, given the tail after a
    /// push: one compare with `wake_at`, no read of the head, which lives on a cache line the
    /// drain thread is writing.
    #[inline]
    fn nudge(&self, tail: usize) {
        if self.wakes_drainer(tail) {
            self.wake();
        }
    }

    #[inline(always)]
    fn wakes_drainer(&self, tail: usize) -> bool {
        tail >= self.wake_at.load(Ordering::Relaxed)
    }

    /// The drain thread is going to sleep with its head at `head`: a push that makes the queue
    /// a quarter full wakes it. SeqCst (a full fence on x86-64) before the drain thread reads
    /// the tail, as a push's compare-and-swap is before its read of this: a push either sees
    /// this or is seen in that read (and a wake missed would cost no more than the sleep's
    /// bound, 5 ms).
    pub(super) fn drainer_sleeps_at(&self, head: usize) {
        self.wake_at
            .store(head + self.capacity.div_ceil(4), Ordering::SeqCst);
    }

    /// The drain thread is awake: pushes need not wake it.
    pub(super) fn drainer_woke(&self) {
        self.wake_at.store(usize::MAX, Ordering::Relaxed);
    }

    /// The drain thread made progress (or changed state): bump the futex word and wake the
    /// hooks waiting on it, if any. SeqCst pairs with `wait_for_room`: a hook that registered
    /// as a waiter either is seen here or sees the new value before it sleeps.
    pub(super) fn progressed(&self) {
        self.progress.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            futex_wake_all(&self.progress);
        }
    }

    pub(super) fn set_stalled(&self, stalled: bool) {
        if self.stalled.swap(stalled, Ordering::SeqCst) != stalled {
            self.progressed();
        }
    }
}

/// Sleeps until `word` is no longer `expected`, a wake-up, or `timeout`.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 for the whole call; FUTEX_WAIT only reads it and
    // returns at once if it no longer holds `expected`; `ts` is a valid relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not access memory beyond it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Whether this thread may wait for room at all: never on the drain thread, when the drain
/// thread has ended, or in a (v)fork child that still sees the parent's state.
fn may_wait_at_all(ob: &Outbox) -> bool {
    if ON_DRAIN_THREAD.try_with(Cell::get).unwrap_or(true)
        || !ob.shared.draining.load(Ordering::Acquire)
    {
        return false;
    }
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 == ob.pid }
}

/// Whether a hook may wait for room: as `may_wait_at_all`, and not while the thread's
/// thread-locals are being destroyed, once the process is finishing, or while the collector
/// is stalled or gone.
fn may_wait(ob: &Outbox) -> bool {
    let sh = &ob.shared;
    !sh.closing.load(Ordering::Acquire)
        && !sh.stalled.load(Ordering::Acquire)
        && THREAD_LIVE.try_with(|_| ()).is_ok()
        && may_wait_at_all(ob)
}

/// The slow path of every send: the queue was full. Waits for room while the drain thread
/// makes progress (see the module doc); gives the message back if it cannot go.
/// `control` (flush, shutdown): also waits while stalled or closing (the drain thread still
/// takes messages then), giving up after `limit` in which no room was made and no byte
/// written.
#[cold]
#[inline(never)]
fn wait_for_room(ob: &Outbox, mut msg: Msg, control: Option<Duration>) -> Result<(), Msg> {
    let sh = &ob.shared;
    let allowed = || match control {
        Some(_) => may_wait_at_all(ob),
        None => may_wait(ob),
    };
    if !allowed() {
        return Err(msg);
    }
    let limit = control.unwrap_or(WAIT_BACKSTOP);
    sh.wake();
    sh.waiters.fetch_add(1, Ordering::SeqCst);
    let mut seen = sh.progress.load(Ordering::SeqCst);
    let mut beat = sh.heartbeat.load(Ordering::Relaxed);
    let mut since = Instant::now();
    let began = since;
    let result = loop {
        match ob.ring.push(msg) {
            Ok(_) => break Ok(()),
            Err(PushError::Closed(m)) => break Err(m),
            Err(PushError::Full(m)) => msg = m,
        }
        futex_wait(&sh.progress, seen, WAIT_SLICE);
        if !allowed() {
            break Err(msg);
        }
        let now = sh.progress.load(Ordering::SeqCst);
        // A hook's wait goes on while the drain thread runs at all (it decides the stall); a
        // flush or shutdown waits only while something moves, so exit stays bounded by its
        // caller's timeout even when a running collector reads nothing.
        let now_beat = match control {
            None => sh.heartbeat.load(Ordering::Relaxed),
            Some(_) => beat,
        };
        if now != seen || now_beat != beat {
            seen = now;
            beat = now_beat;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            break Err(msg);
        }
        sh.wake();
    };
    sh.waiters.fetch_sub(1, Ordering::SeqCst);
    sh.waits.fetch_add(1, Ordering::Relaxed);
    sh.waited_ns
        .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
    result
}

/// An allocation, a removal, any event: stamped with the calling thread and the time, sent
/// through this process's outbox (nothing before tracing started). It waits for room like
/// every event (see the module doc); counted lost if it cannot go.
///
/// The event goes in six registers, not through memory: every field but the time, stamped
/// here; the stack and the thread as one word, the tail's result, device, kind and api as
/// another. A recorder then builds nothing on its stack and the push stores each word once,
/// into the queue's slot (an event built on the stack, stamped there and copied: 303 against
/// 297 instructions a cudaMalloc+cudaFree pair events only, 603 against 598 with stacks).
/// The thread is read here, in the recorder: where the recorder's guard reached the same
/// thread block in the same function (PyTorch's allocator wrapper, its deleter) the lookup
/// is shared, 5 instructions an event less; a hook whose guard is in its wrapper looks it up
/// once here, as the push did.
#[inline(always)]
pub fn send_event(ev: &Event) {
    let tail = u64::from(ev.result as u32)
        | u64::from(ev.device as u16) << 32
        | u64::from(ev.kind) << 48
        | u64::from(ev.api) << 56;
    let stack_and_thread = u64::from(ev.stack.0) | u64::from(crate::this_thread::known_tid()) << 32;
    send_event_in_registers(ev.ptr, ev.size, ev.aux, ev.extra, stack_and_thread, tail);
}

/// [`send_event`]'s one copy, called by every recorder: with its refusal out of line, the
/// compiler would otherwise inline it into each and the recorders grew more than the call
/// saved (349 -> 388 instructions a cudaMalloc+cudaFree pair). Its two rare cases (the
/// thread's first event, a refused push) are tail calls with the same six arguments, and
/// the clock is read once the slot is claimed: the push that succeeds then needs three
/// saved registers and nothing on the stack (with the calls, or the clock read first, it
/// took six and a copy of the event: 10 instructions an event more).
#[inline(never)]
fn send_event_in_registers(
    ptr: u64,
    size: u64,
    aux: u64,
    extra: u64,
    stack_and_thread: u64,
    tail: u64,
) {
    if stack_and_thread >> 32 == 0 {
        return first_event_of_thread(ptr, size, aux, extra, stack_and_thread, tail);
    }
    let Some(ob) = current() else { return };
    ob.made.fetch_add(1, Ordering::Relaxed);
    match ob
        .ring
        .push_event_made(|| stamped(ptr, size, aux, extra, stack_and_thread, tail))
    {
        Ok(at) => ob.shared.nudge(at),
        Err(_) => event_refused(ptr, size, aux, extra, stack_and_thread, tail),
    }
}

/// The event of these words (the stack in the low half of `stack_and_thread`, the thread in
/// the high half), stamped with the time now.
#[inline(always)]
fn stamped(ptr: u64, size: u64, aux: u64, extra: u64, stack_and_thread: u64, tail: u64) -> Event {
    Event {
        seq: 0,
        ts_ns: crate::clock::ticks(),
        ptr,
        size,
        aux,
        extra,
        stack: StackId(stack_and_thread as u32),
        tid: (stack_and_thread >> 32) as u32,
        result: tail as u32 as i32,
        device: (tail >> 32) as u16 as i16,
        kind: (tail >> 48) as u8,
        api: (tail >> 56) as u8,
    }
}

/// [`send_event_in_registers`] on a thread whose id was never asked: asks it (once a
/// thread), then sends.
#[cold]
#[inline(never)]
fn first_event_of_thread(ptr: u64, size: u64, aux: u64, extra: u64, stack: u64, tail: u64) {
    // A kernel thread id is never 0 (checked all the same: 0 would come back here forever).
    let tid = crate::this_thread::tid();
    if tid != 0 {
        let stack_and_thread = stack as u32 as u64 | u64::from(tid) << 32;
        send_event_in_registers(ptr, size, aux, extra, stack_and_thread, tail)
    }
}

/// Counts a stamped event made, then queues it or counts it lost.
#[cfg(test)]
fn push_event(ob: &Outbox, ev: Event) {
    ob.made.fetch_add(1, Ordering::Relaxed);
    push_made(ob, ev);
}

/// Queues a stamped event already counted made, waiting for room, or counts it lost.
fn push_made(ob: &Outbox, ev: Event) {
    match ob.ring.push_event(&ev) {
        Ok(at) => ob.shared.nudge(at),
        Err(refused) => queue_refused(ob, ev, refused),
    }
}

/// [`send_event_in_registers`] when the queue refused (counted made already): stamped
/// again, tried again, then waits for room or counts it lost.
#[cold]
#[inline(never)]
fn event_refused(ptr: u64, size: u64, aux: u64, extra: u64, stack_and_thread: u64, tail: u64) {
    let Some(ob) = current() else { return };
    push_made(ob, stamped(ptr, size, aux, extra, stack_and_thread, tail));
}

/// A stamped event the queue refused: waits for room (full) or counts it lost (closed).
#[cold]
#[inline(never)]
fn queue_refused(ob: &Outbox, ev: Event, refused: Refused) {
    match refused {
        Refused::Full => {
            if wait_for_room(ob, Msg::Event(ev), None).is_err() {
                ob.shared.count_lost(&ev);
            }
        }
        Refused::Closed => ob.shared.count_lost(&ev),
    }
}

/// Queues `msg`, waiting for room while the collector reads; false if it could not go.
fn send_reliable(ob: &Outbox, msg: Msg) -> bool {
    match ob.ring.push(msg) {
        Ok(tail) => {
            ob.shared.nudge(tail);
            true
        }
        Err(PushError::Full(msg)) => wait_for_room(ob, msg, None).is_ok(),
        Err(PushError::Closed(_)) => false,
    }
}

fn send_marker(ob: &Outbox, ev: Event, label: &str) {
    ob.made.fetch_add(1, Ordering::Relaxed);
    let msg = Msg::Marker {
        ev: Box::new(ev),
        label: label.into(),
    };
    if !send_reliable(ob, msg) {
        ob.shared.count_lost(&ev);
    }
}

/// Queues a flush or shutdown request: waits for room even while stalled (the drain thread
/// still takes messages then), up to `limit` with no progress.
fn send_control(ob: &Outbox, msg: Msg, limit: Duration) -> bool {
    match ob.ring.push(msg) {
        Ok(_) => true,
        Err(PushError::Full(msg)) => wait_for_room(ob, msg, Some(limit)).is_ok(),
        Err(PushError::Closed(_)) => false,
    }
}

/// Waits for `done` while the drain thread makes progress; false after `limit` without any.
fn wait_done(ob: &Outbox, done: &Done, limit: Duration) -> bool {
    let sh = &ob.shared;
    let mut seen = sh.progress.load(Ordering::SeqCst);
    let mut since = Instant::now();
    loop {
        if done.wait(Duration::from_millis(50)) {
            return true;
        }
        if !sh.draining.load(Ordering::Acquire) {
            return done.wait(Duration::ZERO);
        }
        let now = sh.progress.load(Ordering::SeqCst);
        if now != seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            return false;
        }
    }
}

/// Asks the drain thread to write out what is queued; waits until it has left the process,
/// giving up after `timeout` without progress.
fn flush(ob: &Outbox, timeout: Duration) -> bool {
    if !may_wait_at_all(ob) {
        return false;
    }
    let done = Done::new();
    if !send_control(ob, Msg::Flush(done.clone()), timeout) {
        return false;
    }
    ob.shared.wake();
    wait_done(ob, &done, timeout)
}

/// Asks the drain thread to finish (goodbye, close); waits until it has, giving up after
/// `timeout` without progress. From here on hooks never wait for room.
fn shutdown(ob: &Outbox, reason: GoodbyeReason, timeout: Duration) -> bool {
    if ON_DRAIN_THREAD.try_with(Cell::get).unwrap_or(true) {
        return false;
    }
    ob.shared.closing.store(true, Ordering::SeqCst);
    // The collector learns from the page that this process is ending, even if the end of
    // its stream never reaches it.
    ob.ending.store(reason as u64, Ordering::Release);
    // Hooks already waiting re-check and stop.
    ob.shared.progressed();
    let done = Done::new();
    if !send_control(ob, Msg::Shutdown(reason, done.clone()), timeout) {
        return false;
    }
    ob.shared.wake();
    wait_done(ob, &done, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A push wakes a sleeping drain thread exactly when the queue it leaves is a quarter
    /// full (rounded up), and never one that is awake.
    #[test]
    fn a_push_wakes_the_sleeping_drain_thread_at_a_quarter_full() {
        let sh = Shared::new(16);
        assert!(!sh.wakes_drainer(1 << 40), "awake from the start");
        sh.drainer_sleeps_at(5);
        assert!(!sh.wakes_drainer(8), "3 of 16 queued");
        assert!(sh.wakes_drainer(9), "4 of 16 queued");
        assert!(sh.wakes_drainer(30));
        sh.drainer_woke();
        assert!(!sh.wakes_drainer(30));
        let odd = Shared::new(2);
        odd.drainer_sleeps_at(7);
        assert!(!odd.wakes_drainer(7), "empty");
        assert!(odd.wakes_drainer(8), "1 of 2 queued is more than a quarter");
    }

    /// Each event carries its own thread and its stack, the thread's first event (its id
    /// not asked yet) included: the two travel to the push in one word.
    #[test]
    fn events_carry_the_sending_thread_and_their_stack() {
        const MARK: u64 = 0x7e57_0000_0000;
        let (ob, rx) = Outbox::create(1024, std::process::id());
        Outbox::publish(ob);
        let tids: Vec<(u64, u32)> = (0..3u64)
            .map(|t| {
                std::thread::spawn(move || {
                    for k in 0..2 {
                        send_event(&Event {
                            ptr: MARK + t * 16 + k,
                            stack: StackId(0xffff_fff0 + k as u32),
                            ..Event::new(EventKind::Alloc, oomtrace_proto::Api::cudaMalloc)
                        });
                    }
                    // SAFETY: gettid has no preconditions.
                    (t, unsafe { libc::gettid() } as u32)
                })
            })
            .map(|h| h.join().unwrap())
            .collect();
        Outbox::forget();
        // Only this test's events: others running beside it may have sent theirs here.
        let mine: Vec<Event> = rx
            .try_iter()
            .filter_map(|m| match m {
                Msg::Event(ev) if ev.ptr & !0xffff == MARK => Some(ev),
                _ => None,
            })
            .collect();
        assert_eq!(mine.len(), 6);
        for ev in mine {
            let (t, k) = ((ev.ptr - MARK) / 16, (ev.ptr - MARK) % 16);
            assert_eq!(ev.tid, tids[t as usize].1, "event {k} of thread {t}");
            assert_eq!(ev.stack, StackId(0xffff_fff0 + k as u32));
        }
    }
}
