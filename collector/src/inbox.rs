//! A connection's bytes not yet decoded, and the one budget that bounds them over all
//! connections.
//!
//! A connection reads into its own buffer, which grows only as bytes arrive (never for the
//! length a frame claims) and gives back its memory once a big frame is decoded. Up to
//! [`FREE_BYTES`] a connection reads without asking anyone: the largest frame a shim writes is
//! about 1.13 MiB (a Python code object's line table, cut at 1 MiB, and its two names;
//! `Events` frames hold at most 8,192 events, 512 KiB), so a shim's partial frame plus one
//! read always fits, and a traced program is never slowed or cut by what follows. Bytes beyond
//! that belong to a frame of up to `wire::MAX_FRAME` (16 MiB) that only a client which is not
//! a shim sends; they come from one [`Budget`] shared by every connection. When it is spent,
//! such a connection waits before each read (its sender blocks on the full socket: nothing is
//! dropped) until another's big frame is decoded or its connection ends.
//!
//! So partial frames cost the collector at most [`FREE_BYTES`] per connection plus
//! [`LARGE_FRAMES_BUDGET`] in all, where a client holding a partial 16 MiB frame used to cost
//! 16 MiB per connection.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// What a connection may hold undecoded without asking: a shim's largest frame (about
/// 1.13 MiB) and room for a read after it.
pub const FREE_BYTES: usize = (1 << 20) + (256 << 10);

/// The most one read asks for (fewer, near [`FREE_BYTES`]).
pub const READ_BYTES: usize = 256 << 10;

/// The bytes beyond [`FREE_BYTES`] that all connections together may hold: two whole
/// 16 MiB frames at once.
pub const LARGE_FRAMES_BUDGET: usize = 32 << 20;

/// The bytes of frames over [`FREE_BYTES`], shared by every connection of a collector.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
    waited: AtomicBool,
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget {
            limit,
            used: AtomicUsize::new(0),
            waited: AtomicBool::new(false),
        }
    }

    /// Bytes held by the connections beyond their free part.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Takes up to `want` bytes; 0 when the budget is spent.
    fn take(&self, want: usize) -> usize {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let got = want.min(self.limit.saturating_sub(used));
            if got == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                used,
                used + got,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return got,
                Err(now) => used = now,
            }
        }
    }

    fn give(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// True the first time a connection had to wait (for its caller's one line).
    pub fn first_wait(&self) -> bool {
        !self.waited.swap(true, Ordering::AcqRel)
    }
}

/// One connection's undecoded bytes.
#[derive(Debug)]
pub struct Inbox {
    buf: Vec<u8>,
    /// Bytes at the start of `buf`'s allocation known to be initialized (written by a read or
    /// zeroed before one): a read needs its room initialized, and zeroing a whole read's room
    /// before every read cost as much as the read itself.
    initialized: usize,
    /// Bytes of `budget` this connection holds (what `buf` has beyond [`FREE_BYTES`], or a
    /// read's room taken before the read).
    borrowed: usize,
    budget: Arc<Budget>,
}

impl Inbox {
    pub fn new(budget: Arc<Budget>) -> Inbox {
        Inbox {
            buf: Vec::new(),
            initialized: 0,
            borrowed: 0,
            budget,
        }
    }

    /// The bytes read and not yet consumed.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Reads once from `from` into the buffer. `Ok(None)`: the budget is spent and this
    /// connection holds its free part already; nothing was read (try again later).
    /// `Ok(Some(0))` is the end of the stream.
    pub fn read_from(&mut self, from: &mut impl Read) -> std::io::Result<Option<usize>> {
        let len = self.buf.len();
        let room = if len < FREE_BYTES {
            READ_BYTES.min(FREE_BYTES - len)
        } else {
            let got = self.budget.take(READ_BYTES);
            if got == 0 {
                return Ok(None);
            }
            self.borrowed += got;
            got
        };
        let want = len + room;
        if self.buf.capacity() < want {
            // Within the free part capacity grows by doubling up to FREE_BYTES, never past it;
            // beyond, by exactly what the budget granted.
            let target = if want <= FREE_BYTES {
                want.next_power_of_two().min(FREE_BYTES)
            } else {
                want
            };
            self.buf.reserve_exact(target - len);
        }
        // A reallocation keeps the allocation's bytes up to the smaller capacity, as they were.
        self.initialized = self.initialized.min(self.buf.capacity()).max(len);
        if self.initialized < want {
            self.buf.resize(want, 0);
            self.initialized = want;
        } else {
            // SAFETY: `want` is within the capacity, and bytes [len, want) of this allocation
            // were initialized before: zeroed by an earlier `resize` or written by a read, then
            // only moved within it or left in place (`truncate` and `drain` keep the memory
            // beyond the length as it is; a reallocation keeps it up to the new capacity).
            unsafe { self.buf.set_len(want) };
        }
        let read = from.read(&mut self.buf[len..]);
        let n = *read.as_ref().unwrap_or(&0);
        self.buf.truncate(len + n);
        self.settle();
        read.map(Some)
    }

