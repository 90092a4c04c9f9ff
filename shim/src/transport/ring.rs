//! The outbox's queue: a bounded ring of messages, many producers (hooks on any thread), one
//! consumer (the drain thread).
//!
//! Dmitry Vyukov's bounded queue: each slot carries a stamp saying whose turn it is, so a
//! producer claims a position with one compare-and-swap of the tail and publishes the message
//! with one release store, and the consumer takes it with one acquire load and one store.
//! Unlike a general channel (crossbeam's, which the shim used before), nothing wakes anyone
//! per message and the consumer side is not shared: the drain thread reads its head without
//! a compare-and-swap and takes whole runs of messages between sleeps, in queue order.
//! Waiting for room and waking the drain thread stay in `outbox.rs`.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

use oomtrace_proto::Event;

use super::msg::Msg;

/// Set in the tail once the consumer has gone: every later push fails at once (and a push
/// racing with it either lands before the mark, or sees it in its compare-and-swap).
const CLOSED: usize = 1 << (usize::BITS - 1);

/// How many slots ahead of the one it fills a push asks the cache for. The ring (64 Ki slots
/// of 80 bytes by default) is larger than a core's cache, so the slot a push fills was last
/// touched a lap ago and its line is cold: each event waited for its line, and the locked
/// compare-and-swap of the next push waited for that store. Asked for eight pushes ahead, the
/// line is there when its push comes (the two-site loop: 1.33x -> 1.27x the untraced wall
/// time events only, bench/2026-12-06-prefetch.md; 2, 4, 16 or 32 ahead did as well).
const PREFETCH_AHEAD: usize = 8;

/// Keeps the producers' tail and the consumer's head on cache lines of their own.
#[repr(align(128))]
struct Padded<T>(T);

struct Slot {
    /// `pos`: free for the producer of position `pos`; `pos + 1`: holds that position's
    /// message; `pos + capacity`: taken, free for the next lap.
    stamp: AtomicUsize,
    msg: UnsafeCell<MaybeUninit<Msg>>,
}

pub(super) struct Ring {
    /// The next position a producer claims, with `CLOSED` once the consumer has gone.
    tail: Padded<AtomicUsize>,
    /// The next position the consumer takes (written by it alone; producers read it only
    /// for `len`).
    head: Padded<AtomicUsize>,
    slots: Box<[Slot]>,
    mask: usize,
}

// SAFETY: a slot's message is written only by the producer that claimed its position (the
// tail's compare-and-swap gives each position to one producer) and read only by the one
// consumer (`Receiver` is neither Clone nor Sync), each after the stamp says it is its turn
// (release/acquire pairs order the message with the stamp). Messages are Send.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns its messages, which are Send.
unsafe impl Send for Ring {}

/// Why a message did not go in; it is given back.
pub enum PushError {
    /// No room: the consumer has not taken the message `capacity` positions back yet.
    Full(Msg),
    /// The consumer has gone (the drain thread ended).
    Closed(Msg),
}

/// Why an event did not go in (the pusher still has it: an `Event` is a copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Full,
    Closed,
}

impl Refused {
    fn with(self, msg: Msg) -> PushError {
        match self {
            Refused::Full => PushError::Full(msg),
            Refused::Closed => PushError::Closed(msg),
        }
    }
}

