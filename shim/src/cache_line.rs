//! A value alone on its cache line (two, for the adjacent-line prefetcher): a word every
//! hook reads must not share a line with one another thread writes, or each write makes the
//! next hook wait for the line (measured: a quarter of the tracker's entry cost, when the
//! drain thread's lock word sat beside the hooks' mode).

use std::ops::Deref;

#[repr(align(128))]
pub struct CacheLine<T>(pub T);

impl<T> Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
