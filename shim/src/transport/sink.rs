//! Where the drain thread's stream goes once connected: the collector's socket in the
//! shim (`socket.rs`), an in-memory sink in the drain loop's tests. The drain loop
//! (`drain.rs`) is generic over it, so its rules (stall, losses, flush) are tested without a
//! collector, a socket or real time.

use std::path::Path;
use std::time::Instant;

pub(super) trait Sink: Sized {
    /// Connects to the collector listening at `path`.
    fn connect(path: &Path) -> std::io::Result<Self>;
    /// Sends the stream's first bytes (header and hello), waiting as long as that takes,
    /// with the counter page's descriptor attached if there is one (see
    /// `oomtrace_proto::counter_page`), then switches to bounded writes.
    fn start(&mut self, head: &[u8], page: Option<i32>) -> std::io::Result<()>;
    /// Sends what the reader takes of `buf` within a short bounded wait (none at all with
    /// `now_only`), telling `taken` of every write that took bytes. Ok(bytes taken); a full
    /// sink is not an error, a reader that has gone is.
    fn send(
        &mut self,
        buf: &[u8],
        now_only: bool,
        taken: &mut dyn FnMut(usize),
    ) -> std::io::Result<usize>;
    /// Whether the reader's process is known to be stopped (SIGSTOP, a debugger) at `now`.
    fn reader_stopped(&mut self, now: Instant) -> bool;
    /// Ends the stream and returns what the reader said before it closed its end.
    fn close(self) -> String;
}
