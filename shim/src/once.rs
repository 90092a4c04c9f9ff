//! The shim's one one-shot primitive: a flag that exactly one caller wins.
//!
//! `std::sync::Once` and `OnceLock` block the callers that lose the race until the winner is
//! done; a fork while another thread is inside one leaves the child stuck forever, and a hook
//! reached from inside the winner's own work would deadlock. `OneShot` never blocks: the
//! losers learn at once that someone else went first.

use std::sync::atomic::{AtomicBool, Ordering};

pub struct OneShot(AtomicBool);

impl OneShot {
    pub const fn new() -> OneShot {
        OneShot(AtomicBool::new(false))
    }

    /// True for the first caller only (until `reset`).
    #[inline]
    pub fn first(&self) -> bool {
        !self.0.swap(true, Ordering::AcqRel)
    }

    /// Whether someone already went.
    #[inline]
    pub fn taken(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Ready again (a fork child starting over).
    pub fn reset(&self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Default for OneShot {
    fn default() -> OneShot {
        OneShot::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_winner_until_reset() {
        let o = OneShot::new();
        assert!(!o.taken());
        assert!(o.first());
        assert!(!o.first());
        assert!(o.taken());
        o.reset();
        assert!(o.first());
    }

    #[test]
    fn one_winner_among_threads() {
        let o = OneShot::new();
        let wins: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| o.first() as usize)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1);
    }
}
