//! From hooks to the collector: a bounded lock-free ring, one drain thread, framed records
//! over a Unix socket (or, failing that, straight into a trace file).
//!
//! Data flows one way: hooks, stacks and Python frames hold an [`Outbox`] (`outbox.rs`: the
//! queue and the counters; the queue itself is `ring.rs`); the drain thread (`drain.rs`) empties it into a `Sink` (the
//! collector's socket, `socket.rs`) or the shim's own trace file (`file.rs`); `spawn.rs`
//! starts a collector when none was configured. Nothing here knows the process lifecycle:
//! `lifecycle.rs` creates the outbox and starts the drain thread. `fd_guard.rs` keeps the
//! socket or file on a descriptor of the shim's own and interposes `close`, `close_range`,
//! `closefrom`, `dup2` and `dup3`, so that a program that closes it and opens its own file
//! never gets trace frames written into it, nor closed.
//!
//! - Lossless while the collector reads. A hook whose event finds the queue full (allocations,
//!   frees, stack and module definitions alike) wakes the drain thread and waits for room on a
//!   futex the drain thread bumps as it empties the queue. Every sign of progress (room made,
//!   bytes taken by the socket or the file) restarts the wait, so a collector that is slower
//!   than the program slows the program to its pace and loses nothing.
//! - Bounded when the collector stops reading. The drain thread calls the collector *stalled*
//!   when data has waited without the socket taking a byte for `STALL_WAIT` (250 ms) while
//!   the collector's process is stopped (SIGSTOP or a debugger: state `T`/`t` of the pid that
//!   listened, from SO_PEERCRED and /proc), or for `HUNG_WAIT` (10 s) whatever it is doing: a
//!   running collector can be busy for over a second without reading (first symbolization of
//!   a large library, a debug build), and that must not cost events. Each socket write waits
//!   at most 20 ms, so the drain thread notices while blocked. From then on hooks do not
//!   wait: an event that finds the queue full is counted lost, each with its kind and device
//!   (a lost free is a lost free, not a phantom leak). Once the socket takes bytes again the
//!   stall ends and hooks wait again. A stopped collector therefore holds the program back
//!   about `STALL_WAIT` per stop. A hook also stops waiting after `WAIT_BACKSTOP` (2 s) in
//!   which the drain thread neither ran its loop nor made progress (blocked elsewhere, e.g.
//!   on a slow disk).
//! - Hooks never wait where waiting could deadlock or is pointless: on the drain thread
//!   itself, in a fork (or vfork) child still holding the parent's state, once the thread's
//!   own thread-locals are being destroyed (thread exit), once the process is finishing
//!   (`shutdown`: atexit, `_exit`), or when the drain thread has ended or the collector is
//!   gone. There the event goes in if the queue has room and is counted lost if not.
//! - One queue for every thread and every kind of message, in the order hooks claimed their
//!   places: a free is recorded before its real call and an allocation after its own, so a
//!   free never reaches the collector before the allocation it frees, whichever threads made
//!   them; a stack or module definition goes in before the first event that names it.
//! - The fast path is one push into the ring (a compare-and-swap of its tail, the message
//!   written into its slot, one release store) and no wake-up: the drain thread is woken only
//!   when it sleeps and the ring is a quarter full (one relaxed load per event tells: the
//!   tail the push took against the `wake_at` position the drain thread left as it slept). The
//!   drain thread does not chase the producers message by message: once it has emptied the
//!   ring it sleeps `BATCH_WAIT` (1 ms; backing off to 5 ms when idle), then takes everything
//!   ready in one run, encoding each event where it lies in its slot into one buffer of
//!   frames, and sends that in one `send` (before: a round per handful of messages, each with
//!   its own small `send` and a collector wake-up; ~180 ns of drain-thread CPU per event on
//!   the 10^6-pair bench, now ~80). The ring (`OOMTRACE_BUFFER` messages, rounded up to a
//!   power of two; 65,536 by default, 13 ms at 5 M events/s) absorbs what comes meanwhile.
//!   With `OOMTRACE_LOG=1` the shim says at exit how often hooks found it full and how long
//!   they waited.
//! - What the socket does not take waits in the drain thread, up to 16 MiB (or twice the
//!   queue). At that cap the drain thread stops taking from the queue (so hooks wait) while
//!   the collector still reads; only when stalled does it take events and count them lost,
//!   while stack and module definitions still go out. When the collector reads again,
//!   everything waiting and the `Lost` counts (sent every 500 ms when they change) reach it.
//! - `flush` waits until everything queued before it has left the process; `shutdown` (exit)
//!   until the end of the stream has; both give up after their timeout passes with no
//!   progress (a collector still reading is waited for).
//! - If the collector goes away, the process keeps running at full speed; the drain thread
//!   discards and counts. So it does when the program closes or replaces the shim's socket
//!   (one line says so): it is never written to or closed again (`fd_guard.rs`); the trace
//!   file the shim writes itself is reopened instead (the same file: device and inode). At
//!   exit, if the end of the stream cannot get out (2 s without the socket taking a byte),
//!   the shim says so on stderr.
//! - Every event and marker a hook makes is counted (one relaxed add, before it is queued) in
//!   the counter page (`oomtrace_proto::counter_page`), whose descriptor goes to the
//!   collector with the stream's first bytes: the collector reads it when the stream ends,
//!   so what never reached it (a cut end of stream, a killed process) is counted lost there.
//!   The count also goes out in a `Made` frame just before the goodbye (for the shim's own
//!   trace file, and collectors that got no page).

mod delivery;
mod drain;
pub(crate) mod fd_guard;
mod file;
mod frame;
mod hello;
mod msg;
pub mod outbox;
mod ring;
mod sink;
mod socket;
mod spawn;

pub use drain::{spawn_drainer, DrainSetup};
pub use outbox::{Msg, Outbox};
pub use ring::Receiver;
pub use spawn::{inherited_socket, release_own_collector_dir, start_own_collector};

/// Used by the fork child: forget the parent's sink and its counter page's descriptor (if not
/// handed over yet), closing the child's copies only where they still are ours.
pub fn close_inherited_sink() {
    if let Some(page) = outbox::take_page_fd() {
        page.close();
    }
    fd_guard::close_inherited_sink();
}