    /// Drops the first `n` bytes (decoded frames).
    pub fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
        if self.buf.capacity() > FREE_BYTES && self.buf.len() + READ_BYTES <= FREE_BYTES {
            // A big frame is done: give its memory back.
            self.buf.shrink_to(FREE_BYTES);
        }
        self.settle();
    }

    /// Returns what the buffer no longer needs of the budget.
    fn settle(&mut self) {
        let need = self.buf.len().saturating_sub(FREE_BYTES);
        if self.borrowed > need {
            self.budget.give(self.borrowed - need);
            self.borrowed = need;
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.budget.give(self.borrowed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of `n` bytes of `b`, delivered in reads of at most `per_read`.
    struct Source {
        left: usize,
        per_read: usize,
    }

    impl Read for Source {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.left).min(self.per_read);
            out[..n].fill(7);
            self.left -= n;
            Ok(n)
        }
    }

    #[test]
    fn a_small_frame_never_asks_the_budget() {
        let budget = Arc::new(Budget::new(0));
        let mut inbox = Inbox::new(budget.clone());
        let mut src = Source {
            left: 1_200_000,
            per_read: usize::MAX,
        };
        while inbox.bytes().len() < 1_200_000 {
            assert!(matches!(inbox.read_from(&mut src), Ok(Some(1..))));
        }
        assert!(inbox.buf.capacity() <= FREE_BYTES);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn big_frames_share_one_budget_and_give_it_back() {
        let budget = Arc::new(Budget::new(2 << 20));
        let mut a = Inbox::new(budget.clone());
        let mut b = Inbox::new(budget.clone());
        let mut sa = Source {
            left: 16 << 20,
            per_read: 4096,
        };
        let mut sb = Source {
            left: 16 << 20,
            per_read: usize::MAX,
        };
        // `a` fills its free part, then the whole budget.
        while let Ok(Some(n)) = a.read_from(&mut sa) {
            assert!(n > 0);
        }
        assert_eq!(a.bytes().len(), FREE_BYTES + (2 << 20));
        assert_eq!(budget.used(), 2 << 20);
        // `b` gets its free part only, and waits.
        while let Ok(Some(_)) = b.read_from(&mut sb) {}
        assert_eq!(b.bytes().len(), FREE_BYTES);
        assert!(matches!(b.read_from(&mut sb), Ok(None)));
        // `a`'s frame is decoded: its memory and budget come back, and `b` reads on.
        let all = a.bytes().len();
        a.consume(all);
        assert_eq!(budget.used(), 0);
        assert!(a.buf.capacity() <= FREE_BYTES);
        assert!(matches!(b.read_from(&mut sb), Ok(Some(1..))));
        drop(b);
        assert_eq!(budget.used(), 0);
        assert!(budget.first_wait());
        assert!(!budget.first_wait());
    }

    /// Bytes numbered by their place in the stream, in reads of varying sizes: what reaches
    /// the buffer is exactly the stream, in order, whatever room earlier reads left behind.
    struct Counting {
        next: u64,
        end: u64,
        sizes: std::iter::Cycle<std::vec::IntoIter<usize>>,
    }

    impl Read for Counting {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let want = self.sizes.next().unwrap_or(1);
            let n = out.len().min(want).min((self.end - self.next) as usize);
            for b in &mut out[..n] {
                *b = (self.next % 251) as u8;
                self.next += 1;
            }
            Ok(n)
        }
    }

    #[test]
    fn reads_into_room_left_by_earlier_reads_keep_the_stream_exact() {
        let budget = Arc::new(Budget::new(4 << 20));
        let mut inbox = Inbox::new(budget.clone());
        let end = 12u64 << 20;
        let mut src = Counting {
            next: 0,
            end,
            sizes: vec![3, READ_BYTES, 100_000, 1, 70_000, READ_BYTES - 5]
                .into_iter()
                .cycle(),
        };
        let mut seen = 0u64;
        let mut round = 0usize;
        while seen < end {
            // Let the buffer grow past its free part now and then (the shrink path), and
            // consume varying amounts otherwise.
            for _ in 0..(if round.is_multiple_of(5) { 12 } else { 2 }) {
                if !matches!(inbox.read_from(&mut src), Ok(Some(_))) {
                    break;
                }
            }
            let keep = if round.is_multiple_of(3) { 0 } else { 17 };
            let take = inbox.bytes().len().saturating_sub(keep);
            for (i, &b) in inbox.bytes()[..take].iter().enumerate() {
                assert_eq!(
                    b,
                    ((seen + i as u64) % 251) as u8,
                    "byte {} of the stream",
                    seen + i as u64
                );
            }
            seen += take as u64;
            inbox.consume(take);
            round += 1;
        }
        assert_eq!(seen, end);
        drop(inbox);
        assert_eq!(budget.used(), 0);
    }
}
