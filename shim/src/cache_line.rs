//! A value alone on its cache line (two, for the adjacent-line prefetcher): a word every
//! hook reads must not share a line with one another thread writes, or each write makes the
//! next hook wait for the line (measured: a quarter of the tracker's entry cost, when the
//! drain thread's lock word sat beside the hooks' mode).
//!
//! A `static` of this type is also `#[used]`. The release build optimizes the shim as one
//! program (fat LTO), and LLVM then splits a global that only this crate reads into its fields:
//! the padding went, and the hooks' mode shared its line with the statics declared after it,
//! against this type's whole purpose. A global named in `#[used]` is left whole.
//! `tests/it/instructions.rs` checks every such static's size in the release build.

use std::ops::Deref;

#[repr(align(128))]
pub struct CacheLine<T>(pub T);

impl<T> Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
