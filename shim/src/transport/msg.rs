//! What goes through the outbox's queue: an event, a definition the collector needs before the
//! events that name it, or a control message for the drain thread. A file of its own so that
//! the queue (`ring.rs`) and the outbox that owns it (`outbox.rs`) both name it without naming
//! each other.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use oomtrace_proto::wire::{GoodbyeReason, ModuleDef, TorchMemory};
use oomtrace_proto::Event;

/// What the queue carries. `repr(u8)`: the layout of each variant is defined (the tag, then its fields as in a
/// `repr(C)` struct), so an event can be written into a queue slot field by field
/// ([`Msg::write_event`]).
#[repr(u8)]
pub enum Msg {
    Event(Event) = EVENT_TAG,
    Stack {
        id: u32,
        frames: Box<[u64]>,
    },
    Module(Box<ModuleDef>),
    ModuleGone(u32),
    /// A Python code object, before the first stack that names it.
    Code(Box<oomtrace_proto::python::CodeDef>),
    /// The event boxed: unboxed it made every queue slot 16 bytes bigger than an event's
    /// needs (96 instead of 80: a fifth more cache lines written per event).
    Marker {
        ev: Box<Event>,
        label: Box<str>,
    },
    /// Launcher variables learnt after the Hello (`oomtrace_set_rank`).
    Launch(Box<[(String, String)]>),
    /// PyTorch's own statistics of one device (`oomtrace_torch_memory`); `ts_ns` in clock
    /// ticks, put on the events' clock by the drain thread.
    TorchMemory(TorchMemory),
    /// Write out everything queued before this, then signal.
    Flush(Arc<Done>),
    /// Write everything, say goodbye, close, signal; the drain thread then ends.
    Shutdown(GoodbyeReason, Arc<Done>),
}

/// `Msg::Event`'s tag.
const EVENT_TAG: u8 = 0;

/// `Msg::Event` as `repr(u8)` lays it out (RFC 2195: a `repr(C)` struct of the tag and the
/// variant's fields).
#[repr(C)]
struct EventVariant {
    tag: u8,
    ev: Event,
}

impl Msg {
    /// Writes `Msg::Event(*ev)` at `dst`: the tag, then the event. Building the enum and
    /// storing it whole made the compiler assemble it on the stack first and copy it again (an
    /// event is 64 bytes; about a dozen instructions of every event's push).
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Msg` and holds none (nothing is dropped).
    #[inline(always)]
    pub unsafe fn write_event(dst: *mut Msg, ev: &Event) {
        let v = dst.cast::<EventVariant>();
        // SAFETY: `Msg` is `repr(u8)`, so its `Event` variant is laid out as `EventVariant`
        // (the test below checks it); `dst` is valid for writes per the contract.
        unsafe {
            std::ptr::addr_of_mut!((*v).tag).write(EVENT_TAG);
            std::ptr::addr_of_mut!((*v).ev).write(*ev);
        }
    }
}

/// A one-shot signal with a bounded wait.
pub struct Done {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    pub fn new() -> Arc<Done> {
        Arc::new(Done {
            flag: Mutex::new(false),
            cv: Condvar::new(),
        })
    }
    pub(super) fn set(&self) {
        if let Ok(mut f) = self.flag.lock() {
            *f = true;
        }
        self.cv.notify_all();
    }
    /// True if signalled within `timeout`.
    pub fn wait(&self, timeout: Duration) -> bool {
        let Ok(guard) = self.flag.lock() else {
            return false;
        };
        match self.cv.wait_timeout_while(guard, timeout, |f| !*f) {
            Ok((g, _)) => *g,
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oomtrace_proto::{Api, EventKind};

    #[test]
    fn an_event_written_field_by_field_reads_back_as_the_variant() {
        let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
        e.ptr = 0x1234;
        e.size = 4096;
        e.tid = 7;
        e.device = 3;
        let mut slot = std::mem::MaybeUninit::<Msg>::uninit();
        // SAFETY: the slot is valid for writes and holds no message.
        unsafe { Msg::write_event(slot.as_mut_ptr(), &e) };
        // SAFETY: `write_event` wrote a whole `Msg::Event`.
        match unsafe { slot.assume_init() } {
            Msg::Event(got) => assert_eq!(got, e),
            _ => panic!("not read back as an event"),
        }
    }

    #[test]
    fn a_message_is_no_larger_than_an_event_and_its_tag() {
        // Every queue slot is a message's size (and its stamp): a variant that grows past an
        // event makes every event's slot bigger, and more of the ring's lines cold per event.
        assert_eq!(
            std::mem::size_of::<Msg>(),
            std::mem::size_of::<EventVariant>(),
            "a variant grew past Msg::Event: box its fields"
        );
    }
}