impl Ring {
    /// A ring of at least `capacity` slots (rounded up to a power of two).
    pub(super) fn new(capacity: usize) -> Ring {
        let cap = capacity.max(2).next_power_of_two();
        Ring {
            tail: Padded(AtomicUsize::new(0)),
            head: Padded(AtomicUsize::new(0)),
            slots: (0..cap)
                .map(|i| Slot {
                    stamp: AtomicUsize::new(i),
                    msg: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: cap - 1,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// The slot of position `pos`, without a bounds check on every push.
    #[inline(always)]
    fn slot(&self, pos: usize) -> &Slot {
        debug_assert_eq!(self.slots.len(), self.mask + 1);
        // SAFETY: `new` makes `slots` `mask + 1` long (a power of two) and neither changes
        // after, so `pos & mask` is in bounds.
        unsafe { self.slots.get_unchecked(pos & self.mask) }
    }

    /// Queues `msg` at the tail, or gives it back. Ok: the tail after it (its position + 1),
    /// which tells the pusher how full the queue may be without reading the consumer's head.
    #[inline]
    pub(super) fn push(&self, msg: Msg) -> Result<usize, PushError> {
        match self.claim() {
            // SAFETY: `claim` gave this thread the slot, empty, until `publish`; the message
            // is written there whole.
            Ok((slot, pos)) => Ok(unsafe { self.publish(slot, pos, |dst| dst.write(msg)) }),
            Err(r) => Err(r.with(msg)),
        }
    }

    /// Queues an event as [`Ring::push`] does, written into its slot field by field
    /// ([`Msg::write_event`]), not built on the stack as a message and copied; a refusal
    /// fits in a register, where a message given back would go through memory.
    #[inline]
    pub(super) fn push_event(&self, ev: &Event) -> Result<usize, Refused> {
        self.push_event_made(|| *ev)
    }

    /// [`Ring::push_event`] of the event `make` gives once a position is claimed: what it
    /// reads (the clock) is read after the claim, when the registers the claim used are free.
    #[inline(always)]
    pub(super) fn push_event_made(&self, make: impl FnOnce() -> Event) -> Result<usize, Refused> {
        let (slot, pos) = self.claim()?;
        let ev = make();
        // SAFETY: as in `push`; `write_event` writes a whole message.
        Ok(unsafe { self.publish(slot, pos, |dst| Msg::write_event(dst, &ev)) })
    }

    /// Claims the tail's position: its slot, empty, is this thread's until `publish`.
    #[inline(always)]
    fn claim(&self) -> Result<(&Slot, usize), Refused> {
        let mut tail = self.tail.0.load(Ordering::Relaxed);
        loop {
            if tail & CLOSED != 0 {
                return Err(Refused::Closed);
            }
            let slot = self.slot(tail);
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == tail {
                match self.tail.0.compare_exchange_weak(
                    tail,
                    tail + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    // The compare-and-swap gave position `tail` to this thread alone, and
                    // its stamp says the consumer has taken the slot's previous message (or
                    // there was none): nobody else touches the slot until `publish`.
                    Ok(_) => return Ok((slot, tail)),
                    Err(now) => tail = now,
                }
            } else if (stamp as isize).wrapping_sub(tail as isize) < 0 {
                // The slot still holds the message of the previous lap: full. (A stale
                // `tail` never gets here: its slot would show `tail + 1` or later.)
                return Err(Refused::Full);
            } else {
                // Another producer took this position: look again.
                tail = self.tail.0.load(Ordering::Relaxed);
            }
        }
    }

    /// Writes the message of claimed position `pos` with `write` and hands it to the
    /// consumer. Returns the tail after it.
    ///
    /// # Safety
    /// `slot` and `pos` come from this thread's `claim`, not yet published; `write` writes a
    /// whole `Msg` at the pointer it is given (valid for writes, holding none).
    #[inline(always)]
    unsafe fn publish(&self, slot: &Slot, pos: usize, write: impl FnOnce(*mut Msg)) -> usize {
        prefetch((slot as *const Slot).wrapping_add(PREFETCH_AHEAD));
        write(slot.msg.get().cast::<Msg>());
        slot.stamp.store(pos + 1, Ordering::Release);
        pos + 1
    }

    /// Messages queued and not taken yet (approximate while producers push).
    #[inline]
    pub(super) fn len(&self) -> usize {
        let tail = self.tail.0.load(Ordering::Relaxed) & !CLOSED;
        let head = self.head.0.load(Ordering::Relaxed);
        tail.saturating_sub(head)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Asks the cache for the line at `at`, which may be past the ring's end (the last
/// [`PREFETCH_AHEAD`] slots of a lap ask for memory after it): one instruction, where
/// wrapping the position around the ring took four more.
#[inline(always)]
fn prefetch(at: *const Slot) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that neither reads memory as the program sees it nor
    // faults, whatever the address (LLVM's `llvm.prefetch`: no effect on behaviour), so any
    // pointer is sound; SSE, which has it, is part of x86-64.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The consumer's end: one per ring, owned by the drain thread. Dropping it closes the ring
/// (pushes fail from then on) and drops what is left in it.
pub struct Receiver {
    ring: &'static Ring,
    /// Not Sync: the head is read and written without synchronization between consumers.
    _one_consumer: PhantomData<Cell<()>>,
}

impl Receiver {
    /// The consumer of `ring`; there must be only one for its whole life.
    pub(super) fn new(ring: &'static Ring) -> Receiver {
        Receiver {
            ring,
            _one_consumer: PhantomData,
        }
    }

    /// The message at the head, if its producer has finished writing it. Messages come out
    /// in the order their producers claimed positions; one still being written holds back
    /// those behind it.
    #[inline]
    pub fn try_recv(&self) -> Option<Msg> {
        let (slot, pos) = self.ready()?;
        // SAFETY: `ready` says the producer of `pos` wrote the message and handed the slot
        // over; this is the only consumer (not Sync; a `Head` would borrow it mutably), and
        // the slot is not written again until `release` gives it back.
        let msg = unsafe { (*slot.msg.get()).assume_init_read() };
        self.release(slot, pos);
        Some(msg)
    }

    /// The message at the head, left in its slot: the drain thread encodes an event where it
    /// lies instead of moving it out. Dropping the `Head` takes the message (drops it).
    #[inline]
    pub fn head(&mut self) -> Option<Head<'_>> {
        let (slot, pos) = self.ready()?;
        Some(Head {
            rx: self,
            slot,
            pos,
        })
    }

    /// The head's slot and position, if its message is ready.
    #[inline]
    fn ready(&self) -> Option<(&'static Slot, usize)> {
        let ring = self.ring;
        let pos = ring.head.0.load(Ordering::Relaxed);
        let slot = ring.slot(pos);
        (slot.stamp.load(Ordering::Acquire) == pos + 1).then_some((slot, pos))
    }

    /// Gives the slot of `pos` back to the producers (its message was moved out or dropped).
    #[inline]
    fn release(&self, slot: &Slot, pos: usize) {
        slot.stamp
            .store(pos + self.ring.capacity(), Ordering::Release);
        self.ring.head.0.store(pos + 1, Ordering::Release);
    }

    /// Everything that can be taken now.
    pub fn try_iter(&self) -> impl Iterator<Item = Msg> + '_ {
        std::iter::from_fn(|| self.try_recv())
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The head's position: the next message taken is the one pushed there.
    pub fn position(&self) -> usize {
        self.ring.head.0.load(Ordering::Relaxed)
    }
}

/// The ready message at the head of the ring, still in its slot (see `Receiver::head`).
pub struct Head<'a> {
    rx: &'a mut Receiver,
    slot: &'static Slot,
    pos: usize,
}

impl Head<'_> {
    #[inline]
    pub fn msg(&self) -> &Msg {
        // SAFETY: `ready` found the message written and handed over; it stays in place, and
        // no one else reads or writes the slot, until this `Head` takes or drops it.
        unsafe { (*self.slot.msg.get()).assume_init_ref() }
    }

    /// Moves the message out.
    #[inline]
    pub fn take(self) -> Msg {
        // SAFETY: as in `msg`; the slot is released right after, without dropping (forget).
        let msg = unsafe { (*self.slot.msg.get()).assume_init_read() };
        self.rx.release(self.slot, self.pos);
        std::mem::forget(self);
        msg
    }
}

impl Drop for Head<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `msg`; the message is dropped once, then its slot released.
        unsafe { (*self.slot.msg.get()).assume_init_drop() };
        self.rx.release(self.slot, self.pos);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.ring.tail.0.fetch_or(CLOSED, Ordering::SeqCst);
        // What is left is dropped (a push that claimed its position before the mark may
        // still be writing: its message stays in the leaked ring).
        while self.try_recv().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oomtrace_proto::{Api, Event, EventKind};

    fn ring(cap: usize) -> (&'static Ring, Receiver) {
        let ring: &'static Ring = Box::leak(Box::new(Ring::new(cap)));
        (ring, Receiver::new(ring))
    }

    fn ev(n: u64) -> Msg {
        let mut e = Event::new(EventKind::Alloc, Api::cuMemAlloc_v2);
        e.ptr = n;
        Msg::Event(e)
    }

    fn ptr(m: Msg) -> u64 {
        match m {
            Msg::Event(e) => e.ptr,
            _ => panic!("not an event"),
        }
    }

    #[test]
    fn fills_to_capacity_then_refuses_and_takes_again_in_order_across_laps() {
        let (ring, rx) = ring(5);
        assert_eq!(ring.capacity(), 8);
        let mut next_in = 0;
        let mut next_out = 0;
        for _lap in 0..5 {
            while ring.push(ev(next_in)).is_ok() {
                next_in += 1;
            }
            assert_eq!(ring.len(), 8);
            assert!(matches!(ring.push(ev(99)), Err(PushError::Full(_))));
            // Take part of it, so the next lap starts mid-ring.
            for _ in 0..5 {
                assert_eq!(ptr(rx.try_recv().unwrap()), next_out);
                next_out += 1;
            }
        }
        for m in rx.try_iter() {
            assert_eq!(ptr(m), next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        // A push reports the tail after it, from which the pusher judges how full the queue
        // is (the head's position plus the length).
        assert_eq!(rx.position(), next_out as usize);
        assert!(matches!(ring.push(ev(7)), Ok(t) if t == next_out as usize + 1));
        assert!(matches!(ring.push(ev(8)), Ok(t) if t == rx.position() + ring.len()));
        assert_eq!(rx.try_iter().count(), 2);
        assert!(rx.is_empty());
        assert!(rx.try_recv().is_none());
    }

    #[test]
    fn a_head_left_in_place_is_taken_once_whether_moved_out_or_dropped() {
        let (ring, mut rx) = ring(4);
        let label: Box<str> = "step".into();
        for i in 0..3 {
            assert!(ring.push(ev(i)).is_ok());
        }
        assert!(ring
            .push(Msg::Marker {
                ev: Box::new(Event::new(EventKind::Marker, Api::oomtrace_mark)),
                label,
            })
            .is_ok());
        let head = rx.head().unwrap();
        assert!(matches!(head.msg(), Msg::Event(e) if e.ptr == 0));
        drop(head);
        assert_eq!(ptr(rx.head().unwrap().take()), 1);
        assert_eq!(ring.len(), 2);
        assert!(ring.push(ev(4)).is_ok());
        drop(rx.head());
        // A message with a heap part, dropped where it lies.
        let head = rx.head().unwrap();
        assert!(matches!(head.msg(), Msg::Marker { label, .. } if &**label == "step"));
        drop(head);
        assert_eq!(ptr(rx.try_recv().unwrap()), 4);
        assert!(rx.head().is_none());
    }

    #[test]
    fn a_closed_ring_refuses_every_push() {
        let (ring, rx) = ring(4);
        assert!(ring.push(ev(1)).is_ok());
        drop(rx);
        assert!(matches!(ring.push(ev(2)), Err(PushError::Closed(_))));
        assert_eq!(ring.len(), 0);
    }

    #[test]
    fn many_producers_lose_nothing_and_each_keeps_its_order() {
        let (ring, rx) = ring(64);
        const PER: u64 = 20_000;
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..PER {
                        let mut m = ev(t << 32 | i);
                        loop {
                            match ring.push(m) {
                                Ok(_) => break,
                                Err(PushError::Full(back)) => {
                                    m = back;
                                    std::thread::yield_now();
                                }
                                Err(PushError::Closed(_)) => panic!("closed"),
                            }
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 4];
        let mut got = 0;
        while got < 4 * PER {
            match rx.try_recv() {
                Some(m) => {
                    let p = ptr(m);
                    let (t, i) = ((p >> 32) as usize, p & 0xffff_ffff);
                    assert_eq!(i, next[t], "thread {t} out of order");
                    next[t] += 1;
                    got += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(rx.try_recv().is_none());
    }
}
