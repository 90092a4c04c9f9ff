//! What goes through the outbox's queue: an event, a definition the collector needs before the
//! events that name it, or a control message for the drain thread. A file of its own so that
//! the queue (`ring.rs`) and the outbox that owns it (`outbox.rs`) both name it without naming
//! each other.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use oomtrace_proto::wire::{GoodbyeReason, ModuleDef, TorchMemory};
use oomtrace_proto::Event;

pub enum Msg {
    Event(Event),
    Stack {
        id: u32,
        frames: Box<[u64]>,
    },
    Module(Box<ModuleDef>),
    ModuleGone(u32),
    /// A Python code object, before the first stack that names it.
    Code(Box<oomtrace_proto::python::CodeDef>),
    Marker {
        ev: Event,
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
